"""Legacy client → modern upstream, both halves (docs/translation.md §3; proxy/protocol/legacy_to_modern.py)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.protocol import jsonrpc, meta
from proxy.protocol.capabilities import modern_client_capabilities
from proxy.protocol.headers import (
    METHOD_HEADER,
    NAME_HEADER,
    PARAM_HEADER_PREFIX,
    PROTOCOL_VERSION_HEADER,
    SESSION_HEADER,
    ParamHeader,
)
from proxy.protocol.legacy_to_modern import (
    INPUT_REQUIRED_METHODS,
    ClientProfile,
    Complete,
    InitializeRefused,
    InputRequestRejected,
    InputRequired,
    Invalid,
    classify_result,
    error_to_downstream,
    gap_notifications,
    initialize_result,
    input_request_to_downstream,
    input_response_from_downstream,
    listen_filter,
    notification_to_downstream,
    result_to_downstream,
    screen_tools,
    strip_subscription_id,
    to_upstream,
    upstream_headers,
)
from proxy.protocol.versions import LATEST_LEGACY, LATEST_MODERN, LEGACY_VERSIONS, MODERN_VERSIONS
from tests.support.schema import errors, server_message_errors

from .modern_fixtures import CACHE_HINTS, ICONS, MODERN_ENVELOPE, TOOLS_CALL, TOOLS_LIST
from .x_mcp_header_cases import INVALID_SCHEMAS

PROXY_INFO = {"name": "mcp-era-proxy", "version": "0.0.0-test"}
UPSTREAM_INFO = {
    "name": "upstream",
    "version": "2.3",
    "title": "Upstream",
    "icons": ICONS,
    "description": "A modern server",
    "websiteUrl": "https://example.com",
}
DISCOVER = {
    "resultType": "complete",
    "supportedVersions": [*MODERN_VERSIONS],
    "capabilities": {
        "tools": {"listChanged": True},
        "prompts": {},
        "resources": {"subscribe": True, "listChanged": True},
        "completions": {},
        "logging": {},
        "extensions": {"io.modelcontextprotocol/tasks": {}},
    },
    "instructions": "Use the weather tool.",
    "_meta": {meta.SERVER_INFO: UPSTREAM_INFO},
    **CACHE_HINTS,
}
CLIENT_INFO = {"name": "legacy-client", "version": "1.30"}


def _profile(**overrides) -> ClientProfile:
    fields = {
        "modern_version": LATEST_MODERN,
        "capabilities": {"roots": {}, "sampling": {}, "elicitation": {"form": {}}},
        "client_info": CLIENT_INFO,
        "log_level": None,
    }
    return ClientProfile(**(fields | overrides))


# ---------------------------------------------------------------- initialize


def test_the_discover_fixture_is_a_valid_2026_07_28_discover_result():
    assert errors(LATEST_MODERN, "DiscoverResult", DISCOVER) == []


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_initialize_result_validates_for_each_legacy_revision_it_echoes(version):
    legacy, modern, result = initialize_result(DISCOVER, version, PROXY_INFO)
    assert (legacy, modern) == (version, LATEST_MODERN)
    assert result["protocolVersion"] == version
    assert server_message_errors(version, jsonrpc.result_response(0, result), "initialize") == []


@pytest.mark.parametrize("requested", ["2099-01-01", LATEST_MODERN, None, 20251125])
def test_initialize_answers_an_unknown_revision_with_the_newest_legacy_one(requested):
    legacy, _, result = initialize_result(DISCOVER, requested, PROXY_INFO)
    assert legacy == LATEST_LEGACY == result["protocolVersion"]


def test_initialize_reports_the_upstream_server_info_shaped_for_the_session_revision():
    _, _, new = initialize_result(DISCOVER, "2025-11-25", PROXY_INFO)
    assert new["serverInfo"] == UPSTREAM_INFO
    _, _, old = initialize_result(DISCOVER, "2025-06-18", PROXY_INFO)
    assert old["serverInfo"] == {"name": "upstream", "version": "2.3", "title": "Upstream"}


@pytest.mark.parametrize(
    "discover_meta",
    [None, {}, {meta.SERVER_INFO: {"name": "no-version"}}, {meta.SERVER_INFO: "upstream"}, {"other": 1}],
)
def test_initialize_falls_back_to_the_proxy_identity_without_a_complete_server_info(discover_meta):
    discover = {k: v for k, v in DISCOVER.items() if k != "_meta"}
    if discover_meta is not None:
        discover["_meta"] = discover_meta
    _, _, result = initialize_result(discover, LATEST_LEGACY, PROXY_INFO)
    assert result["serverInfo"] == PROXY_INFO


def test_initialize_copies_instructions_and_maps_capabilities_by_table_a():
    _, _, result = initialize_result(DISCOVER, "2024-11-05", PROXY_INFO)
    assert result["instructions"] == DISCOVER["instructions"]
    assert result["capabilities"]["resources"] == {"subscribe": True, "listChanged": True}
    assert "completions" not in result["capabilities"]
    assert "extensions" not in result["capabilities"]
    assert "resultType" not in result and "ttlMs" not in result and "_meta" not in result
    discover = {k: v for k, v in DISCOVER.items() if k != "instructions"}
    assert "instructions" not in initialize_result(discover, "2024-11-05", PROXY_INFO)[2]


@pytest.mark.parametrize("supported", [[], [*LEGACY_VERSIONS], ["2099-01-01"], None, "2026-07-28"])
def test_initialize_is_refused_when_the_upstream_speaks_no_modern_revision_we_know(supported):
    discover = {**DISCOVER, "supportedVersions": supported}
    with pytest.raises(InitializeRefused) as info:
        initialize_result(discover, LATEST_LEGACY, PROXY_INFO)
    assert repr(supported) in str(info.value)


def test_initialize_leaves_the_discover_result_alone():
    discover = copy.deepcopy(DISCOVER)
    initialize_result(discover, "2024-11-05", PROXY_INFO)
    assert discover == DISCOVER


# ---------------------------------------------------------------- request half

LEGACY_CALL = {
    "jsonrpc": "2.0",
    "id": 7,
    "method": "tools/call",
    "params": {
        "name": "weather",
        "arguments": {"city": "Zürich", "days": 3},
        "task": {"ttl": 1000},
        "x-vendor-param": {"keep": [1, 2]},
        "_meta": {
            "progressToken": "p-1",
            "traceparent": "00-abc-def-01",
            "com.example/tenant": "t1",
            meta.PROTOCOL_VERSION: "forged",
            meta.CLIENT_CAPABILITIES: {"forged": {}},
            meta.CLIENT_INFO: {"name": "forged", "version": "0"},
            meta.LOG_LEVEL: "debug",
            meta.RELATED_TASK: {"taskId": "t"},
        },
    },
    "x-top-level": "kept",
}


def test_a_forwarded_request_is_a_valid_2026_07_28_request_under_the_proxy_id():
    out = to_upstream(LEGACY_CALL, "up-1", _profile())
    assert out["id"] == "up-1"
    assert out["method"] == "tools/call"
    assert errors(LATEST_MODERN, "CallToolRequest", out) == []


def test_the_envelope_keys_are_overwritten_with_the_session_profile():
    profile = _profile(log_level="warning")
    request_meta = to_upstream(LEGACY_CALL, 1, profile)["params"]["_meta"]
    assert request_meta[meta.PROTOCOL_VERSION] == profile.modern_version
    assert request_meta[meta.CLIENT_CAPABILITIES] == profile.capabilities
    assert request_meta[meta.CLIENT_INFO] == CLIENT_INFO
    assert request_meta[meta.LOG_LEVEL] == "warning"


def test_client_supplied_client_info_and_log_level_are_dropped_when_the_session_has_none():
    request_meta = to_upstream(LEGACY_CALL, 1, _profile(client_info=None, log_level=None))["params"]["_meta"]
    assert meta.CLIENT_INFO not in request_meta
    assert meta.LOG_LEVEL not in request_meta


def test_legacy_only_task_fields_are_removed():
    out = to_upstream(LEGACY_CALL, 1, _profile())
    assert "task" not in out["params"]
    assert meta.RELATED_TASK not in out["params"]["_meta"]


def test_unknown_params_meta_keys_and_top_level_fields_survive_and_the_input_is_untouched():
    message = copy.deepcopy(LEGACY_CALL)
    out = to_upstream(message, 1, _profile())
    assert message == LEGACY_CALL
    assert out["x-top-level"] == "kept"
    assert out["params"]["x-vendor-param"] == {"keep": [1, 2]}
    assert out["params"]["arguments"] == LEGACY_CALL["params"]["arguments"]
    for key in ("progressToken", "traceparent", "com.example/tenant"):
        assert out["params"]["_meta"][key] == LEGACY_CALL["params"]["_meta"][key]


@pytest.mark.parametrize("params", [None, {}, {"_meta": None}, {"_meta": "junk"}])
def test_requests_without_params_get_params_with_the_required_meta(params):
    message = jsonrpc.request(3, "tools/list", params) if params is not None else jsonrpc.request(3, "tools/list")
    out = to_upstream(message, 11, _profile())
    assert out["params"]["_meta"][meta.PROTOCOL_VERSION] == LATEST_MODERN
    assert errors(LATEST_MODERN, "ListToolsRequest", out) == []


def test_a_retry_carries_input_responses_and_echoes_request_state_only_when_given():
    responses = {"k1": {"action": "accept", "content": {"ok": True}}}
    retry = to_upstream(LEGACY_CALL, 2, _profile(), input_responses=responses, request_state="opaque==")
    assert retry["params"]["inputResponses"] == responses
    assert retry["params"]["requestState"] == "opaque=="
    assert errors(LATEST_MODERN, "CallToolRequest", retry) == []
    first = to_upstream(LEGACY_CALL, 1, _profile())
    assert "inputResponses" not in first["params"] and "requestState" not in first["params"]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_param_keys = st.text(max_size=12).filter(lambda k: k not in ("task", "_meta"))
_meta_keys = st.text(max_size=30).filter(lambda k: k not in (*meta.ENVELOPE_KEYS, meta.RELATED_TASK))


@settings(max_examples=150)
@given(
    params=st.dictionaries(_param_keys, _json, max_size=5),
    request_meta=st.none() | st.dictionaries(_meta_keys, _json, max_size=4),
    method=st.sampled_from(["tools/call", "tools/list", "resources/read", "x/vendor"]),
    upstream_id=st.integers() | st.text(max_size=6),
)
def test_to_upstream_never_drops_unknown_keys_and_always_carries_the_envelope(
    params, request_meta, method, upstream_id
):
    sent = dict(params)
    if request_meta is not None:
        sent["_meta"] = request_meta
    message = jsonrpc.request(1, method, sent)
    snapshot = copy.deepcopy(message)
    profile = _profile()
    out = to_upstream(message, upstream_id, profile)
    assert message == snapshot
    assert out["id"] == upstream_id and out["method"] == method
    for key, value in params.items():
        assert out["params"][key] == value
    out_meta = out["params"]["_meta"]
    for key, value in (request_meta or {}).items():
        assert out_meta[key] == value
    assert out_meta[meta.PROTOCOL_VERSION] == profile.modern_version
    assert out_meta[meta.CLIENT_CAPABILITIES] == profile.capabilities


# ---------------------------------------------------------------- upstream headers


def test_a_tool_call_carries_version_method_name_and_param_headers():
    out = to_upstream(LEGACY_CALL, 1, _profile())
    headers = upstream_headers(
        out,
        LATEST_MODERN,
        (ParamHeader("City", ("city",), "string"), ParamHeader("Days", ("days",), "integer")),
    )
    assert headers == {
        PROTOCOL_VERSION_HEADER: LATEST_MODERN,
        METHOD_HEADER: "tools/call",
        NAME_HEADER: "weather",
        PARAM_HEADER_PREFIX + "City": "=?base64?WsO8cmljaA==?=",
        PARAM_HEADER_PREFIX + "Days": "3",
    }
    assert headers[PROTOCOL_VERSION_HEADER] == out["params"]["_meta"][meta.PROTOCOL_VERSION]


def test_a_resource_read_names_its_uri_and_a_list_request_names_nothing():
    read = to_upstream(jsonrpc.request(1, "resources/read", {"uri": "file:///a b"}), 1, _profile())
    assert upstream_headers(read, LATEST_MODERN)[NAME_HEADER] == "file:///a b"
    listing = upstream_headers(to_upstream(jsonrpc.request(1, "tools/list"), 2, _profile()), LATEST_MODERN)
    assert listing == {PROTOCOL_VERSION_HEADER: LATEST_MODERN, METHOD_HEADER: "tools/list"}


def test_upstream_headers_never_carry_a_session_id():
    headers = upstream_headers(to_upstream(LEGACY_CALL, 1, _profile()), LATEST_MODERN)
    assert SESSION_HEADER.lower() not in {name.lower() for name in headers}


# ---------------------------------------------------------------- result classification


@pytest.mark.parametrize("result", [{"content": []}, {"resultType": "complete", "content": []}])
def test_a_missing_or_complete_result_type_means_complete(result):
    assert classify_result("tools/call", result) == Complete(result)


@pytest.mark.parametrize("method", sorted(INPUT_REQUIRED_METHODS))
def test_input_required_is_accepted_on_the_three_mrtr_methods(method):
    requests = {"k": {"method": "roots/list"}}
    outcome = classify_result(method, {"resultType": "input_required", "inputRequests": requests, "requestState": "s"})
    assert outcome == InputRequired(requests, "s")


def test_input_required_with_only_request_state_is_load_shedding():
    assert classify_result("tools/call", {"resultType": "input_required", "requestState": "s"}) == InputRequired(
        {}, "s"
    )


def test_mrtr_methods_are_the_ones_the_spec_lists():
    assert frozenset({"tools/call", "prompts/get", "resources/read"}) == INPUT_REQUIRED_METHODS


@pytest.mark.parametrize(
    ("method", "result"),
    [
        ("tools/list", {"resultType": "input_required", "inputRequests": {"k": {"method": "roots/list"}}}),
        ("completion/complete", {"resultType": "input_required", "requestState": "s"}),
        ("tools/call", {"resultType": "input_required"}),
        ("tools/call", {"resultType": "input_required", "inputRequests": [1]}),
        ("tools/call", {"resultType": "input_required", "requestState": 5}),
        ("tools/call", {"resultType": "task", "taskId": "t"}),
        ("tools/call", {"resultType": "bogus"}),
        ("tools/call", {"resultType": None}),
        ("tools/call", ["not", "an", "object"]),
        ("tools/call", None),
    ],
)
def test_anything_else_is_an_invalid_result(method, result):
    outcome = classify_result(method, result)
    assert isinstance(outcome, Invalid)
    assert outcome.reason


# ---------------------------------------------------------------- results to the legacy client


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
@pytest.mark.parametrize(
    ("method", "payload"),
    [("tools/call", TOOLS_CALL), ("tools/list", {**TOOLS_LIST, **CACHE_HINTS})],
)
def test_results_for_the_legacy_client_validate_for_its_revision(version, method, payload):
    modern = {**payload, **MODERN_ENVELOPE, "_meta": {meta.SERVER_INFO: UPSTREAM_INFO, "com.example/k": 1}}
    out = result_to_downstream(method, modern, version)
    assert server_message_errors(version, jsonrpc.result_response(1, out), method) == []
    for field in ("resultType", "ttlMs", "cacheScope"):
        assert field not in out
    assert out["_meta"] == {"com.example/k": 1}


def test_result_meta_emptied_by_removing_server_info_is_removed():
    out = result_to_downstream("tools/list", {"tools": [], "_meta": {meta.SERVER_INFO: UPSTREAM_INFO}}, LATEST_LEGACY)
    assert out == {"tools": []}


def test_unknown_result_fields_survive_and_the_input_is_untouched():
    modern = {**TOOLS_CALL, **MODERN_ENVELOPE, "_meta": {meta.SERVER_INFO: UPSTREAM_INFO}, "x-new": {"a": [1]}}
    snapshot = copy.deepcopy(modern)
    out = result_to_downstream("tools/call", modern, "2025-06-18")
    assert modern == snapshot
    assert out["x-new"] == {"a": [1]}
    assert out["x-vendor-field"] == TOOLS_CALL["x-vendor-field"]


def test_result_to_downstream_downgrades_for_the_session_revision():
    out = result_to_downstream("tools/call", {**TOOLS_CALL, **MODERN_ENVELOPE}, "2024-11-05")
    assert "structuredContent" not in out
    assert {block["type"] for block in out["content"]} <= {"text", "image", "resource"}


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "error",
    [
        {"code": jsonrpc.INVALID_PARAMS, "message": "Invalid params", "data": {"uri": "file:///missing"}},
        {"code": jsonrpc.INVALID_PARAMS, "message": "Resource not found"},
    ],
)
def test_not_found_on_resources_read_becomes_the_legacy_resource_not_found_code(error):
    snapshot = copy.deepcopy(error)
    out = error_to_downstream("resources/read", error)
    assert out["code"] == jsonrpc.RESOURCE_NOT_FOUND
    assert out["message"] == error["message"]
    assert out.get("data") == error.get("data")
    assert error == snapshot


@pytest.mark.parametrize(
    ("method", "error"),
    [
        ("tools/call", {"code": jsonrpc.INVALID_PARAMS, "message": "Resource not found", "data": {"uri": "x"}}),
        ("resources/read", {"code": jsonrpc.INVALID_PARAMS, "message": "bad cursor"}),
        ("resources/read", {"code": jsonrpc.INTERNAL_ERROR, "message": "not found"}),
        ("tools/call", {"code": jsonrpc.MISSING_REQUIRED_CAPABILITY, "message": "m", "data": {"r": 1}}),
        ("tools/call", {"code": -32000, "message": "custom", "x-extra": True}),
    ],
)
def test_other_errors_pass_through_unchanged(method, error):
    assert error_to_downstream(method, error) == error


# ---------------------------------------------------------------- request-scoped notifications


@pytest.mark.parametrize("threshold_index", range(len(meta.LOG_LEVELS)))
def test_log_messages_reach_the_client_only_at_or_above_its_level(threshold_index):
    threshold = meta.LOG_LEVELS[threshold_index]
    for index, level in enumerate(meta.LOG_LEVELS):
        note = jsonrpc.notification("notifications/message", {"level": level, "data": "x"})
        passed = notification_to_downstream(note, LATEST_LEGACY, threshold)
        assert (passed is not None) is (index >= threshold_index)
        if passed is not None:
            assert passed == note


def test_no_log_messages_reach_a_client_that_set_no_level():
    note = jsonrpc.notification("notifications/message", {"level": "emergency", "data": "x"})
    assert notification_to_downstream(note, LATEST_LEGACY, None) is None


def test_progress_for_2024_11_05_loses_its_message_and_validates():
    note = jsonrpc.notification("notifications/progress", {"progressToken": 1, "progress": 2, "message": "m"})
    snapshot = copy.deepcopy(note)
    out = notification_to_downstream(note, "2024-11-05", None)
    assert out == jsonrpc.notification("notifications/progress", {"progressToken": 1, "progress": 2})
    assert note == snapshot
    assert server_message_errors("2024-11-05", out) == []
    assert notification_to_downstream(note, "2025-03-26", None) == note


def test_other_notifications_pass_unchanged():
    note = {**jsonrpc.notification("notifications/tools/list_changed", {"x": 1}), "x-top": 2}
    assert notification_to_downstream(note, "2024-11-05", None) == note


# ---------------------------------------------------------------- listen → GET stream


def test_strip_subscription_id_removes_only_that_key():
    note = jsonrpc.notification(
        "notifications/resources/updated",
        {"uri": "mem://a", "_meta": {meta.SUBSCRIPTION_ID: 4, "com.example/k": "v"}},
    )
    snapshot = copy.deepcopy(note)
    out = strip_subscription_id(note)
    assert out == jsonrpc.notification(
        "notifications/resources/updated", {"uri": "mem://a", "_meta": {"com.example/k": "v"}}
    )
    assert note == snapshot


def test_strip_subscription_id_drops_meta_and_params_it_leaves_empty():
    note = jsonrpc.notification("notifications/tools/list_changed", {"_meta": {meta.SUBSCRIPTION_ID: "L1"}})
    out = strip_subscription_id(note)
    assert out == jsonrpc.notification("notifications/tools/list_changed")
    assert server_message_errors("2024-11-05", out) == []


@pytest.mark.parametrize(
    "note",
    [
        jsonrpc.notification("notifications/tools/list_changed"),
        jsonrpc.notification("notifications/resources/updated", {"uri": "u"}),
        jsonrpc.notification("notifications/resources/updated", {"uri": "u", "_meta": {}}),
    ],
)
def test_strip_subscription_id_leaves_untagged_notifications_alone(note):
    assert strip_subscription_id(note) == note


@settings(max_examples=150)
@given(
    params=st.dictionaries(st.text(max_size=8).filter(lambda k: k != "_meta"), _json, max_size=4),
    note_meta=st.dictionaries(st.text(max_size=30).filter(lambda k: k != meta.SUBSCRIPTION_ID), _json, max_size=4),
    subscription=st.none() | st.integers() | st.text(max_size=6),
    extra=st.dictionaries(st.sampled_from(["x-a", "x-b"]), _json, max_size=2),
)
def test_strip_subscription_id_property_only_the_subscription_key_goes(params, note_meta, subscription, extra):
    tagged_meta = dict(note_meta)
    if subscription is not None:
        tagged_meta[meta.SUBSCRIPTION_ID] = subscription
    note = {
        "jsonrpc": "2.0",
        "method": "notifications/resources/updated",
        **extra,
        "params": {**params, "_meta": tagged_meta},
    }
    snapshot = copy.deepcopy(note)
    out = strip_subscription_id(note)
    assert note == snapshot
    assert {k: v for k, v in out.items() if k != "params"} == {k: v for k, v in note.items() if k != "params"}
    out_params = out.get("params", {})
    assert {k: v for k, v in out_params.items() if k != "_meta"} == params
    if subscription is None:
        assert out == note
    else:
        assert out_params.get("_meta", {}) == note_meta
        assert "_meta" in out_params or not note_meta


def test_listen_filter_asks_for_list_changes_the_upstream_advertises_and_subscribed_uris():
    caps = DISCOVER["capabilities"]
    notifications = listen_filter(caps, {"mem://b", "mem://a"}, list_changes=True)
    assert notifications == {
        "toolsListChanged": True,
        "resourcesListChanged": True,
        "resourceSubscriptions": ["mem://a", "mem://b"],
    }
    assert errors(LATEST_MODERN, "SubscriptionFilter", notifications) == []
    assert listen_filter(caps, set(), list_changes=False) == {}
    assert listen_filter(None, frozenset({"u"}), list_changes=True) == {"resourceSubscriptions": ["u"]}


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_gap_notifications_ask_the_client_to_refetch_everything_the_filter_covered(version):
    notes = gap_notifications(
        {"toolsListChanged": True, "promptsListChanged": False, "resourceSubscriptions": ["mem://a", "mem://b"]}
    )
    assert [(n["method"], n.get("params")) for n in notes] == [
        ("notifications/tools/list_changed", None),
        ("notifications/resources/updated", {"uri": "mem://a"}),
        ("notifications/resources/updated", {"uri": "mem://b"}),
    ]
    for note in notes:
        assert server_message_errors(version, note) == []


# ---------------------------------------------------------------- input requests (MRTR)

FORM_ELICIT = {
    "method": "elicitation/create",
    "params": {
        "mode": "form",
        "message": "Pick",
        "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
        "task": {"ttl": 5},
    },
}
URL_ELICIT = {
    "method": "elicitation/create",
    "params": {"mode": "url", "message": "Sign in", "url": "https://example.com/login"},
}
SAMPLING = {
    "method": "sampling/createMessage",
    "params": {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 5},
}


@pytest.mark.parametrize("version", ["2025-06-18", "2025-11-25"])
def test_a_form_elicitation_becomes_a_valid_legacy_request_without_task(version):
    caps = modern_client_capabilities({"elicitation": {}}, version)
    method, params = input_request_to_downstream(FORM_ELICIT, version, caps)
    assert method == "elicitation/create"
    assert "task" not in params
    assert ("mode" in params) is (version == "2025-11-25")
    assert server_message_errors(version, jsonrpc.request(1, method, params)) == []


def test_a_url_elicitation_needs_the_url_mode_declared():
    caps = modern_client_capabilities({"elicitation": {"url": {}}}, "2025-11-25")
    _, params = input_request_to_downstream(URL_ELICIT, "2025-11-25", caps)
    assert params["url"] == URL_ELICIT["params"]["url"]
    with pytest.raises(InputRequestRejected):
        input_request_to_downstream(URL_ELICIT, "2025-11-25", {"elicitation": {}})


@pytest.mark.parametrize("version", ["2025-03-26", "2024-11-05"])
def test_elicitation_is_never_sent_to_clients_older_than_2025_06_18(version):
    caps = modern_client_capabilities({"elicitation": {}}, version)
    with pytest.raises(InputRequestRejected):
        input_request_to_downstream(FORM_ELICIT, version, caps)


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_sampling_and_roots_become_valid_legacy_requests_when_declared(version):
    caps = modern_client_capabilities({"sampling": {}, "roots": {"listChanged": True}}, version)
    for request in (SAMPLING, {"method": "roots/list"}):
        method, params = input_request_to_downstream(request, version, caps)
        assert method == request["method"]
        message = jsonrpc.request(1, method, params) if params else jsonrpc.request(1, method)
        assert server_message_errors(version, message) == []


@pytest.mark.parametrize(
    ("request_", "caps"),
    [
        (SAMPLING, {}),
        ({"method": "roots/list"}, {"sampling": {}}),
        ({"method": "sampling/createMessage", "params": {**SAMPLING["params"], "tools": []}}, {"sampling": {}}),
        (
            {"method": "sampling/createMessage", "params": {**SAMPLING["params"], "toolChoice": {"mode": "auto"}}},
            {"sampling": {}},
        ),
        (
            {"method": "sampling/createMessage", "params": {**SAMPLING["params"], "includeContext": "thisServer"}},
            {"sampling": {}},
        ),
        (FORM_ELICIT, {}),
        ({"method": "ping"}, {"roots": {}}),
        ({"method": "tools/call", "params": {}}, {"roots": {}}),
        ("roots/list", {"roots": {}}),
        (None, {"roots": {}}),
    ],
)
def test_input_requests_the_client_never_declared_are_rejected(request_, caps):
    with pytest.raises(InputRequestRejected):
        input_request_to_downstream(request_, LATEST_LEGACY, caps)


def test_sampling_with_tools_is_allowed_when_declared_and_input_requests_are_not_mutated():
    request_ = {"method": "sampling/createMessage", "params": {**SAMPLING["params"], "tools": [], "task": {}}}
    snapshot = copy.deepcopy(request_)
    _, params = input_request_to_downstream(request_, "2025-11-25", {"sampling": {"tools": {}}})
    assert params["tools"] == [] and "task" not in params
    assert request_ == snapshot


def _ask(method: str, params: dict | None = None) -> dict:
    return {"method": method, **({"params": params} if params is not None else {})}


def test_an_answered_input_request_becomes_its_result():
    reply = jsonrpc.result_response(1, {"action": "accept", "content": {"ok": True}})
    asked = _ask("elicitation/create", {"message": "ok?", "requestedSchema": {"type": "object", "properties": {}}})
    assert input_response_from_downstream(asked, reply, "2025-11-25") == {"action": "accept", "content": {"ok": True}}


def test_a_failed_elicitation_reads_as_cancel_and_a_failed_sampling_or_roots_aborts():
    failed = jsonrpc.error_response(1, jsonrpc.INTERNAL_ERROR, "user closed the dialog")
    assert input_response_from_downstream(_ask("elicitation/create", {}), failed, "2025-11-25") == {"action": "cancel"}
    assert input_response_from_downstream(_ask("sampling/createMessage", {}), failed, "2025-11-25") is None
    assert input_response_from_downstream(_ask("roots/list"), failed, "2025-11-25") is None


def test_a_2025_06_18_single_choice_answer_to_a_multi_select_goes_upstream_as_a_list():
    schema = {
        "type": "object",
        "properties": {
            "colors": {"type": "array", "items": {"type": "string", "enum": ["red", "blue"]}},
            "name": {"type": "string"},
        },
    }
    asked = _ask("elicitation/create", {"message": "pick", "requestedSchema": schema})
    reply = jsonrpc.result_response(1, {"action": "accept", "content": {"colors": "red", "name": "Ada"}})
    answer = input_response_from_downstream(asked, reply, "2025-06-18")
    assert answer == {"action": "accept", "content": {"colors": ["red"], "name": "Ada"}}
    # A 2025-11-25 client saw the real multi-select, so its answer is left as it is.
    assert input_response_from_downstream(asked, reply, "2025-11-25") == reply["result"]


# ---------------------------------------------------------------- tools/list screening


def _tool(name: str, schema: dict) -> dict:
    return {"name": name, "inputSchema": schema}


GOOD = _tool("good", {"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}})
PLAIN = _tool("plain", {"type": "object", "properties": {"q": {"type": "string"}}})


@pytest.mark.parametrize("case", sorted(INVALID_SCHEMAS))
def test_screen_tools_withholds_a_tool_with_an_invalid_annotation_and_reports_why(case):
    result = {"tools": [GOOD, _tool("bad", INVALID_SCHEMAS[case]), PLAIN], "nextCursor": "n", **MODERN_ENVELOPE}
    snapshot = copy.deepcopy(result)
    page = screen_tools(result)
    assert [t["name"] for t in page.result["tools"]] == ["good", "plain"]
    assert [name for name, _ in page.rejected] == ["bad"]
    assert all(reason for _, reason in page.rejected)
    assert page.result["nextCursor"] == "n"
    assert result == snapshot


def test_screen_tools_collects_the_headers_of_valid_tools():
    page = screen_tools({"tools": [GOOD, PLAIN]})
    assert page.rejected == []
    assert page.result["tools"] == [GOOD, PLAIN]
    assert page.headers == {"good": (ParamHeader("Region", ("region",), "string"),)}


@pytest.mark.parametrize("result", [{}, {"tools": None}, {"tools": "x"}])
def test_screen_tools_leaves_a_result_without_a_tool_list_alone(result):
    page = screen_tools(result)
    assert page.result == result
    assert page.rejected == [] and page.headers == {}
