"""ParkedCall, the modern-client → legacy-upstream call machine, driven as transcripts: events in,
actions out, no sockets (proxy/protocol/parked_call.py; docs/translation.md §4.5)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from proxy.protocol import jsonrpc, meta
from proxy.protocol.modern_to_legacy import CacheHint
from proxy.protocol.outcome import Outcome, UpstreamFailure, timed_out
from proxy.protocol.parked_call import (
    STATE_INVALID,
    Abandon,
    AnswerServer,
    Claims,
    DeliverAnswers,
    Detach,
    DownstreamRequest,
    Fail,
    Park,
    ParkedCall,
    ParkedCallState,
    RelayToClient,
    Release,
    ReplyClient,
    StartCollecting,
    input_required_result,
    invalid_state,
)
from proxy.protocol.request_state import StateClaims, params_digest
from tests.support.schema import errors

SERVER_INFO = {"name": "legacy-server", "version": "1"}
CAPS = {"elicitation": {"form": {}}, "roots": {}}
PARAMS = {"name": "deploy", "arguments": {"env": "prod"}, "_meta": {"progressToken": "dl-1"}}
ELICIT = jsonrpc.request(
    11, "elicitation/create", {"message": "Sure?", "requestedSchema": {"type": "object", "properties": {}}}
)
ROOTS = jsonrpc.request(12, "roots/list")
SAMPLE = jsonrpc.request(13, "sampling/createMessage", {"messages": [], "maxTokens": 5})
TEXT = {"content": [{"type": "text", "text": "done"}]}


def new(method: str = "tools/call", params: dict[str, Any] = PARAMS, **overrides: Any) -> ParkedCall:
    options: dict[str, Any] = {
        "method": method,
        "params": params,
        "capabilities": CAPS,
        "downstream": DownstreamRequest("f1", "dl-1", "info"),
        "principal": "alice",
        "park_id": "park-1",
        "upstream": "up",
        "upstream_id": 5,
        "server_info": SERVER_INFO,
        "cache_hint": None,
        "collect_window_s": 0.1,
        "detach_timeout_s": 30.0,
        **overrides,
    }
    return ParkedCall.new(**options)


def claims_for(call: ParkedCall, **overrides: Any) -> StateClaims:
    state = call.state
    fields = {
        "park_id": state.park_id,
        "principal": state.principal,
        "method": state.method,
        "digest": params_digest(state.params),
        "round": state.round,
        "expires": 0.0,
        "boot": "0123456789abcdef",
        "address": None,
        **overrides,
    }
    return StateClaims(**fields)


def retry_request(input_responses: Any, params: dict[str, Any] = PARAMS, request_id: Any = "f2") -> dict[str, Any]:
    return jsonrpc.request(request_id, "tools/call", {**params, "inputResponses": input_responses, "requestState": "t"})


def retry(
    call: ParkedCall, responses: Any, downstream: DownstreamRequest | None = None, **claim_overrides: Any
) -> list[Any]:
    downstream = downstream or DownstreamRequest("f2", "dl-2", "debug")
    return call.retry(retry_request(responses), downstream, CAPS, claims_for(call, **claim_overrides), "alice")


def parked(call: ParkedCall, *requests: dict[str, Any]) -> Park:
    """Drive `call` through server `requests` and the collect window into its parked state."""
    for request in requests:
        call.upstream_message(request)
    actions = call.collect_window_elapsed()
    assert len(actions) == 1 and isinstance(actions[0], Park), actions
    return actions[0]


def roundtrip(call: ParkedCall) -> ParkedCall:
    data = json.loads(json.dumps(dataclasses.asdict(call.state)))
    return ParkedCall(ParkedCallState(**data))


# ---------------------------------------------------------------- replies


def test_a_result_releases_the_session_and_reaches_the_client_as_a_complete_modern_result():
    call = new()
    actions = call.upstream_message(jsonrpc.result_response(5, TEXT))
    assert actions == [
        Release(),
        ReplyClient(
            Outcome(
                jsonrpc.result_response(
                    "f1", {**TEXT, "resultType": "complete", "_meta": {meta.SERVER_INFO: SERVER_INFO}}
                )
            )
        ),
    ]
    assert call.phase == "done"
    assert call.upstream_message(jsonrpc.result_response(5, TEXT)) == []


def test_a_cacheable_result_carries_the_configured_hints():
    call = new("resources/read", {"uri": "file:///a"}, cache_hint=CacheHint(5000, "public"))
    outcome = call.upstream_message(jsonrpc.result_response(5, {"contents": []}))[1].outcome
    assert outcome.message["result"]["ttlMs"] == 5000 and outcome.message["result"]["cacheScope"] == "public"
    assert not errors("2026-07-28", "ReadResourceResult", outcome.message["result"])


@pytest.mark.parametrize(
    ("error", "code", "status"),
    [
        (jsonrpc.error_object(jsonrpc.RESOURCE_NOT_FOUND, "gone", {"uri": "x"}), jsonrpc.INVALID_PARAMS, 200),
        (jsonrpc.error_object(jsonrpc.METHOD_NOT_FOUND, "no"), jsonrpc.METHOD_NOT_FOUND, 404),
        (jsonrpc.error_object(-32050, "vendor"), jsonrpc.INTERNAL_ERROR, 200),
        (jsonrpc.error_object(-32005, "own range"), -32005, 200),
    ],
)
def test_a_legacy_error_reaches_the_client_as_2026_07_28_defines_it(error, code, status):
    call = new()
    outcome = call.upstream_message(jsonrpc.error_response(5, error["code"], error["message"], error.get("data")))[1]
    assert isinstance(outcome, ReplyClient)
    assert (outcome.outcome.message["error"]["code"], outcome.outcome.status) == (code, status)
    assert outcome.outcome.message["id"] == "f1"


def test_a_reply_under_another_id_is_not_this_calls():
    call = new()
    assert call.upstream_message(jsonrpc.result_response(99, TEXT)) == []
    assert call.phase == "running"


# ---------------------------------------------------------------- server requests answered at once


def test_a_server_ping_is_answered_at_once():
    assert new().upstream_message(jsonrpc.request(1, "ping")) == [AnswerServer(jsonrpc.result_response(1, {}))]


@pytest.mark.parametrize(
    ("method", "request_"),
    [("tools/call", jsonrpc.request(2, "tasks/get")), ("completion/complete", ELICIT)],
)
def test_requests_the_call_cannot_take_are_refused_upstream_with_method_not_found(method, request_):
    call = new(method, {"ref": {}} if method != "tools/call" else PARAMS)
    actions = call.upstream_message(request_)
    assert len(actions) == 1 and isinstance(actions[0], AnswerServer)
    assert actions[0].response["error"]["code"] == jsonrpc.METHOD_NOT_FOUND
    assert call.phase == "running"


def test_an_input_request_the_client_did_not_declare_fails_the_request_like_a_modern_server():
    call = new(capabilities={"roots": {}})
    call.upstream_message(ROOTS)  # asked, pending
    actions = call.upstream_message(SAMPLE)
    assert actions[0] == AnswerServer(
        jsonrpc.error_response(13, jsonrpc.METHOD_NOT_FOUND, "the client did not declare sampling")
    )
    # what else the server waits for will not be answered either
    assert actions[1] == AnswerServer(jsonrpc.error_response(12, jsonrpc.INTERNAL_ERROR, "the client did not answer"))
    reply = actions[2]
    assert isinstance(reply, ReplyClient) and reply.outcome.status == 400
    assert reply.outcome.message["error"]["code"] == jsonrpc.MISSING_REQUIRED_CAPABILITY
    assert reply.outcome.message["error"]["data"] == {"requiredCapabilities": {"sampling": {}}}
    assert actions[3] == Detach(30.0)
    assert call.phase == "detached"


def test_a_detached_call_runs_out_on_its_own_and_asks_nobody():
    call = new(capabilities={})
    call.upstream_message(ELICIT)
    assert call.phase == "detached"
    gone = call.upstream_message(ROOTS)
    assert gone == [AnswerServer(jsonrpc.error_response(12, jsonrpc.INTERNAL_ERROR, "the client has gone"))]
    assert call.upstream_message(jsonrpc.notification("notifications/progress", {"progressToken": "p5"})) == []
    assert call.upstream_message(jsonrpc.result_response(5, TEXT)) == [Release()]


def test_a_detached_call_that_does_not_end_in_time_is_abandoned():
    call = new(capabilities={})
    call.upstream_message(ELICIT)
    assert call.park_expired() == []
    assert call.detach_expired() == [Abandon("the client did not retry in time", ())]
    assert call.detach_expired() == []


# ---------------------------------------------------------------- parking


def test_input_requests_are_collected_for_a_moment_then_surfaced_with_a_bound_request_state():
    call = new()
    assert call.upstream_message(ELICIT) == [StartCollecting(0.1)]
    assert call.upstream_message(ROOTS) == []
    park = call.collect_window_elapsed()
    assert park == [
        Park(
            "f1",
            {
                "s11": {"method": "elicitation/create", "params": ELICIT["params"]},
                "s12": {"method": "roots/list"},
            },
            Claims("park-1", "alice", "tools/call", params_digest(PARAMS), 0),
        )
    ]
    assert call.phase == "parked" and call.downstream is None and not call.attached
    assert call.collect_window_elapsed() == []


def test_the_input_required_result_validates_and_names_the_server():
    call = new()
    park = parked(call, ELICIT)
    result = input_required_result(park.input_requests, "token", SERVER_INFO)
    assert result["requestState"] == "token" and result["_meta"] == {meta.SERVER_INFO: SERVER_INFO}
    assert not errors("2026-07-28", "InputRequiredResult", result)
    assert "_meta" not in input_required_result({}, "t", None)


def test_a_request_the_server_withdraws_is_no_longer_asked():
    call = new()
    call.upstream_message(ELICIT)
    assert call.upstream_message(jsonrpc.notification("notifications/cancelled", {"requestId": 11})) == []
    assert call.collect_window_elapsed() == []
    assert call.phase == "running"


def test_notifications_reach_the_attached_request_under_its_own_token_and_level():
    call = new()
    progress = jsonrpc.notification("notifications/progress", {"progressToken": "p5", "progress": 1})
    debug = jsonrpc.notification("notifications/message", {"level": "debug", "data": "d"})
    error = jsonrpc.notification("notifications/message", {"level": "error", "data": "e"})
    assert call.upstream_message(progress) == [
        RelayToClient(jsonrpc.notification("notifications/progress", {"progressToken": "dl-1", "progress": 1}))
    ]
    assert call.upstream_message(debug) == []
    assert call.upstream_message(error) == [RelayToClient(error)]
    assert call.upstream_message(jsonrpc.notification("notifications/tools/list_changed")) == []


# ---------------------------------------------------------------- retries


def test_a_valid_retry_delivers_the_answers_and_the_call_goes_on_for_the_new_request():
    call = new()
    parked(call, ELICIT)
    accept = {"action": "accept", "content": {}}
    actions = retry(call, {"s11": accept, "unknown": {"x": 1}})
    assert actions == [DeliverAnswers((jsonrpc.result_response(11, accept),))]
    assert call.phase == "running" and call.state.round == 1
    assert call.downstream == DownstreamRequest("f2", "dl-2", "debug")
    assert call.answers_delivered() == []
    final = call.upstream_message(jsonrpc.result_response(5, TEXT))[1]
    assert isinstance(final, ReplyClient) and final.outcome.message["id"] == "f2"


def test_what_the_retry_does_not_answer_is_asked_again_under_a_new_round():
    call = new()
    parked(call, ELICIT, ROOTS)
    assert retry(call, {"s12": {"roots": []}}) == [DeliverAnswers((jsonrpc.result_response(12, {"roots": []}),))]
    [park] = call.answers_delivered()
    assert isinstance(park, Park) and park.request_id == "f2"
    assert list(park.input_requests) == ["s11"] and park.claims.round == 1
    # the first token is spent
    assert retry(call, {"s11": {"action": "accept"}}, round=0) == [ReplyClient(invalid_state("f2"))]


@pytest.mark.parametrize(
    "bad",
    [
        {"park_id": "park-2"},
        {"principal": "mallory"},
        {"method": "prompts/get"},
        {"digest": "0" * 32},
        {"round": 1},
    ],
)
def test_a_retry_whose_claims_do_not_fit_is_refused_and_leaves_the_parked_call_intact(bad):
    call = new()
    parked(call, ELICIT)
    before = dataclasses.asdict(call.state)
    principal = bad.pop("principal", "alice")
    claims = claims_for(call, **bad)
    actions = call.retry(retry_request({"s11": {"action": "accept"}}), DownstreamRequest("f2"), CAPS, claims, principal)
    assert actions == [ReplyClient(invalid_state("f2"))]
    assert actions[0].outcome.status == 400 and actions[0].outcome.message["error"]["message"] == STATE_INVALID
    assert dataclasses.asdict(call.state) == before


def test_a_retry_with_other_params_or_no_valid_token_is_refused():
    call = new()
    parked(call, ELICIT)
    other = {**PARAMS, "arguments": {"env": "staging"}}
    request = retry_request({"s11": {"action": "accept"}}, params=other)
    assert call.retry(request, DownstreamRequest("f2"), CAPS, claims_for(call), "alice") == [
        ReplyClient(invalid_state("f2"))
    ]
    assert call.retry(request, DownstreamRequest("f2"), CAPS, None, "alice") == [ReplyClient(invalid_state("f2"))]


def test_a_retry_of_a_call_that_is_not_parked_is_refused():
    call = new()
    assert retry(call, {}) == [ReplyClient(invalid_state("f2"))]


def test_input_responses_that_are_not_an_object_are_refused():
    call = new()
    parked(call, ELICIT)
    [refusal] = retry(call, ["not", "an", "object"])
    assert isinstance(refusal, ReplyClient) and refusal.outcome.status == 400
    assert refusal.outcome.message["error"]["message"] == "inputResponses must be an object"
    assert call.phase == "parked"


def test_what_the_server_said_while_parked_reaches_the_retry_in_order_under_its_token():
    call = new()
    parked(call, ELICIT)
    progress = jsonrpc.notification("notifications/progress", {"progressToken": "p5", "progress": 2})
    debug = jsonrpc.notification("notifications/message", {"level": "debug", "data": "d"})
    assert call.upstream_message(progress) == [] and call.upstream_message(debug) == []
    assert len(retry(call, {"s11": {"action": "accept"}})) == 1
    assert call.answers_delivered() == [
        RelayToClient(jsonrpc.notification("notifications/progress", {"progressToken": "dl-2", "progress": 2})),
        RelayToClient(debug),  # the retry asked for debug
    ]


def test_a_result_that_came_while_parked_answers_the_retry():
    call = new()
    parked(call, ELICIT)
    assert call.upstream_message(jsonrpc.result_response(5, TEXT)) == []
    actions = retry(call, {"s11": {"action": "accept"}})  # nothing left to deliver: the server finished
    assert actions[0] == Release()
    assert isinstance(actions[1], ReplyClient) and actions[1].outcome.message["id"] == "f2"


def test_a_result_that_came_while_parked_still_answers_the_retry_once_its_stream_has_ended():
    """The reply ends its stream (stdio: the route; HTTP: the server closes the SSE stream), and the
    reader reports that end next: the end of a stream that carried the reply fails nothing."""
    call = new()
    parked(call, ELICIT)
    assert call.upstream_message(jsonrpc.result_response(5, TEXT)) == []
    assert call.upstream_ended() == []
    actions = retry(roundtrip(call), {"s11": {"action": "accept"}})
    assert actions[0] == Release()
    assert isinstance(actions[1], ReplyClient) and actions[1].outcome.message["result"]["content"] == TEXT["content"]


def test_a_missing_capability_while_parked_is_what_the_retry_hears_whatever_ends_the_call_after_it():
    """As when the call is running: the request fails with -32021 at once, and what the server does
    after it (its reply, its stream's end) only runs the call out."""
    call = new()
    parked(call, ELICIT)
    call.upstream_message(SAMPLE)
    assert call.upstream_message(jsonrpc.result_response(5, TEXT)) == []
    assert call.upstream_ended() == []
    actions = retry(call, {})
    assert isinstance(actions[0], ReplyClient)
    assert actions[0].outcome.message["error"]["code"] == jsonrpc.MISSING_REQUIRED_CAPABILITY


def test_a_failure_while_parked_answers_the_retry_even_after_a_restart_from_stored_state():
    call = new()
    parked(call, ELICIT)
    failure = UpstreamFailure("up", "unavailable", jsonrpc.UPSTREAM_UNAVAILABLE, "dropped the stream")
    assert call.upstream_failed(failure) == []
    restored = roundtrip(call)
    assert retry(restored, {}) == [Release(), Fail(failure)]


def test_a_missing_capability_while_parked_fails_the_retry_with_minus_32021():
    call = new()
    parked(call, ELICIT)
    assert call.upstream_message(SAMPLE) == [
        AnswerServer(jsonrpc.error_response(13, jsonrpc.METHOD_NOT_FOUND, "the client did not declare sampling"))
    ]
    assert retry(call, {"s11": {"action": "accept"}}) == [
        DeliverAnswers((jsonrpc.result_response(11, {"action": "accept"}),))
    ]
    actions = call.answers_delivered()
    assert isinstance(actions[0], ReplyClient)
    assert actions[0].outcome.message["error"]["code"] == jsonrpc.MISSING_REQUIRED_CAPABILITY
    assert actions[-1] == Detach(30.0)


def test_a_parked_call_keeps_only_the_latest_notifications():
    call = new()
    parked(call, ELICIT)
    for value in range(300):
        call.upstream_message(
            jsonrpc.notification("notifications/progress", {"progressToken": "p5", "progress": value})
        )
    assert len(call.state.buffered) == 256
    assert call.state.buffered[0]["params"]["progress"] == 44


# ---------------------------------------------------------------- endings


def test_a_parked_call_never_retried_is_abandoned_answering_what_the_server_waits_for():
    call = new()
    parked(call, ELICIT, ROOTS)
    assert call.park_expired() == [
        Abandon(
            "the client did not retry in time",
            (
                jsonrpc.result_response(11, {"action": "cancel"}),
                jsonrpc.error_response(12, jsonrpc.INTERNAL_ERROR, "the client did not answer"),
            ),
        )
    ]
    assert call.phase == "done" and call.park_expired() == []


def test_a_client_that_goes_away_cancels_the_running_call_but_not_a_parked_one():
    running = new()
    assert running.client_gone() == [Abandon("cancelled by the client", ())]
    waiting = new()
    parked(waiting, ELICIT)
    assert waiting.client_gone() == []
    assert waiting.phase == "parked"


def test_a_call_that_takes_too_long_is_abandoned_and_its_request_fails():
    call = new()
    failure = timed_out("up")
    assert call.timed_out(failure) == [Abandon("timed out", ()), Fail(failure)]
    assert call.timed_out(failure) == []


def test_a_call_that_cannot_be_parked_is_abandoned_and_its_request_told_why():
    call = new()
    call.upstream_message(ELICIT)
    actions = call.park_refused()
    assert actions[0] == Abandon("too many parked calls", (jsonrpc.result_response(11, {"action": "cancel"}),))
    assert isinstance(actions[1], ReplyClient)
    assert actions[1].outcome.message["error"]["code"] == jsonrpc.LIMIT_EXCEEDED
    assert new(capabilities={}).park_refused()[-1].outcome.message["id"] == "f1"


def test_answers_that_cannot_be_delivered_give_up_the_call():
    call = new()
    parked(call, ELICIT, ROOTS)
    retry(call, {"s11": {"action": "accept"}})
    failure = UpstreamFailure("up", "unavailable", jsonrpc.UPSTREAM_UNAVAILABLE, "is unreachable")
    actions = call.delivery_failed(failure)
    assert actions == [
        Abandon(
            "could not deliver the client's answers",
            (jsonrpc.error_response(12, jsonrpc.INTERNAL_ERROR, "the client did not answer"),),
        ),
        Fail(failure),
    ]
    assert call.delivery_failed(failure) == []


def test_a_failure_of_a_detached_call_only_releases_it_and_answers_nobody():
    call = new(capabilities={})
    call.upstream_message(ELICIT)
    failure = UpstreamFailure("up", "unavailable", jsonrpc.UPSTREAM_UNAVAILABLE, "x")
    assert call.delivery_failed(failure) == [Abandon("could not deliver the client's answers", ())]
    detached = new(capabilities={})
    detached.upstream_message(ELICIT)
    assert detached.upstream_failed(failure) == [Release()]
    assert detached.upstream_failed(failure) == []


def test_a_stream_that_ends_without_the_reply_fails_the_attached_request():
    call = new()
    actions = call.upstream_ended()
    assert actions == [
        Release(),
        Fail(
            UpstreamFailure("up", "invalid", jsonrpc.UPSTREAM_INVALID, "ended the response stream without a response")
        ),
    ]


def test_shutdown_gives_up_parked_and_detached_calls_only():
    parked_call = new()
    parked(parked_call, ELICIT)
    assert parked_call.shutdown() == [
        Abandon("the proxy is shutting down", (jsonrpc.result_response(11, {"action": "cancel"}),))
    ]
    assert new().shutdown() == []
    detached = new(capabilities={})
    detached.upstream_message(ELICIT)
    assert detached.shutdown() == [Abandon("the proxy is shutting down", ())]


def test_events_for_a_call_that_is_over_change_nothing():
    call = new()
    call.upstream_message(jsonrpc.result_response(5, TEXT))
    assert call.answers_delivered() == []
    assert call.park_refused() == [Abandon("too many parked calls", ())]  # no request to tell


@pytest.mark.parametrize(
    "reply",
    [
        {"jsonrpc": "2.0", "id": 5, "error": {}},
        {"jsonrpc": "2.0", "id": None, "error": {"code": "x", "message": "m"}},
        {"jsonrpc": "2.0", "id": 5},
        {"jsonrpc": "2.0", "id": 5, "result": {}, "error": {"code": 1, "message": "both"}},
    ],
)
def test_a_reply_that_is_not_json_rpc_fails_the_call_as_an_invalid_upstream_reply(reply: dict[str, Any]) -> None:
    call = new()
    actions = call.upstream_message(reply)
    assert actions == [
        Release(),
        Fail(UpstreamFailure("up", "invalid", jsonrpc.UPSTREAM_INVALID, "sent a reply that is not JSON-RPC")),
    ]
    parked = new()
    parked.upstream_message(ELICIT)
    parked.collect_window_elapsed()
    assert parked.phase == "parked"
    assert parked.upstream_message(reply) == []
    assert parked.state.stash is not None and parked.state.stash["failure"]["kind"] == "invalid"


@pytest.mark.parametrize(
    "reply", [jsonrpc.result_response(5, TEXT), jsonrpc.error_response(5, jsonrpc.INVALID_PARAMS, "no such tool")]
)
def test_a_reply_the_transport_found_valid_is_not_classified_again_and_ends_the_call_alike(
    reply: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = new().upstream_message(reply)

    def classified(message: object) -> str:
        raise AssertionError("classified a second time")

    monkeypatch.setattr(jsonrpc, "kind", classified)
    call = new()
    assert call.upstream_message(reply, valid=True) == expected
    assert call.phase == "done"
    with pytest.raises(AssertionError, match="a second time"):
        new().upstream_message(reply)  # unless the transport says so, the machine checks it
