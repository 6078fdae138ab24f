"""Modern client → legacy upstream, both halves, as pure functions (docs/translation.md §4;
proxy/protocol/modern_to_legacy.py)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.protocol import jsonrpc, meta
from proxy.protocol import modern_to_legacy as m2l
from proxy.protocol.capabilities import legacy_client_capabilities, modern_server_capabilities
from proxy.protocol.methods import CACHEABLE_METHODS, INPUT_REQUIRED_METHODS, LIST_CHANGED
from proxy.protocol.modern_to_legacy import (
    Answer,
    CacheHint,
    InitializeRejected,
    Missing,
    Park,
    abandoned_answer,
    acknowledgement,
    check_initialize_result,
    discover_result,
    error_to_downstream,
    honored_filter,
    initialize_request,
    listen_closed,
    listen_notification,
    notification_to_downstream,
    progress_token_of,
    result_to_downstream,
    server_request,
    to_upstream,
)
from proxy.protocol.versions import LATEST_LEGACY, LATEST_MODERN, LEGACY_VERSIONS, MODERN_VERSIONS
from tests.support.schema import errors, server_message_errors

SERVER_INFO = {"name": "legacy-server", "version": "1.2", "title": "Legacy"}
CLIENT_INFO = {"name": "modern-client", "version": "3.0"}
HINT = CacheHint(60000, "public")
MODERN_CAPS = {
    "roots": {},
    "sampling": {"context": {}, "tools": {}},
    "elicitation": {"form": {}, "url": {}},
    "extensions": {"io.modelcontextprotocol/tasks": {}},
    "experimental": {"vendor.client": {"on": True}},
}
INITIALIZE_RESULT = {
    "protocolVersion": LATEST_LEGACY,
    "capabilities": {
        "tools": {"listChanged": True},
        "prompts": {},
        "resources": {"subscribe": True, "listChanged": True},
        "completions": {},
        "logging": {},
        "experimental": {"vendor.server": {"level": 2}},
        "tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}},
    },
    "serverInfo": SERVER_INFO,
    "instructions": "Call the weather tool.",
}


def test_the_initialize_fixture_is_a_valid_2025_11_25_initialize_result():
    assert errors(LATEST_LEGACY, "InitializeResult", INITIALIZE_RESULT) == []


# ---------------------------------------------------------------- session opening


def test_initialize_proposes_2025_11_25_with_table_c_capabilities_and_validates():
    message = initialize_request(0, MODERN_CAPS, CLIENT_INFO)
    assert message == {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": LATEST_LEGACY,
            "capabilities": legacy_client_capabilities(MODERN_CAPS),
            "clientInfo": CLIENT_INFO,
        },
    }
    assert errors(LATEST_LEGACY, "InitializeRequest", message) == []


def test_initialize_declares_no_extensions_and_no_client_tasks():
    capabilities = initialize_request("i", {**MODERN_CAPS, "tasks": {}}, CLIENT_INFO)["params"]["capabilities"]
    assert "extensions" not in capabilities
    assert "tasks" not in capabilities


def test_initialize_leaves_the_request_capabilities_alone():
    caps = copy.deepcopy(MODERN_CAPS)
    initialize_request(1, caps, CLIENT_INFO)
    assert caps == MODERN_CAPS


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_any_legacy_initialize_answer_is_accepted_as_it_came(version):
    result = {**INITIALIZE_RESULT, "protocolVersion": version, "x-vendor": 1}
    assert check_initialize_result(result) is result


@pytest.mark.parametrize(
    ("result", "version"),
    [
        ({**INITIALIZE_RESULT, "protocolVersion": LATEST_MODERN}, LATEST_MODERN),
        ({**INITIALIZE_RESULT, "protocolVersion": "2099-01-01"}, "2099-01-01"),
        ({**INITIALIZE_RESULT, "protocolVersion": 20251125}, 20251125),
        ({k: v for k, v in INITIALIZE_RESULT.items() if k != "protocolVersion"}, None),
        (None, None),
        ([INITIALIZE_RESULT], None),
        ("2025-11-25", None),
    ],
)
def test_an_initialize_answer_without_a_legacy_version_is_rejected_naming_it(result, version):
    with pytest.raises(InitializeRejected) as info:
        check_initialize_result(result)
    assert repr(version) in str(info.value)
    assert isinstance(info.value, ValueError)


# ---------------------------------------------------------------- server/discover (§4.2)


def test_discover_from_an_initialize_result_is_a_valid_2026_07_28_discover_result():
    result = discover_result(INITIALIZE_RESULT, HINT)
    assert errors(LATEST_MODERN, "DiscoverResult", result) == []
    assert server_message_errors(LATEST_MODERN, jsonrpc.result_response(1, result), "server/discover") == []


def test_discover_offers_only_modern_versions_and_carries_server_info_instructions_and_hint():
    result = discover_result(INITIALIZE_RESULT, HINT)
    assert result == {
        "resultType": "complete",
        "supportedVersions": list(MODERN_VERSIONS),
        "capabilities": modern_server_capabilities(INITIALIZE_RESULT["capabilities"]),
        "instructions": INITIALIZE_RESULT["instructions"],
        "_meta": {meta.SERVER_INFO: SERVER_INFO},
        "ttlMs": HINT.ttl_ms,
        "cacheScope": HINT.scope,
    }


def test_discover_drops_legacy_tasks_and_keeps_the_other_capabilities():
    capabilities = discover_result(INITIALIZE_RESULT, HINT)["capabilities"]
    assert "tasks" not in capabilities
    assert set(capabilities) == {"tools", "prompts", "resources", "completions", "logging", "experimental"}


@pytest.mark.parametrize(("ttl_ms", "scope"), [(0, "private"), (5000, "public")])
def test_discover_carries_the_configured_cache_hint(ttl_ms, scope):
    result = discover_result(INITIALIZE_RESULT, CacheHint(ttl_ms, scope))
    assert (result["ttlMs"], result["cacheScope"]) == (ttl_ms, scope)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"instructions": None, "serverInfo": None},
        {"instructions": 7, "serverInfo": "legacy-server"},
        {"instructions": ["a"], "serverInfo": ["legacy-server"]},
    ],
)
def test_discover_omits_instructions_and_server_info_that_are_absent_or_malformed(overrides):
    initialize = {k: v for k, v in INITIALIZE_RESULT.items() if k not in ("instructions", "serverInfo")}
    result = discover_result({**initialize, **overrides}, HINT)
    assert "instructions" not in result
    assert "_meta" not in result
    assert errors(LATEST_MODERN, "DiscoverResult", result) == []


def test_discover_without_capabilities_declares_none():
    initialize = {k: v for k, v in INITIALIZE_RESULT.items() if k != "capabilities"}
    assert discover_result(initialize, HINT)["capabilities"] == {}


def test_discover_leaves_the_initialize_result_alone():
    initialize = copy.deepcopy(INITIALIZE_RESULT)
    result = discover_result(initialize, HINT)
    result["capabilities"]["tools"]["listChanged"] = False
    assert initialize == INITIALIZE_RESULT


def test_a_cache_hint_is_an_immutable_value():
    assert CacheHint(1, "private") == CacheHint(1, "private") != CacheHint(1, "public")
    with pytest.raises(dataclasses.FrozenInstanceError):
        HINT.ttl_ms = 0  # type: ignore[misc]


# ---------------------------------------------------------------- request half (§4.3 request body rewrite)

MODERN_CALL = {
    "jsonrpc": "2.0",
    "id": "downstream-1",
    "method": "tools/call",
    "params": {
        "name": "weather",
        "arguments": {"city": "Zürich"},
        "x-vendor-param": {"keep": [1, 2]},
        "inputResponses": {"s3": {"action": "accept", "content": {"ok": True}}},
        "requestState": "opaque.token",
        "_meta": {
            meta.PROTOCOL_VERSION: LATEST_MODERN,
            meta.CLIENT_CAPABILITIES: MODERN_CAPS,
            meta.CLIENT_INFO: CLIENT_INFO,
            meta.LOG_LEVEL: "info",
            "progressToken": "dl-1",
            "traceparent": "00-abc-def-01",
            "com.example/tenant": "t1",
        },
    },
    "x-top-level": "kept",
}


def test_a_forwarded_request_loses_the_modern_envelope_and_mrtr_fields_and_validates_for_2025_11_25():
    out = to_upstream(MODERN_CALL, 9, "p9")
    assert out == {
        "jsonrpc": "2.0",
        "id": 9,
        "method": "tools/call",
        "x-top-level": "kept",
        "params": {
            "name": "weather",
            "arguments": {"city": "Zürich"},
            "x-vendor-param": {"keep": [1, 2]},
            "_meta": {"progressToken": "p9", "traceparent": "00-abc-def-01", "com.example/tenant": "t1"},
        },
    }
    assert errors(LATEST_LEGACY, "CallToolRequest", out) == []


def test_a_forwarded_request_leaves_its_input_alone():
    message = copy.deepcopy(MODERN_CALL)
    to_upstream(message, 9, "p9")
    assert message == MODERN_CALL


def test_the_client_progress_token_never_goes_upstream_without_a_rewrite():
    out = to_upstream(MODERN_CALL, 9)
    assert "progressToken" not in out["params"]["_meta"]
    assert out["params"]["_meta"] == {"traceparent": "00-abc-def-01", "com.example/tenant": "t1"}


@pytest.mark.parametrize("progress_token", [None, "p4"])
def test_a_meta_left_empty_is_removed_unless_a_progress_token_goes_into_it(progress_token):
    request_meta = {meta.PROTOCOL_VERSION: LATEST_MODERN, meta.CLIENT_CAPABILITIES: {}, "progressToken": 1}
    message = jsonrpc.request(4, "resources/read", {"uri": "mem://a", "_meta": request_meta})
    out = to_upstream(message, 4, progress_token)
    if progress_token is None:
        assert out["params"] == {"uri": "mem://a"}
    else:
        assert out["params"] == {"uri": "mem://a", "_meta": {"progressToken": progress_token}}
    assert errors(LATEST_LEGACY, "ReadResourceRequest", out) == []


@pytest.mark.parametrize(
    "params",
    [
        None,
        {},
        {"_meta": {meta.PROTOCOL_VERSION: LATEST_MODERN, meta.CLIENT_CAPABILITIES: {}}},
        {"requestState": "s", "inputResponses": {}, "_meta": {meta.LOG_LEVEL: "debug"}},
        ["not", "an", "object"],
    ],
)
def test_params_left_empty_are_omitted(params):
    message = {"jsonrpc": "2.0", "id": "f", "method": "tools/list"}
    if params is not None:
        message["params"] = params
    out = to_upstream(message, 2)
    assert out == {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    assert errors(LATEST_LEGACY, "ListToolsRequest", out) == []


def test_the_consumed_params_do_not_reach_the_legacy_server():
    consumed = {"inputResponses": {}, "requestState": "s", "task": {"ttl": 5}}
    message = jsonrpc.request("f", "tools/call", {"name": "slow", **consumed})
    assert to_upstream(message, 3) == jsonrpc.request(3, "tools/call", {"name": "slow"})


def test_params_without_meta_pass_unchanged_under_the_upstream_id():
    message = jsonrpc.request("f", "prompts/get", {"name": "greet", "arguments": {"who": "Ada"}})
    assert to_upstream(message, 3) == jsonrpc.request(3, "prompts/get", message["params"])


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
# What the proxy consumes (docs/translation.md: the round's answers, its state, 2025-11-25's task
# augmentation, which a legacy server would act on): every other key must reach the server.
_CONSUMED = ("_meta", "inputResponses", "requestState", "task")
_param_keys = st.text(max_size=12).filter(lambda k: k not in _CONSUMED)
_meta_keys = st.text(max_size=30).filter(lambda k: k not in (*meta.ENVELOPE_KEYS, "progressToken"))


@settings(max_examples=150)
@given(
    params=st.dictionaries(_param_keys, _json, max_size=5),
    request_meta=st.none() | st.dictionaries(_meta_keys, _json, max_size=4),
    progress_token=st.none() | st.text(min_size=1, max_size=6),
    upstream_id=st.integers() | st.text(max_size=6),
)
def test_to_upstream_never_drops_an_unknown_param_or_meta_key(params, request_meta, progress_token, upstream_id):
    sent = dict(params)
    if request_meta is not None:
        sent["_meta"] = {**request_meta, meta.PROTOCOL_VERSION: LATEST_MODERN, "progressToken": "downstream"}
    message = jsonrpc.request("downstream-id", "tools/call", sent)
    snapshot = copy.deepcopy(message)
    out = to_upstream(message, upstream_id, progress_token)
    assert message == snapshot
    assert out["id"] == upstream_id and out["method"] == "tools/call"
    out_params = out.get("params", {})
    assert {k: v for k, v in out_params.items() if k != "_meta"} == params
    expected_meta = dict(request_meta or {})
    if request_meta is not None and progress_token is not None:
        expected_meta["progressToken"] = progress_token
    assert out_params.get("_meta", {}) == expected_meta
    assert ("_meta" in out_params) is bool(expected_meta)


@pytest.mark.parametrize(
    ("message", "token"),
    [
        (MODERN_CALL, "dl-1"),
        (jsonrpc.request(1, "tools/call", {"_meta": {"progressToken": 0}}), 0),
        (jsonrpc.request(1, "tools/call", {"_meta": {"progressToken": "t", "other": 1}}), "t"),
        (jsonrpc.request(1, "tools/call", {"_meta": {"other": 1}}), None),
        (jsonrpc.request(1, "tools/call", {"_meta": {}}), None),
        (jsonrpc.request(1, "tools/call", {"_meta": "junk"}), None),
        (jsonrpc.request(1, "tools/call", {"name": "x"}), None),
        (jsonrpc.request(1, "tools/list"), None),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": ["progressToken"]}, None),
    ],
)
def test_progress_token_of_reads_the_request_meta_token(message, token):
    assert progress_token_of(message) == token


# ---------------------------------------------------------------- results (§4.7)

WEATHER_TOOL = {
    "name": "weather",
    "title": "Weather",
    "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}},
    "execution": {"taskSupport": "optional"},
    "x-vendor-field": {"kept": True},
}
LEGACY_RESULTS = {
    "tools/list": {"tools": [WEATHER_TOOL, {"name": "plain", "inputSchema": {"type": "object"}}], "nextCursor": "2"},
    "prompts/list": {"prompts": [{"name": "greet"}]},
    "resources/list": {"resources": [{"uri": "mem://a", "name": "a"}]},
    "resources/templates/list": {"resourceTemplates": [{"uriTemplate": "mem://{x}", "name": "t"}]},
    "resources/read": {"contents": [{"uri": "mem://a", "text": "hello"}]},
    "tools/call": {"content": [{"type": "text", "text": "sunny"}], "isError": False},
    "prompts/get": {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}]},
    "completion/complete": {"completion": {"values": ["a"], "hasMore": False}},
}


@pytest.mark.parametrize("method", sorted(LEGACY_RESULTS))
def test_legacy_results_become_valid_2026_07_28_results(method):
    legacy = LEGACY_RESULTS[method]
    assert server_message_errors(LATEST_LEGACY, jsonrpc.result_response(1, legacy), method) == []
    out = result_to_downstream(method, legacy, SERVER_INFO, HINT if method in CACHEABLE_METHODS else None)
    assert out["resultType"] == "complete"
    assert out["_meta"] == {meta.SERVER_INFO: SERVER_INFO}
    assert server_message_errors(LATEST_MODERN, jsonrpc.result_response(1, out), method) == []


@pytest.mark.parametrize("method", sorted(CACHEABLE_METHODS - {"server/discover"}))
def test_cacheable_results_carry_the_configured_hint(method):
    out = result_to_downstream(method, LEGACY_RESULTS[method], SERVER_INFO, CacheHint(1500, "private"))
    assert (out["ttlMs"], out["cacheScope"]) == (1500, "private")


SKILL = {
    "uri": "skill://tide-tables/SKILL.md",
    "frontmatter": {"name": "tide-tables", "description": "Reads a tide table."},
    "resources": [{"uri": "skill://tide-tables/SKILL.md", "digest": "sha256:" + "0" * 64, "size": 42}],
}
SKILLS_RESULTS = {
    "skills/list": {"skills": [SKILL], "nextCursor": "2"},
    "skills/get": {"skill": SKILL},
    "resources/directory/read": {"resources": [{"uri": "skill://tide-tables/references", "name": "references"}]},
}


@pytest.mark.parametrize("method", sorted(SKILLS_RESULTS))
def test_the_skills_extensions_cacheable_results_carry_the_configured_hint_and_keep_the_rest(method):
    # 2026-07-28 skills/list, skills/get and resources/directory/read results carry ttlMs and
    # cacheScope (SEP-2640); a legacy server's have none.
    legacy = SKILLS_RESULTS[method]
    out = result_to_downstream(method, legacy, SERVER_INFO, CacheHint(1500, "public"))
    assert (out["ttlMs"], out["cacheScope"]) == (1500, "public")
    assert {k: v for k, v in out.items() if k not in ("ttlMs", "cacheScope", "resultType", "_meta")} == legacy


@pytest.mark.parametrize(("method", "hint"), [("tools/call", HINT), ("prompts/get", HINT), ("tools/list", None)])
def test_no_cache_hint_is_added_to_uncacheable_results_or_without_a_hint(method, hint):
    out = result_to_downstream(method, LEGACY_RESULTS[method], SERVER_INFO, hint)
    assert "ttlMs" not in out and "cacheScope" not in out


def test_tools_list_loses_execution_and_keeps_everything_else():
    tools = [*LEGACY_RESULTS["tools/list"]["tools"], "not-a-tool"]
    out = result_to_downstream("tools/list", {**LEGACY_RESULTS["tools/list"], "tools": tools}, None, HINT)
    assert out["tools"] == [
        {k: v for k, v in WEATHER_TOOL.items() if k != "execution"},
        LEGACY_RESULTS["tools/list"]["tools"][1],
        "not-a-tool",
    ]
    assert out["nextCursor"] == "2"


def test_execution_is_stripped_only_from_a_tools_list():
    result = {"content": [], "tools": [WEATHER_TOOL]}
    assert result_to_downstream("tools/call", result, None, None)["tools"] == [WEATHER_TOOL]


@pytest.mark.parametrize("tools", [None, "x", {"weather": WEATHER_TOOL}])
def test_a_tools_list_without_a_tool_array_keeps_what_it_has(tools):
    out = result_to_downstream("tools/list", {"tools": tools}, None, None)
    assert out == {"tools": tools, "resultType": "complete"}


def test_server_info_is_merged_into_an_existing_result_meta():
    result = {**LEGACY_RESULTS["tools/call"], "_meta": {"com.example/trace": "t-1"}}
    out = result_to_downstream("tools/call", result, SERVER_INFO, None)
    assert out["_meta"] == {"com.example/trace": "t-1", meta.SERVER_INFO: SERVER_INFO}


@pytest.mark.parametrize("result_meta", ["junk", None, [1]])
def test_a_malformed_result_meta_is_replaced_by_the_server_info(result_meta):
    out = result_to_downstream("tools/call", {"content": [], "_meta": result_meta}, SERVER_INFO, None)
    assert out["_meta"] == {meta.SERVER_INFO: SERVER_INFO}


def test_without_server_info_the_result_meta_is_untouched():
    result = {"content": [], "_meta": {"com.example/trace": "t-1"}}
    assert result_to_downstream("tools/call", result, None, None)["_meta"] == {"com.example/trace": "t-1"}
    assert "_meta" not in result_to_downstream("tools/call", {"content": []}, None, None)


def test_unknown_result_fields_survive_and_the_input_is_untouched():
    result = {**LEGACY_RESULTS["tools/list"], "x-new": {"a": [1]}, "_meta": {"k": 1}}
    snapshot = copy.deepcopy(result)
    out = result_to_downstream("tools/list", result, SERVER_INFO, HINT)
    assert result == snapshot
    assert out["x-new"] == {"a": [1]}
    assert out["tools"][0]["x-vendor-field"] == {"kept": True}


# ---------------------------------------------------------------- errors (§4.7 table)


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (jsonrpc.METHOD_NOT_FOUND, 404),
        (jsonrpc.HEADER_MISMATCH, 400),
        (jsonrpc.MISSING_REQUIRED_CAPABILITY, 400),
        (jsonrpc.UNSUPPORTED_PROTOCOL_VERSION, 400),
        (jsonrpc.PARSE_ERROR, 400),
        (jsonrpc.INVALID_REQUEST, 400),
        (jsonrpc.INVALID_PARAMS, 200),
        (jsonrpc.INTERNAL_ERROR, 200),
        (-32000, 200),
        (jsonrpc.UPSTREAM_TIMEOUT, 200),
        (-32019, 200),
        (-32100, 200),
        (-32768, 200),
        (1, 200),
    ],
)
def test_errors_modern_clients_know_pass_unchanged_with_their_http_status(code, status):
    error = {"code": code, "message": "m", "data": {"detail": [1]}, "x-extra": True}
    snapshot = copy.deepcopy(error)
    out, http = error_to_downstream(error)
    assert (out, http) == (error, status)
    assert error == snapshot
    assert errors(LATEST_MODERN, "Error", out) == []


def test_resource_not_found_becomes_invalid_params_keeping_message_data_and_extras():
    error = {"code": jsonrpc.RESOURCE_NOT_FOUND, "message": "Resource not found", "data": {"uri": "mem://x"}, "x": 1}
    snapshot = copy.deepcopy(error)
    out, http = error_to_downstream(error)
    assert out == {**error, "code": jsonrpc.INVALID_PARAMS}
    assert http == 200
    assert error == snapshot
    assert errors(LATEST_MODERN, "InvalidParamsError", out) == []


@pytest.mark.parametrize("code", [jsonrpc.URL_ELICITATION_REQUIRED, -32023, -32050, -32099])
def test_other_codes_of_the_reserved_range_become_internal_errors_carrying_the_original(code):
    error = {"code": code, "message": "URL elicitation required", "data": {"elicitations": []}}
    snapshot = copy.deepcopy(error)
    out, http = error_to_downstream(error)
    assert out == {
        "code": jsonrpc.INTERNAL_ERROR,
        "message": "URL elicitation required",
        "data": {"upstreamError": error},
    }
    assert http == 200
    assert error == snapshot
    assert errors(LATEST_MODERN, "InternalError", out) == []


def test_a_reserved_code_error_without_a_message_still_gets_one():
    out, _ = error_to_downstream({"code": -32042})
    assert out["code"] == jsonrpc.INTERNAL_ERROR
    assert out["message"]
    assert errors(LATEST_MODERN, "InternalError", out) == []


@pytest.mark.parametrize("code", [None, "-32002", -32042.0, True])
def test_an_error_whose_code_is_not_an_integer_passes_unchanged(code):
    error = {"code": code, "message": "odd"}
    assert error_to_downstream(error) == (error, 200)


# ---------------------------------------------------------------- request-scoped notifications (§4.4)


@pytest.mark.parametrize("threshold_index", range(len(meta.LOG_LEVELS)))
def test_log_messages_reach_the_client_only_at_or_above_its_level(threshold_index):
    threshold = meta.LOG_LEVELS[threshold_index]
    for index, level in enumerate(meta.LOG_LEVELS):
        note = jsonrpc.notification("notifications/message", {"level": level, "data": {"x": 1}})
        passed = notification_to_downstream(note, "dl-1", threshold)
        assert (passed is not None) is (index >= threshold_index)
        if passed is not None:
            assert passed == note
            assert server_message_errors(LATEST_MODERN, passed) == []


def test_no_log_message_reaches_a_request_without_a_level():
    note = jsonrpc.notification("notifications/message", {"level": "emergency", "data": "x"})
    assert notification_to_downstream(note, "dl-1", None) is None


def test_a_log_message_of_an_unknown_level_is_let_through():
    note = jsonrpc.notification("notifications/message", {"level": "verbose", "data": "x"})
    assert notification_to_downstream(note, None, "emergency") == note


@pytest.mark.parametrize("token", ["dl-1", 7])
def test_progress_is_relayed_under_the_client_token_keeping_everything_else(token):
    params = {"progressToken": "p9", "progress": 2, "total": 4, "message": "half", "_meta": {"k": 1}, "x": [1]}
    note = {**jsonrpc.notification("notifications/progress", params), "x-top": 1}
    snapshot = copy.deepcopy(note)
    out = notification_to_downstream(note, token, None)
    assert out == {**note, "params": {**params, "progressToken": token}}
    assert note == snapshot
    assert errors(LATEST_MODERN, "ProgressNotification", out) == []


def test_progress_is_dropped_for_a_request_that_asked_for_none():
    note = jsonrpc.notification("notifications/progress", {"progressToken": "p9", "progress": 1})
    assert notification_to_downstream(note, None, "debug") is None


@pytest.mark.parametrize(
    "method",
    [
        "notifications/tools/list_changed",
        "notifications/resources/updated",
        "notifications/cancelled",
        "notifications/elicitation/complete",
        "notifications/tasks/status",
        "notifications/x-vendor",
    ],
)
def test_nothing_else_is_request_scoped(method):
    note = jsonrpc.notification(method, {"uri": "mem://a", "requestId": 1, "level": "error"})
    assert notification_to_downstream(note, "dl-1", "debug") is None


# ---------------------------------------------------------------- server-to-client requests (§4.5)

CAPS = {"roots": {}, "sampling": {}, "elicitation": {"form": {}}}
FORM_ELICIT = jsonrpc.request(
    11,
    "elicitation/create",
    {
        "mode": "form",
        "message": "Deploy to prod?",
        "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
        "task": {"ttl": 1000},
        "_meta": {"progressToken": "e1"},
        "x-vendor": 1,
    },
)
URL_ELICIT = jsonrpc.request(
    12,
    "elicitation/create",
    {"mode": "url", "message": "Sign in", "url": "https://example.com/login", "elicitationId": "e-1"},
)
SAMPLING = jsonrpc.request(
    13,
    "sampling/createMessage",
    {
        "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
        "maxTokens": 5,
        "task": {"ttl": 1000},
    },
)
ROOTS = jsonrpc.request(14, "roots/list")


@pytest.mark.parametrize("request_", [FORM_ELICIT, URL_ELICIT, SAMPLING, ROOTS])
def test_the_server_request_fixtures_are_valid_2025_11_25_requests(request_):
    assert server_message_errors(LATEST_LEGACY, request_) == []


@pytest.mark.parametrize("downstream_method", [None, "tools/call", "tools/list", "subscriptions/listen"])
def test_a_server_ping_is_answered_at_once_with_an_empty_result(downstream_method):
    decision = server_request(jsonrpc.request(3, "ping"), downstream_method, {})
    assert decision == Answer(result={})
    response = decision.response(3)
    assert response == jsonrpc.result_response(3, {})
    assert errors(LATEST_LEGACY, "JSONRPCResultResponse", response) == []


@pytest.mark.parametrize(
    "method", ["tasks/get", "tasks/result", "tasks/list", "x/vendor", None, ["elicitation/create"], {}]
)
def test_anything_but_ping_and_the_three_input_requests_is_method_not_found(method):
    decision = server_request({"jsonrpc": "2.0", "id": 4, "method": method}, "tools/call", CAPS)
    assert isinstance(decision, Answer)
    assert decision.result is None
    assert decision.error["code"] == jsonrpc.METHOD_NOT_FOUND
    assert str(method) in decision.error["message"]
    assert errors(LATEST_LEGACY, "JSONRPCErrorResponse", decision.response(4)) == []


@pytest.mark.parametrize("request_", [FORM_ELICIT, SAMPLING, ROOTS])
@pytest.mark.parametrize("downstream_method", ["tools/list", "completion/complete", "server/discover"])
def test_input_requests_outside_the_three_mrtr_methods_are_method_not_found(request_, downstream_method):
    decision = server_request(request_, downstream_method, CAPS)
    assert isinstance(decision, Answer)
    assert decision.error["code"] == jsonrpc.METHOD_NOT_FOUND
    assert downstream_method in decision.error["message"]


def test_an_input_request_with_no_downstream_request_is_method_not_found():
    decision = server_request(ROOTS, None, CAPS)
    assert isinstance(decision, Answer)
    assert decision.error["code"] == jsonrpc.METHOD_NOT_FOUND
    assert "roots/list" in decision.error["message"]


@pytest.mark.parametrize(
    ("request_", "caps", "required", "code"),
    [
        (FORM_ELICIT, {"roots": {}}, {"elicitation": {"form": {}}}, jsonrpc.INVALID_PARAMS),
        (URL_ELICIT, CAPS, {"elicitation": {"url": {}}}, jsonrpc.INVALID_PARAMS),
        (SAMPLING, {"roots": {}}, {"sampling": {}}, jsonrpc.METHOD_NOT_FOUND),
        (
            jsonrpc.request(15, "sampling/createMessage", {**SAMPLING["params"], "tools": []}),
            CAPS,
            {"sampling": {"tools": {}}},
            jsonrpc.METHOD_NOT_FOUND,
        ),
        (
            jsonrpc.request(16, "sampling/createMessage", {**SAMPLING["params"], "includeContext": "thisServer"}),
            CAPS,
            {"sampling": {"context": {}}},
            jsonrpc.METHOD_NOT_FOUND,
        ),
        (ROOTS, {"sampling": {}}, {"roots": {}}, jsonrpc.METHOD_NOT_FOUND),
    ],
)
def test_an_input_request_the_downstream_request_did_not_declare_is_missing_a_capability(
    request_, caps, required, code
):
    decision = server_request(request_, "tools/call", caps)
    assert isinstance(decision, Missing)
    assert decision.required == required
    assert decision.upstream_error["code"] == code
    assert next(iter(required)) in decision.upstream_error["message"]
    response = jsonrpc.error_response(request_["id"], code, decision.upstream_error["message"])
    assert errors(LATEST_LEGACY, "JSONRPCErrorResponse", response) == []


@pytest.mark.parametrize("downstream_method", sorted(INPUT_REQUIRED_METHODS))
def test_a_declared_form_elicitation_is_parked_without_task_and_meta(downstream_method):
    decision = server_request(FORM_ELICIT, downstream_method, CAPS)
    assert isinstance(decision, Park)
    params = {k: v for k, v in FORM_ELICIT["params"].items() if k not in ("task", "_meta")}
    assert decision.input_request == {"method": "elicitation/create", "params": params}
    assert decision.input_request["params"]["x-vendor"] == 1
    assert errors(LATEST_MODERN, "ElicitRequest", decision.input_request) == []


def test_a_declared_url_elicitation_is_parked_without_its_elicitation_id():
    decision = server_request(URL_ELICIT, "tools/call", {"elicitation": {"url": {}}})
    assert isinstance(decision, Park)
    assert decision.input_request == {
        "method": "elicitation/create",
        "params": {"mode": "url", "message": "Sign in", "url": "https://example.com/login"},
    }
    assert errors(LATEST_MODERN, "ElicitRequest", decision.input_request) == []


def test_a_declared_sampling_request_is_parked_without_task():
    decision = server_request(SAMPLING, "prompts/get", CAPS)
    assert isinstance(decision, Park)
    assert decision.input_request == {
        "method": "sampling/createMessage",
        "params": {k: v for k, v in SAMPLING["params"].items() if k != "task"},
    }
    assert errors(LATEST_MODERN, "CreateMessageRequest", decision.input_request) == []


@pytest.mark.parametrize(
    "request_",
    [ROOTS, jsonrpc.request(14, "roots/list", {}), jsonrpc.request(14, "roots/list", {"_meta": {"progressToken": 1}})],
)
def test_a_parameterless_roots_list_is_parked_without_params(request_):
    decision = server_request(request_, "resources/read", CAPS)
    assert decision == Park({"method": "roots/list"})
    assert errors(LATEST_MODERN, "ListRootsRequest", decision.input_request) == []


def test_a_roots_list_with_other_params_keeps_them():
    decision = server_request(jsonrpc.request(14, "roots/list", {"x-vendor": 2, "task": {}}), "tools/call", CAPS)
    assert decision == Park({"method": "roots/list", "params": {"x-vendor": 2}})


@pytest.mark.parametrize("request_", [FORM_ELICIT, URL_ELICIT, SAMPLING])
def test_server_requests_are_not_mutated(request_):
    snapshot = copy.deepcopy(request_)
    server_request(request_, "tools/call", {**CAPS, "elicitation": {"form": {}, "url": {}}})
    server_request(request_, "tools/call", {})
    assert request_ == snapshot


def test_an_answer_with_an_error_responds_with_it_and_an_empty_answer_with_an_empty_result():
    error = jsonrpc.error_object(jsonrpc.INTERNAL_ERROR, "no")
    assert Answer(error=error).response(5) == {"jsonrpc": "2.0", "id": 5, "error": error}
    assert Answer(result={"a": 1}, error=error).response("s5") == {"jsonrpc": "2.0", "id": "s5", "error": error}
    assert Answer().response(6) == jsonrpc.result_response(6, {})
    assert Answer(result={"roots": []}).response(7) == jsonrpc.result_response(7, {"roots": []})


def test_an_abandoned_elicitation_is_cancelled():
    answer = abandoned_answer("elicitation/create")
    assert answer == Answer(result={"action": "cancel"})
    assert errors(LATEST_LEGACY, "ElicitResult", answer.result) == []


@pytest.mark.parametrize("method", ["sampling/createMessage", "roots/list"])
def test_an_abandoned_sampling_or_roots_request_fails_with_an_internal_error(method):
    answer = abandoned_answer(method)
    assert answer.result is None
    assert answer.error["code"] == jsonrpc.INTERNAL_ERROR
    assert answer.error["message"]
    assert errors(LATEST_LEGACY, "JSONRPCErrorResponse", answer.response(3)) == []


# ---------------------------------------------------------------- subscriptions/listen (§4.6)

SERVER_CAPS = INITIALIZE_RESULT["capabilities"]
ALL_LIST_CHANGES = {key: True for key in LIST_CHANGED}


def test_nothing_is_honored_without_a_push_channel():
    assert honored_filter(ALL_LIST_CHANGES, SERVER_CAPS, False, ["mem://a"]) == {}


def test_honored_is_what_was_requested_and_the_server_can_announce_plus_the_subscribed_uris():
    requested = {**ALL_LIST_CHANGES, "resourceSubscriptions": ["mem://a", "mem://b"]}
    honored = honored_filter(requested, SERVER_CAPS, True, ["mem://a"])
    assert honored == {"toolsListChanged": True, "resourcesListChanged": True, "resourceSubscriptions": ["mem://a"]}
    assert errors(LATEST_MODERN, "SubscriptionFilter", honored) == []


@pytest.mark.parametrize(("key", "kind"), [(key, kind) for key, (kind, _) in LIST_CHANGED.items()])
@pytest.mark.parametrize(
    ("requested", "entry", "honored"),
    [
        (True, {"listChanged": True}, True),
        (True, {"listChanged": False}, False),
        (True, {}, False),
        (True, None, False),
        (True, True, False),
        (False, {"listChanged": True}, False),
        ("yes", {"listChanged": True}, False),
        (None, {"listChanged": True}, False),
    ],
)
def test_a_list_change_is_honored_only_when_requested_and_announced(key, kind, requested, entry, honored):
    caps = {kind: entry} if entry is not None else {}
    wanted = {key: requested} if requested is not None else {}
    assert honored_filter(wanted, caps, True, []) == ({key: True} if honored else {})


def test_honored_filter_leaves_its_inputs_alone():
    requested, caps, subscribed = dict(ALL_LIST_CHANGES), copy.deepcopy(SERVER_CAPS), ["mem://a"]
    honored_filter(requested, caps, True, subscribed)
    assert (requested, caps, subscribed) == (ALL_LIST_CHANGES, SERVER_CAPS, ["mem://a"])


@pytest.mark.parametrize(("key", "method"), [(key, method) for key, (_, method) in LIST_CHANGED.items()])
def test_a_requested_list_change_is_relayed_tagged_with_the_subscription_id(key, method):
    note = jsonrpc.notification(method)
    out = listen_notification(note, {key: True}, "L1")
    assert out == jsonrpc.notification(method, {"_meta": {meta.SUBSCRIPTION_ID: "L1"}})
    assert server_message_errors(LATEST_MODERN, out) == []
    others = {k: True for k in LIST_CHANGED if k != key}
    assert listen_notification(note, {**others, "resourceSubscriptions": ["mem://a"]}, "L1") is None


@pytest.mark.parametrize("subscription_id", ["L1", 42])
def test_the_tag_keeps_the_subscription_id_type_other_meta_params_and_fields(subscription_id):
    note = {
        **jsonrpc.notification("notifications/tools/list_changed", {"x": 1, "_meta": {"com.example/k": "v"}}),
        "x-top": True,
    }
    snapshot = copy.deepcopy(note)
    out = listen_notification(note, {"toolsListChanged": True}, subscription_id)
    assert out == {
        **note,
        "params": {"x": 1, "_meta": {"com.example/k": "v", meta.SUBSCRIPTION_ID: subscription_id}},
    }
    assert note == snapshot


@pytest.mark.parametrize(
    ("uri", "relayed"),
    [
        ("mem://docs", True),
        ("mem://docs/a", True),
        ("mem://docs/a/b", True),
        ("mem://docsx", False),
        ("mem://doc", False),
        ("mem://other", False),
        ("file:///tmp/x", True),
        (None, False),
        (5, False),
    ],
)
def test_a_resource_update_is_relayed_when_its_uri_is_subscribed_or_lies_below_one(uri, relayed):
    honored = {"resourceSubscriptions": ["mem://docs", "file:///tmp/"], "toolsListChanged": True}
    note = jsonrpc.notification("notifications/resources/updated", {"uri": uri})
    out = listen_notification(note, honored, 3)
    if relayed:
        assert out == jsonrpc.notification(
            "notifications/resources/updated", {"uri": uri, "_meta": {meta.SUBSCRIPTION_ID: 3}}
        )
        assert server_message_errors(LATEST_MODERN, out) == []
    else:
        assert out is None


def test_a_resource_update_is_not_relayed_without_subscriptions():
    note = jsonrpc.notification("notifications/resources/updated", {"uri": "mem://docs"})
    assert listen_notification(note, ALL_LIST_CHANGES, 3) is None
    assert listen_notification(note, {**ALL_LIST_CHANGES, "resourceSubscriptions": []}, 3) is None


@pytest.mark.parametrize(
    "note",
    [
        jsonrpc.notification("notifications/progress", {"progressToken": "p1", "progress": 1}),
        jsonrpc.notification("notifications/message", {"level": "emergency", "data": "x"}),
        jsonrpc.notification("notifications/elicitation/complete", {"elicitationId": "e"}),
        jsonrpc.notification("notifications/tasks/status", {"taskId": "t"}),
        jsonrpc.notification("notifications/cancelled", {"requestId": 1}),
    ],
)
def test_nothing_else_goes_on_a_listen_stream(note):
    honored = {**ALL_LIST_CHANGES, "resourceSubscriptions": ["mem://docs"]}
    assert listen_notification(note, honored, "L1") is None


@pytest.mark.parametrize("subscription_id", ["L1", 42])
def test_the_acknowledgement_reports_the_honored_subset_under_the_subscription_id(subscription_id):
    honored = {"toolsListChanged": True, "resourceSubscriptions": ["mem://docs"]}
    note = acknowledgement(honored, subscription_id)
    assert note == {
        "jsonrpc": "2.0",
        "method": "notifications/subscriptions/acknowledged",
        "params": {"notifications": honored, "_meta": {meta.SUBSCRIPTION_ID: subscription_id}},
    }
    assert errors(LATEST_MODERN, "SubscriptionsAcknowledgedNotification", note) == []
    assert server_message_errors(LATEST_MODERN, note) == []


def test_an_acknowledgement_of_nothing_is_still_valid():
    assert errors(LATEST_MODERN, "SubscriptionsAcknowledgedNotification", acknowledgement({}, "L1")) == []


@pytest.mark.parametrize("subscription_id", ["L1", 42])
def test_a_listen_closed_by_the_proxy_ends_with_the_graceful_completion_result(subscription_id):
    message = listen_closed(subscription_id)
    assert message == {
        "jsonrpc": "2.0",
        "id": subscription_id,
        "result": {"resultType": "complete", "_meta": {meta.SUBSCRIPTION_ID: subscription_id}},
    }
    assert errors(LATEST_MODERN, "SubscriptionsListenResultResponse", message) == []
    assert server_message_errors(LATEST_MODERN, message, "subscriptions/listen") == []


# ---------------------------------------------------------------- tools the server runs only as tasks


def test_the_tools_a_server_runs_only_as_tasks_are_those_listed_required() -> None:
    result = {
        "tools": [
            {"name": "research", "execution": {"taskSupport": "required"}},
            {"name": "maybe", "execution": {"taskSupport": "optional"}},
            {"name": "plain"},
            {"execution": {"taskSupport": "required"}},
            "junk",
        ]
    }
    assert m2l.task_required_tools(result) == {"research"}
    assert m2l.task_required_tools({"tools": "junk"}) == set()
    assert m2l.task_required_tools(None) == set()


def test_a_server_takes_task_augmented_calls_only_if_it_says_so() -> None:
    assert m2l.runs_tool_calls_as_tasks({"tasks": {"requests": {"tools": {"call": {}}}}})
    assert not m2l.runs_tool_calls_as_tasks({"tasks": {"list": {}}})
    assert not m2l.runs_tool_calls_as_tasks({"tasks": {"requests": {"tools": {"call": True}}}})
    assert not m2l.runs_tool_calls_as_tasks({})


def test_the_call_asks_for_a_task_and_the_task_id_comes_from_its_create_task_result() -> None:
    outgoing = jsonrpc.request(4, "tools/call", {"name": "research", "arguments": {}, "_meta": {"progressToken": "p4"}})
    assert m2l.task_augmented(outgoing)["params"] == {**outgoing["params"], "task": {}}
    assert "task" not in outgoing["params"]
    assert m2l.created_task_id(jsonrpc.result_response(4, {"task": {"taskId": "t-9", "status": "working"}})) == "t-9"
    assert m2l.created_task_id(jsonrpc.result_response(4, {"content": []})) is None
    assert m2l.created_task_id(jsonrpc.result_response(4, {"task": {"taskId": ""}})) is None
    assert m2l.created_task_id(jsonrpc.error_response(4, -32601, "no")) is None
    assert m2l.task_result_request(5, "t-9") == jsonrpc.request(5, "tasks/result", {"taskId": "t-9"})
    assert m2l.task_cancel_request(6, "t-9") == jsonrpc.request(6, "tasks/cancel", {"taskId": "t-9"})


def test_the_task_result_becomes_the_reply_to_the_call_without_the_task_tag() -> None:
    tagged = {"content": [], "_meta": {meta.RELATED_TASK: {"taskId": "t-9"}, "com.example/k": 1}}
    assert m2l.as_call_reply(jsonrpc.result_response(5, tagged), 4) == jsonrpc.result_response(
        4, {"content": [], "_meta": {"com.example/k": 1}}
    )
    only_tag = {"content": [], "_meta": {meta.RELATED_TASK: {"taskId": "t-9"}}}
    assert m2l.as_call_reply(jsonrpc.result_response(5, only_tag), 4) == jsonrpc.result_response(4, {"content": []})
    error = jsonrpc.error_response(5, -32603, "boom")
    assert m2l.as_call_reply(error, 4) == jsonrpc.error_response(4, -32603, "boom")
