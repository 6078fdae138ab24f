"""The one table of HTTP statuses for JSON-RPC error replies."""

from __future__ import annotations

import pytest

from proxy.protocol import jsonrpc
from proxy.protocol.status import Rejection, http_status, status_of
from proxy.protocol.versions import Era

SPEC_FIXED = [
    (jsonrpc.PARSE_ERROR, 400),
    (jsonrpc.INVALID_REQUEST, 400),
    (jsonrpc.METHOD_NOT_FOUND, 404),
    (jsonrpc.HEADER_MISMATCH, 400),
    (jsonrpc.MISSING_REQUIRED_CAPABILITY, 400),
    (jsonrpc.UNSUPPORTED_PROTOCOL_VERSION, 400),
]


@pytest.mark.parametrize(("code", "status"), SPEC_FIXED)
@pytest.mark.parametrize("refused", [False, True])
def test_a_modern_client_gets_the_status_the_spec_fixes_for_a_code(code, status, refused):
    assert http_status(code, Era.MODERN, refused=refused) == status


def test_invalid_params_is_400_only_when_the_proxy_refused_the_request_before_running_it():
    assert http_status(jsonrpc.INVALID_PARAMS, Era.MODERN, refused=True) == 400
    assert http_status(jsonrpc.INVALID_PARAMS, Era.MODERN) == 200


@pytest.mark.parametrize(
    "code", [jsonrpc.INTERNAL_ERROR, jsonrpc.UPSTREAM_UNAVAILABLE, jsonrpc.LIMIT_EXCEEDED, -32000, 7, "x", None]
)
def test_other_errors_travel_in_a_200_to_a_modern_client(code):
    assert http_status(code, Era.MODERN) == 200


@pytest.mark.parametrize("code", [jsonrpc.METHOD_NOT_FOUND, jsonrpc.HEADER_MISMATCH, jsonrpc.INVALID_PARAMS])
@pytest.mark.parametrize("refused", [False, True])
def test_a_legacy_client_never_gets_a_404_or_400_for_a_code_it_reads_as_transport(code, refused):
    # A legacy client reads HTTP 404 as "session gone" (docs/translation.md §7.10).
    assert http_status(code, Era.LEGACY, refused=refused) == 200


@pytest.mark.parametrize("code", [jsonrpc.PARSE_ERROR, jsonrpc.INVALID_REQUEST])
def test_a_malformed_message_is_400_in_both_eras_when_refused(code):
    assert http_status(code, Era.LEGACY, refused=True) == 400
    assert http_status(code, Era.LEGACY) == 200


def test_a_relayed_reply_has_the_status_of_its_error():
    assert status_of(jsonrpc.error_response(1, jsonrpc.METHOD_NOT_FOUND, "no"), Era.MODERN) == 404
    assert status_of(jsonrpc.error_response(1, jsonrpc.METHOD_NOT_FOUND, "no"), Era.LEGACY) == 200
    assert status_of(jsonrpc.result_response(1, {}), Era.MODERN) == 200


def test_a_rejection_is_a_refusal_and_carries_its_reply():
    rejection = Rejection(jsonrpc.INVALID_PARAMS, "bad", {"x": 1})
    assert rejection.status == 400
    assert rejection.reply(3) == jsonrpc.error_response(3, jsonrpc.INVALID_PARAMS, "bad", {"x": 1})
    assert Rejection(jsonrpc.METHOD_NOT_FOUND, "no").status == 404
