"""Which era an upstream speaks, from its answer to the server/discover probe
(proxy/protocol/detection.py; docs/translation.md §1.3-1.4)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.protocol import jsonrpc, meta
from proxy.protocol.detection import Detected, era_from_reply, names_modern_versions, probe_request
from proxy.protocol.versions import LATEST_LEGACY, LATEST_MODERN, LEGACY_VERSIONS, MODERN_VERSIONS, Era

UNKNOWN_VERSION = "2099-01-01"
PROBE_ID = "probe-1"


def discover_result(versions: list[Any]) -> dict[str, Any]:
    return {"resultType": "complete", "supportedVersions": versions, "capabilities": {}}


def error_reply(code: int, message: str = "refused", data: Any = None, request_id: Any = PROBE_ID) -> dict[str, Any]:
    return jsonrpc.error_response(request_id, code, message, data)


# ---------------------------------------------------------------- the probe


def test_the_probe_is_a_server_discover_request_carrying_the_modern_envelope():
    probe = probe_request(PROBE_ID)
    assert jsonrpc.kind(probe) == "request"
    assert probe["id"] == PROBE_ID
    assert probe["method"] == "server/discover"
    envelope = probe["params"]["_meta"]
    assert envelope[meta.PROTOCOL_VERSION] == LATEST_MODERN
    assert envelope[meta.CLIENT_CAPABILITIES] == {}
    assert isinstance(envelope[meta.CLIENT_INFO]["name"], str) and envelope[meta.CLIENT_INFO]["name"]
    assert isinstance(envelope[meta.CLIENT_INFO]["version"], str) and envelope[meta.CLIENT_INFO]["version"]


def test_the_probe_carries_the_version_it_is_asked_to_offer():
    version = MODERN_VERSIONS[-1]
    assert probe_request(7, version)["params"]["_meta"][meta.PROTOCOL_VERSION] == version
    assert probe_request(7, version)["id"] == 7


# ---------------------------------------------------------------- modern answers


def test_a_discover_result_means_modern_speaking_the_newest_shared_version():
    reply = jsonrpc.result_response(PROBE_ID, discover_result([*LEGACY_VERSIONS, LATEST_MODERN, UNKNOWN_VERSION]))
    assert era_from_reply(reply) == Detected(Era.MODERN, LATEST_MODERN)


def test_a_discover_result_without_a_shared_version_is_still_modern_with_no_version_to_speak():
    reply = jsonrpc.result_response(PROBE_ID, discover_result([UNKNOWN_VERSION]))
    assert era_from_reply(reply) == Detected(Era.MODERN, None)


def test_an_unsupported_version_error_listing_a_modern_version_means_modern_with_that_version():
    reply = error_reply(
        jsonrpc.UNSUPPORTED_PROTOCOL_VERSION, data={"supported": [UNKNOWN_VERSION, LATEST_MODERN], "requested": "x"}
    )
    assert era_from_reply(reply) == Detected(Era.MODERN, LATEST_MODERN)


def test_an_unsupported_version_error_listing_only_unknown_versions_still_means_modern():
    reply = error_reply(jsonrpc.UNSUPPORTED_PROTOCOL_VERSION, data={"supported": [UNKNOWN_VERSION]})
    assert era_from_reply(reply).era is Era.MODERN


def test_a_header_mismatch_error_means_modern():
    assert era_from_reply(error_reply(jsonrpc.HEADER_MISMATCH, "Mcp-Method does not match")).era is Era.MODERN


def test_a_missing_capability_error_naming_the_required_capabilities_means_modern():
    reply = error_reply(jsonrpc.MISSING_REQUIRED_CAPABILITY, data={"requiredCapabilities": {"sampling": {}}})
    assert era_from_reply(reply).era is Era.MODERN


# ---------------------------------------------------------------- legacy answers


LEGACY_REPLIES = [
    pytest.param(
        error_reply(
            jsonrpc.INVALID_PARAMS,
            "Unsupported protocol version",
            {"supported": [LATEST_LEGACY], "requested": LATEST_MODERN},
        ),
        id="invalid-params-naming-legacy-versions",
    ),
    pytest.param(error_reply(jsonrpc.INVALID_PARAMS, "Invalid params"), id="invalid-params"),
    pytest.param(error_reply(jsonrpc.METHOD_NOT_FOUND, "Method not found"), id="method-not-found"),
    pytest.param(error_reply(-32000, "Server not initialized"), id="server-not-initialized"),
    pytest.param(error_reply(jsonrpc.INTERNAL_ERROR, "boom"), id="internal-error"),
    pytest.param(error_reply(jsonrpc.PARSE_ERROR, "Parse error", request_id=None), id="parse-error-id-null"),
    pytest.param(
        error_reply(jsonrpc.INVALID_REQUEST, "Invalid request", request_id=None), id="invalid-request-id-null"
    ),
    pytest.param({"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": "x"}}, id="explicit-null-id"),
    pytest.param(error_reply(jsonrpc.UNSUPPORTED_PROTOCOL_VERSION), id="unsupported-version-without-data"),
    pytest.param(
        error_reply(jsonrpc.UNSUPPORTED_PROTOCOL_VERSION, data={"supported": LATEST_MODERN}),
        id="unsupported-version-supported-not-a-list",
    ),
    pytest.param(error_reply(jsonrpc.MISSING_REQUIRED_CAPABILITY), id="missing-capability-without-data"),
    pytest.param(
        error_reply(jsonrpc.MISSING_REQUIRED_CAPABILITY, data={"other": 1}), id="missing-capability-other-data"
    ),
    pytest.param({"jsonrpc": "2.0", "id": PROBE_ID, "error": "not an object"}, id="error-not-an-object"),
    pytest.param(jsonrpc.result_response(PROBE_ID, {}), id="empty-result"),
    pytest.param(jsonrpc.result_response(PROBE_ID, {"protocolVersion": LATEST_LEGACY}), id="result-without-versions"),
    pytest.param(
        jsonrpc.result_response(PROBE_ID, {"supportedVersions": LATEST_MODERN}), id="supported-versions-not-a-list"
    ),
    pytest.param({"jsonrpc": "2.0", "id": PROBE_ID, "result": [LATEST_MODERN]}, id="result-not-an-object"),
    pytest.param({}, id="empty-object"),
    pytest.param([jsonrpc.result_response(PROBE_ID, discover_result([LATEST_MODERN]))], id="batch-array"),
    pytest.param("not json-rpc", id="string"),
    pytest.param(42, id="number"),
    pytest.param(None, id="no-reply"),
]


@pytest.mark.parametrize("reply", LEGACY_REPLIES)
def test_anything_but_a_discover_result_or_a_recognized_modern_error_means_legacy(reply):
    assert era_from_reply(reply) == Detected(Era.LEGACY, None, answered=reply is not None)


@pytest.mark.parametrize("code", [-32700, -32600, -32601, -32602, -32603, -32000, -32002, -32099, -1, 0, 1, 404])
def test_the_legacy_fallback_does_not_hinge_on_one_error_code(code):
    assert era_from_reply(error_reply(code, "some legacy refusal")).era is Era.LEGACY


# ---------------------------------------------------------------- names_modern_versions


def test_an_initialize_error_listing_a_modern_version_names_modern_versions():
    error = jsonrpc.error_object(jsonrpc.INVALID_PARAMS, "Unsupported protocol version", {"supported": [LATEST_MODERN]})
    assert names_modern_versions(error)


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(
            jsonrpc.error_object(jsonrpc.INVALID_PARAMS, "x", {"supported": list(LEGACY_VERSIONS)}), id="legacy-only"
        ),
        pytest.param(jsonrpc.error_object(jsonrpc.INVALID_PARAMS, "x", {"supported": [UNKNOWN_VERSION]}), id="unknown"),
        pytest.param(jsonrpc.error_object(jsonrpc.INVALID_PARAMS, "x", {"supported": []}), id="empty-list"),
        pytest.param(jsonrpc.error_object(jsonrpc.INVALID_PARAMS, "x", {"supported": LATEST_MODERN}), id="not-a-list"),
        pytest.param(jsonrpc.error_object(jsonrpc.INVALID_PARAMS, "x", [LATEST_MODERN]), id="data-not-an-object"),
        pytest.param(jsonrpc.error_object(jsonrpc.INVALID_PARAMS, "x"), id="no-data"),
        pytest.param(None, id="none"),
        pytest.param(LATEST_MODERN, id="string"),
    ],
)
def test_an_error_without_a_modern_version_in_its_supported_list_does_not_name_modern_versions(error):
    assert not names_modern_versions(error)
