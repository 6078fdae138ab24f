"""The POST classification ladder of docs/translation.md §1.1 (proxy/protocol/classify.py)."""

from __future__ import annotations

import pytest

from proxy.protocol import jsonrpc, meta
from proxy.protocol.classify import SESSIONLESS, Rejection, Route, classify_post
from proxy.protocol.versions import LATEST_LEGACY, LATEST_MODERN, LEGACY_VERSIONS

SESSION = "sid-1"


def _modern(method: str = "tools/list") -> dict:
    return jsonrpc.request(1, method, {"_meta": {meta.PROTOCOL_VERSION: LATEST_MODERN, meta.CLIENT_CAPABILITIES: {}}})


def test_a_batch_inside_a_session_is_a_legacy_batch():
    body = [jsonrpc.request(1, "ping"), jsonrpc.notification("notifications/initialized")]
    assert classify_post(body, SESSION, None) is Route.LEGACY_BATCH


def test_an_empty_batch_is_rejected_as_an_invalid_request():
    assert classify_post([], SESSION, None) == Rejection(jsonrpc.INVALID_REQUEST, "empty batch")


def test_a_batch_without_a_session_is_rejected():
    rejection = classify_post([jsonrpc.request(1, "ping")], None, None)
    assert isinstance(rejection, Rejection)
    assert (rejection.status, rejection.code) == (400, jsonrpc.INVALID_REQUEST)


@pytest.mark.parametrize("session_id", [None, SESSION])
@pytest.mark.parametrize("header", [None, *LEGACY_VERSIONS])
def test_initialize_without_modern_markers_starts_a_legacy_handshake(session_id, header):
    body = jsonrpc.request(1, "initialize", {"protocolVersion": LATEST_LEGACY, "capabilities": {}})
    assert classify_post(body, session_id, header) is Route.LEGACY_INITIALIZE


def test_initialize_carrying_the_reserved_protocol_version_key_is_a_modern_request():
    # Legacy clients never set the reserved key; a modern server answers `initialize` with -32601.
    body = jsonrpc.request(
        1, "initialize", {"_meta": {meta.PROTOCOL_VERSION: LATEST_MODERN}, "protocolVersion": LATEST_LEGACY}
    )
    assert classify_post(body, None, None) is Route.MODERN


def test_initialize_under_a_modern_version_header_without_meta_is_missing_required_metadata():
    body = jsonrpc.request(1, "initialize", {"protocolVersion": LATEST_LEGACY, "capabilities": {}})
    rejection = classify_post(body, None, LATEST_MODERN)
    assert isinstance(rejection, Rejection)
    assert (rejection.status, rejection.code) == (400, jsonrpc.INVALID_PARAMS)


@pytest.mark.parametrize("session_id", [None, SESSION])
@pytest.mark.parametrize("header", [None, LATEST_MODERN, LATEST_LEGACY])
def test_a_protocol_version_in_meta_makes_the_request_modern_even_with_a_stray_session_header(session_id, header):
    assert classify_post(_modern(), session_id, header) is Route.MODERN


def test_an_unsupported_version_in_meta_is_still_routed_as_modern_for_the_modern_pipeline():
    body = jsonrpc.request(1, "tools/list", {"_meta": {meta.PROTOCOL_VERSION: "2099-01-01"}})
    assert classify_post(body, None, None) is Route.MODERN


@pytest.mark.parametrize(
    "body",
    [
        jsonrpc.request(2, "tools/list"),
        jsonrpc.notification("notifications/initialized"),
        jsonrpc.result_response(5, {"action": "accept"}),
        jsonrpc.request(2, "tools/list", {"_meta": {"progressToken": 1}}),
    ],
)
@pytest.mark.parametrize("header", [None, *LEGACY_VERSIONS])
def test_messages_with_a_session_header_and_no_modern_meta_belong_to_that_legacy_session(body, header):
    assert classify_post(body, SESSION, header) is Route.LEGACY_SESSION


def test_a_modern_version_header_without_meta_is_missing_required_metadata():
    rejection = classify_post(jsonrpc.request(1, "tools/list", {}), None, LATEST_MODERN)
    assert isinstance(rejection, Rejection)
    assert (rejection.status, rejection.code) == (400, jsonrpc.INVALID_PARAMS)
    assert meta.PROTOCOL_VERSION in rejection.message


@pytest.mark.parametrize("header", [None, LATEST_LEGACY, "2099-01-01"])
@pytest.mark.parametrize(
    "body",
    [
        jsonrpc.request(1, "tools/list"),
        jsonrpc.request(1, "tools/list", {"_meta": "not an object"}),
        jsonrpc.request(1, "tools/list", {"_meta": {meta.CLIENT_CAPABILITIES: {}}}),
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [{"_meta": {meta.PROTOCOL_VERSION: "x"}}]},
        jsonrpc.notification("notifications/initialized"),
    ],
)
def test_anything_else_without_a_session_is_sessionless_legacy(body, header):
    # Refused with SESSIONLESS unless the upstream is a legacy HTTP server relayed byte for byte
    # (proxy/downstream/http.py): a server that hands out no session id takes it.
    assert classify_post(body, None, header) is Route.LEGACY_SESSIONLESS
    assert (SESSIONLESS.status, SESSIONLESS.code) == (400, jsonrpc.INVALID_REQUEST)
    assert "Mcp-Session-Id" in SESSIONLESS.message


@pytest.mark.parametrize("body", ["text", 3, None, True])
def test_a_body_that_is_neither_object_nor_array_is_rejected(body):
    rejection = classify_post(body, SESSION, None)
    assert isinstance(rejection, Rejection)
    assert (rejection.status, rejection.code) == (400, jsonrpc.INVALID_REQUEST)


def test_classification_does_not_change_the_body():
    body = _modern()
    snapshot = jsonrpc.decode(jsonrpc.encode(body))
    classify_post(body, SESSION, LATEST_MODERN)
    assert body == snapshot


@pytest.mark.parametrize(
    "body",
    [
        jsonrpc.notification("notifications/initialized"),
        jsonrpc.notification("notifications/cancelled", {"requestId": 1, "reason": "user"}),
        jsonrpc.notification("notifications/progress", {"progressToken": 1, "progress": 1}),
    ],
)
def test_a_notification_under_a_modern_version_header_is_modern_without_meta(body):
    assert classify_post(body, None, LATEST_MODERN) is Route.MODERN
