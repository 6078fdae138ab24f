"""ForwardedCall, the legacy-client → modern-upstream call machine, driven as transcripts: events in,
actions out, no sockets (proxy/protocol/forwarded_call.py; docs/translation.md §3.4-§3.6)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from proxy.protocol import jsonrpc, meta
from proxy.protocol.forwarded_call import (
    Ask,
    AskClient,
    Fail,
    Finish,
    ForwardedCall,
    ForwardedCallState,
    InputRound,
    Log,
    LookupToolHeaders,
    RelayToClient,
    Renegotiated,
    SendUpstream,
    SuspectEra,
    WithdrawAsks,
)
from proxy.protocol.headers import METHOD_HEADER, NAME_HEADER, PARAM_HEADER_PREFIX, PROTOCOL_VERSION_HEADER, ParamHeader
from proxy.protocol.legacy_to_modern import ClientProfile
from proxy.protocol.outcome import UpstreamFailure, timed_out
from proxy.protocol.versions import LATEST_LEGACY, LATEST_MODERN
from tests.support.schema import errors

CAPS = {"roots": {}, "sampling": {}, "elicitation": {"form": {}, "url": {}}}
PROFILE = ClientProfile(LATEST_MODERN, CAPS, {"name": "legacy-client", "version": "1"}, "info")
TOOLS_CALL = jsonrpc.request(7, "tools/call", {"name": "weather", "arguments": {"city": "Oslo"}})
PROMPTS_GET = jsonrpc.request("p", "prompts/get", {"name": "greet"})
TEXT = [{"type": "text", "text": "sunny"}]
ELICIT = {"method": "elicitation/create", "params": {"message": "Which city?", "requestedSchema": {"type": "object"}}}
ROOTS = {"method": "roots/list"}
SAMPLE = {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 5}}


def new(request: dict[str, Any] = TOOLS_CALL, **overrides: Any) -> ForwardedCall:
    options: dict[str, Any] = {
        "tag": "c1",
        "upstream": "up",
        "can_stream": True,
        "max_rounds": 3,
        "trace": {},
        **overrides,
    }
    profile = options.pop("profile", PROFILE)
    legacy = options.pop("legacy_version", LATEST_LEGACY)
    return ForwardedCall.new(request, profile, legacy, **options)


def reply(upstream_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return jsonrpc.result_response(upstream_id, result)


def error(upstream_id: Any, code: int, message: str = "no", data: Any = None) -> dict[str, Any]:
    return jsonrpc.error_response(upstream_id, code, message, data)


def complete(**fields: Any) -> dict[str, Any]:
    return {"resultType": "complete", **fields}


def input_required(requests: dict[str, Any] | None = None, state: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"resultType": "input_required"}
    if requests is not None:
        result["inputRequests"] = requests
    if state is not None:
        result["requestState"] = state
    return result


def sent(actions: list[Any]) -> SendUpstream:
    """The one SendUpstream among `actions`."""
    sends = [a for a in actions if isinstance(a, SendUpstream)]
    assert len(sends) == 1, actions
    return sends[0]


def started(call: ForwardedCall, headers: tuple[ParamHeader, ...] = ()) -> SendUpstream:
    actions = call.start()
    if actions and isinstance(actions[0], LookupToolHeaders):
        actions = call.tool_headers(headers)
    return sent(actions)


def roundtrip(call: ForwardedCall) -> ForwardedCall:
    """The call as another process would rebuild it from its stored state."""
    data = json.loads(json.dumps(dataclasses.asdict(call.state)))
    return ForwardedCall(ForwardedCallState(**data))


# ---------------------------------------------------------------- the request half


def test_a_request_without_a_tool_goes_upstream_at_once_as_a_complete_modern_request():
    call = new(PROMPTS_GET)
    send = sent(call.start())
    assert send.message == {
        "jsonrpc": "2.0",
        "id": "c1.1",
        "method": "prompts/get",
        "params": {
            "name": "greet",
            "_meta": {
                meta.PROTOCOL_VERSION: LATEST_MODERN,
                meta.CLIENT_CAPABILITIES: CAPS,
                meta.CLIENT_INFO: PROFILE.client_info,
                meta.LOG_LEVEL: "info",
            },
        },
    }
    assert send.headers == {PROTOCOL_VERSION_HEADER: LATEST_MODERN, METHOD_HEADER: "prompts/get", NAME_HEADER: "greet"}
    assert send.delay_s == 0.0
    assert not errors(LATEST_MODERN, "JSONRPCRequest", send.message)
    assert call.awaiting_upstream and call.upstream_id == "c1.1"


def test_a_tool_call_first_learns_the_tools_header_annotations_and_mirrors_them():
    call = new()
    assert call.start() == [LookupToolHeaders("weather", refresh=False)]
    send = sent(call.tool_headers((ParamHeader("City", ("city",), "string"),)))
    assert send.headers[PARAM_HEADER_PREFIX + "City"] == "Oslo"
    assert send.headers[NAME_HEADER] == "weather"


def test_a_tool_call_whose_name_is_not_a_string_is_sent_without_a_lookup():
    call = new(jsonrpc.request(1, "tools/call", {"name": {"not": "a name"}}))
    assert isinstance(call.start()[0], SendUpstream)


def test_the_requests_trace_context_travels_in_headers_and_in_meta():
    call = new(PROMPTS_GET, trace={"traceparent": "00-abc-def-01"})
    send = sent(call.start())
    assert send.headers["traceparent"] == "00-abc-def-01"
    assert send.message["params"]["_meta"]["traceparent"] == "00-abc-def-01"


def test_tool_headers_reported_in_another_phase_change_nothing():
    call = new(PROMPTS_GET)
    started(call)
    assert call.tool_headers(()) == []


# ---------------------------------------------------------------- the reply stream


def test_a_complete_result_finishes_the_call_cacheable_and_late_messages_are_ignored():
    call = new()
    started(call)
    assert call.upstream_message(reply("c1.1", complete(content=TEXT))) == [
        Finish(result=complete(content=TEXT), cacheable=True)
    ]
    assert call.done and not call.awaiting_upstream
    assert call.upstream_message(reply("c1.1", complete())) == []
    assert call.upstream_ended() == [] and call.upstream_failed(timed_out("up")) == []


def test_a_reply_under_another_id_is_not_ours():
    call = new()
    started(call)
    assert call.upstream_message(reply("c9.9", complete())) == []
    assert call.awaiting_upstream


def test_notifications_reach_the_client_translated_and_server_requests_are_dropped():
    call = new()
    started(call)
    log_note = jsonrpc.notification("notifications/message", {"level": "error", "data": "x"})
    debug_note = jsonrpc.notification("notifications/message", {"level": "debug", "data": "x"})
    assert call.upstream_message(log_note) == [RelayToClient(log_note)]
    assert call.upstream_message(debug_note) == []  # below the session's level (info)
    assert call.upstream_message(jsonrpc.request(3, "roots/list")) == [
        Log("warning", "upstream_request_dropped", {"method": "roots/list"})
    ]


def test_nothing_is_relayed_to_a_client_that_cannot_stream():
    call = new(can_stream=False)
    started(call)
    note = jsonrpc.notification("notifications/progress", {"progressToken": "t", "progress": 1})
    assert call.upstream_message(note) == []


def test_progress_for_a_2024_11_05_client_loses_its_message():
    call = new(legacy_version="2024-11-05")
    started(call)
    note = jsonrpc.notification("notifications/progress", {"progressToken": "t", "progress": 1, "message": "m"})
    assert call.upstream_message(note) == [
        RelayToClient(jsonrpc.notification("notifications/progress", {"progressToken": "t", "progress": 1}))
    ]


def progress(value: Any) -> dict[str, Any]:
    return jsonrpc.notification("notifications/progress", {"progressToken": "t", "progress": value})


def test_progress_only_increases_for_the_client_across_rounds():
    call = new()
    started(call)
    assert call.upstream_message(progress(1)) == [RelayToClient(progress(1))]
    assert call.upstream_message(progress(5)) == [RelayToClient(progress(5))]
    assert call.upstream_message(progress(5)) == []
    call.upstream_message(reply("c1.1", input_required({"a": ROOTS}, "s1")))
    call.client_answered("a", jsonrpc.result_response(1, {"roots": []}))
    # the retry is a fresh upstream execution that restarts its counter
    assert call.upstream_message(progress(2)) == []
    assert call.upstream_message(progress(6)) == [RelayToClient(progress(6))]
    assert call.upstream_message(progress("not a number")) == [RelayToClient(progress("not a number"))]


# ---------------------------------------------------------------- input rounds


def test_an_input_round_asks_the_client_and_the_answers_resume_upstream_with_the_state():
    call = new()
    started(call)
    actions = call.upstream_message(reply("c1.1", input_required({"city": ELICIT, "r": ROOTS}, "state-1")))
    assert actions == [
        InputRound(),
        AskClient((Ask("city", "elicitation/create", ELICIT["params"]), Ask("r", "roots/list", {}))),
    ]
    assert call.pending_keys() == ("city", "r")
    assert call.client_answered("r", jsonrpc.result_response(2, {"roots": []})) == []
    assert call.client_answered("r", jsonrpc.result_response(2, {"roots": []})) == []  # answered already
    assert call.client_answered("nope", jsonrpc.result_response(3, {})) == []
    accept = {"action": "accept", "content": {"city": "Oslo"}}
    send = sent(call.client_answered("city", jsonrpc.result_response(1, accept)))
    params = send.message["params"]
    assert send.message["id"] == "c1.2"
    assert params["inputResponses"] == {"city": accept, "r": {"roots": []}}
    assert list(params["inputResponses"]) == ["city", "r"]  # in the order asked
    assert params["requestState"] == "state-1"
    assert call.upstream_message(reply("c1.2", complete(content=TEXT))) == [
        Finish(result=complete(content=TEXT), cacheable=False)  # it took the client's own answers
    ]


def test_a_url_elicitation_gets_an_elicitation_id_for_the_legacy_client():
    url = {"method": "elicitation/create", "params": {"mode": "url", "message": "Log in", "url": "https://x/a"}}
    call = new()
    started(call)
    ask = call.upstream_message(reply("c1.1", input_required({"login": url})))[1]
    assert isinstance(ask, AskClient)
    assert ask.asks[0].params == {**url["params"], "elicitationId": "c1-login-1"}


def test_input_the_client_never_declared_is_an_upstream_bug_and_ends_the_call():
    call = new(profile=ClientProfile(LATEST_MODERN, {"roots": {}}, None))
    started(call)
    actions = call.upstream_message(reply("c1.1", input_required({"s": SAMPLE})))
    assert actions[0] == InputRound()
    assert actions[1] == Log("error", "upstream_input_request_rejected", {"reason": "client did not declare sampling"})
    assert isinstance(actions[2], Finish) and actions[2].error is not None
    assert actions[2].error["code"] == jsonrpc.INTERNAL_ERROR and call.done


def test_input_for_a_client_that_cannot_stream_ends_the_call():
    call = new(can_stream=False)
    started(call)
    actions = call.upstream_message(reply("c1.1", input_required({"r": ROOTS})))
    assert actions == [
        InputRound(),
        Finish(
            error=jsonrpc.error_object(
                jsonrpc.INTERNAL_ERROR, "the upstream needs input but the client does not accept SSE"
            )
        ),
    ]


def test_load_shedding_retries_with_the_state_only_after_a_growing_pause():
    call = new()
    started(call)
    first = call.upstream_message(reply("c1.1", input_required(state="busy-1")))
    assert first[0] == InputRound()
    retry = sent(first)
    assert retry.delay_s == pytest.approx(0.05)
    assert retry.message["params"]["requestState"] == "busy-1" and "inputResponses" not in retry.message["params"]
    assert sent(call.upstream_message(reply("c1.2", input_required(state="busy-2")))).delay_s == pytest.approx(0.1)


def test_rounds_beyond_the_limit_end_the_call():
    call = new(max_rounds=1)
    started(call)
    call.upstream_message(reply("c1.1", input_required(state="s")))
    actions = call.upstream_message(reply("c1.2", input_required(state="s")))
    assert actions == [
        InputRound(),
        Finish(error=jsonrpc.error_object(jsonrpc.INTERNAL_ERROR, "gave up after 1 rounds of input requests")),
    ]


def test_a_failed_elicitation_reads_as_the_user_cancelling():
    call = new()
    started(call)
    call.upstream_message(reply("c1.1", input_required({"city": ELICIT}, "s")))
    send = sent(call.client_answered("city", jsonrpc.error_response(1, jsonrpc.INTERNAL_ERROR, "no UI")))
    assert send.message["params"]["inputResponses"] == {"city": {"action": "cancel"}}


def test_a_failed_sampling_request_ends_the_call_with_the_clients_error_and_withdraws_the_rest():
    call = new()
    started(call)
    call.upstream_message(reply("c1.1", input_required({"s": SAMPLE, "r": ROOTS})))
    actions = call.client_answered("s", jsonrpc.error_response(1, -32001, "denied", {"why": "user"}))
    assert actions == [
        WithdrawAsks(("r",), "the request failed"),
        Finish(error=jsonrpc.error_object(-32001, "client failed sampling/createMessage: denied", {"why": "user"})),
    ]


def test_a_round_that_times_out_withdraws_what_is_unanswered_and_ends_the_call():
    call = new()
    started(call)
    call.upstream_message(reply("c1.1", input_required({"a": ROOTS, "b": ELICIT})))
    call.client_answered("a", jsonrpc.result_response(1, {"roots": []}))
    assert call.round_timed_out() == [
        WithdrawAsks(("b",), "the client did not answer in time"),
        Finish(
            error=jsonrpc.error_object(jsonrpc.INTERNAL_ERROR, "the client did not answer the input requests in time")
        ),
    ]
    assert call.round_timed_out() == []


def test_cancelling_withdraws_the_open_asks_and_a_call_with_none_just_ends():
    asking = new()
    started(asking)
    asking.upstream_message(reply("c1.1", input_required({"a": ROOTS})))
    assert asking.cancelled() == [WithdrawAsks(("a",), "request cancelled")]
    assert asking.done
    running = new()
    started(running)
    assert running.cancelled() == [] and running.done


def test_a_call_waiting_for_answers_resumes_the_same_from_its_stored_state():
    call = new()
    started(call)
    call.upstream_message(reply("c1.1", input_required({"a": ROOTS, "b": ROOTS}, "s")))
    call.client_answered("a", jsonrpc.result_response(1, {"roots": [{"uri": "file:///a"}]}))
    restored = roundtrip(call)
    assert restored.state == call.state
    expected = call.client_answered("b", jsonrpc.result_response(2, {"roots": []}))
    assert restored.client_answered("b", jsonrpc.result_response(2, {"roots": []})) == expected


# ---------------------------------------------------------------- the error ladder


def test_an_unsupported_version_renegotiates_once_and_retries_under_the_new_version():
    call = new(profile=dataclasses.replace(PROFILE, modern_version="2026-01-01"))
    started(call)
    data = {"supported": [LATEST_MODERN], "requested": "2026-01-01"}
    actions = call.upstream_message(error("c1.1", jsonrpc.UNSUPPORTED_PROTOCOL_VERSION, "unsupported", data))
    assert actions[0] == Renegotiated(LATEST_MODERN)
    retry = sent(actions)
    assert retry.headers[PROTOCOL_VERSION_HEADER] == LATEST_MODERN
    assert retry.message["params"]["_meta"][meta.PROTOCOL_VERSION] == LATEST_MODERN
    again = call.upstream_message(error("c1.2", jsonrpc.UNSUPPORTED_PROTOCOL_VERSION, "still", data))
    assert isinstance(again[0], Log) and again[0].event == "upstream_rejected_translation"
    assert again[1] == Finish(
        error=jsonrpc.error_object(jsonrpc.INTERNAL_ERROR, "upstream rejected the translated request: still")
    )


def test_an_unsupported_version_with_no_version_we_speak_ends_the_call():
    call = new()
    started(call)
    actions = call.upstream_message(
        error("c1.1", jsonrpc.UNSUPPORTED_PROTOCOL_VERSION, "no", {"supported": ["2030-01-01"]})
    )
    assert actions == [
        Finish(
            error=jsonrpc.error_object(
                jsonrpc.INTERNAL_ERROR, "upstream supports none of our protocol versions: ['2030-01-01']"
            )
        )
    ]


def test_a_header_mismatch_on_a_tool_call_relearns_the_headers_and_retries_once():
    call = new()
    started(call)
    assert call.upstream_message(error("c1.1", jsonrpc.HEADER_MISMATCH, "Mcp-Param-City")) == [
        LookupToolHeaders("weather", refresh=True)
    ]
    retry = sent(call.tool_headers(()))
    assert retry.message["id"] == "c1.2" and PARAM_HEADER_PREFIX + "City" not in retry.headers
    actions = call.upstream_message(error("c1.2", jsonrpc.HEADER_MISMATCH, "again"))
    assert actions[-1] == Finish(
        error=jsonrpc.error_object(jsonrpc.INTERNAL_ERROR, "upstream rejected the translated request: again")
    )


def test_a_header_mismatch_on_another_method_is_not_retried():
    call = new(PROMPTS_GET)
    started(call)
    actions = call.upstream_message(error("c1.1", jsonrpc.HEADER_MISMATCH, "Mcp-Name"))
    assert actions[-1] == Finish(
        error=jsonrpc.error_object(jsonrpc.INTERNAL_ERROR, "upstream rejected the translated request: Mcp-Name")
    )


def test_other_upstream_errors_reach_the_client_with_every_field_and_the_legacy_code():
    read = jsonrpc.request(3, "resources/read", {"uri": "file:///gone"})
    call = new(read)
    started(call)
    actions = call.upstream_message(
        error("c1.1", jsonrpc.INVALID_PARAMS, "Resource not found", {"uri": "file:///gone"})
    )
    assert actions == [
        Finish(error=jsonrpc.error_object(jsonrpc.RESOURCE_NOT_FOUND, "Resource not found", {"uri": "file:///gone"}))
    ]


def test_an_error_without_an_id_that_no_modern_server_sends_makes_the_era_suspect():
    call = new(PROMPTS_GET)
    started(call)
    no_id = jsonrpc.error_response(None, jsonrpc.INVALID_REQUEST, "Bad Request: No valid session ID provided")
    actions = call.upstream_message(no_id)
    assert actions[0] == SuspectEra(f"error {jsonrpc.INVALID_REQUEST} without an id")
    assert isinstance(actions[1], Finish) and actions[1].error == no_id["error"]


def test_an_id_less_modern_error_is_no_reason_for_suspicion():
    call = new(PROMPTS_GET)
    started(call)
    no_id = jsonrpc.error_response(None, jsonrpc.HEADER_MISMATCH, "mismatch")
    assert not any(isinstance(a, SuspectEra) for a in call.upstream_message(no_id))


@pytest.mark.parametrize(
    ("method", "result", "reason"),
    [
        ("tools/call", "not an object", "result is not an object"),
        ("tools/call", {"resultType": "task"}, "unsupported resultType 'task'"),
        ("tools/list", input_required({"r": ROOTS}), "input_required is not allowed on tools/list"),
    ],
)
def test_an_invalid_result_ends_the_call_with_the_reason(method, result, reason):
    call = new(jsonrpc.request(1, method, {"name": "x"} if method == "tools/call" else {}))
    started(call)
    actions = call.upstream_message(reply("c1.1", result))
    assert actions == [
        Log("error", "upstream_invalid_result", {"method": method, "reason": reason}),
        Finish(error=jsonrpc.error_object(jsonrpc.INTERNAL_ERROR, f"upstream 'up' sent an invalid result: {reason}")),
    ]


# ---------------------------------------------------------------- upstream failures


def test_a_stream_that_ends_without_a_reply_is_an_invalid_upstream_answer():
    call = new(PROMPTS_GET)
    started(call)
    actions = call.upstream_ended()
    failure = UpstreamFailure("up", "invalid", jsonrpc.UPSTREAM_INVALID, "ended the response stream without a response")
    assert actions == [
        Log("warning", "upstream_failed", {"method": "prompts/get", "error": failure.detail}),
        Fail(failure),
    ]
    assert call.done


@pytest.mark.parametrize("status", [400, 404, 405])
def test_an_http_refusal_without_a_modern_body_makes_the_era_suspect(status):
    call = new(PROMPTS_GET)
    started(call)
    failure = UpstreamFailure("up", "http", jsonrpc.UPSTREAM_UNAVAILABLE, f"answered HTTP {status}", status)
    actions = call.upstream_failed(failure)
    assert actions[0] == SuspectEra(f"HTTP {status} without a modern error body")
    assert actions[-1] == Fail(failure)


@pytest.mark.parametrize(
    "failure",
    [
        timed_out("up"),
        UpstreamFailure("up", "http", jsonrpc.UPSTREAM_UNAVAILABLE, "answered HTTP 401", 401, "Bearer"),
        UpstreamFailure("up", "unavailable", jsonrpc.UPSTREAM_UNAVAILABLE, "is unreachable"),
    ],
)
def test_other_failures_are_relayed_without_suspicion(failure):
    call = new(PROMPTS_GET)
    started(call)
    actions = call.upstream_failed(failure)
    assert actions == [
        Log("warning", "upstream_failed", {"method": "prompts/get", "error": failure.detail}),
        Fail(failure),
    ]


def test_a_header_mismatch_on_a_tool_call_without_a_readable_name_is_retried_without_a_lookup():
    call = new(jsonrpc.request(1, "tools/call", {"name": 5}))
    started(call)
    retry = sent(call.upstream_message(error("c1.1", jsonrpc.HEADER_MISMATCH, "Mcp-Name")))
    assert retry.message["id"] == "c1.2"


def test_trace_context_the_client_put_in_meta_also_goes_in_the_headers():
    traced = jsonrpc.request("t", "prompts/get", {"name": "greet", "_meta": {"traceparent": "00-aa-bb-01"}})
    send = sent(new(traced).start())
    assert send.headers["traceparent"] == "00-aa-bb-01"
    assert send.message["params"]["_meta"]["traceparent"] == "00-aa-bb-01"
