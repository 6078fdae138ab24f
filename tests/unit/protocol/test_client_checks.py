"""What the proxy refuses in any client message (proxy/protocol/client_checks.py, docs/translation.md §7.24)."""

from __future__ import annotations

import json

import pytest

from proxy.protocol import jsonrpc
from proxy.protocol.client_checks import DEFAULT_MAX_DEPTH, depth_rejection, message_problem, too_deep


def nested(depth: int) -> object:
    """Objects and arrays nested `depth` levels deep, the outermost counting as one."""
    value: object = {}
    for level in range(depth - 1):
        value = [value] if level % 2 else {"a": value}
    return value


@pytest.mark.parametrize("depth", [1, 2, 10, DEFAULT_MAX_DEPTH])
def test_json_up_to_the_limit_is_not_too_deep(depth: int) -> None:
    value = nested(depth)
    assert not too_deep(value, DEFAULT_MAX_DEPTH)
    assert not too_deep(value, DEFAULT_MAX_DEPTH, json.dumps(value).encode())


@pytest.mark.parametrize("depth", [DEFAULT_MAX_DEPTH + 1, 300, 100_000])
def test_json_beyond_the_limit_is_too_deep_however_deep_it_goes(depth: int) -> None:
    value = nested(depth)
    assert too_deep(value, DEFAULT_MAX_DEPTH)  # iterative: no RecursionError at any depth


def test_depth_counts_the_deepest_branch_not_the_number_of_containers() -> None:
    wide = {"items": [{"k": [1, 2]} for _ in range(1000)]}  # 3003 containers, 4 levels
    raw = json.dumps(wide).encode()
    assert not too_deep(wide, 4, raw)
    assert too_deep(wide, 3, raw)


def test_scalars_are_never_too_deep() -> None:
    for value in ("text", 1, None, 1.5, True):
        assert not too_deep(value, 1)


def test_brackets_inside_strings_only_make_the_walk_happen_never_a_refusal() -> None:
    value = {"text": "[[[[[[[[[[{{{{{{{{{{"}
    assert not too_deep(value, 2, json.dumps(value).encode())


def test_the_depth_refusal_is_invalid_request_naming_the_limit() -> None:
    rejection = depth_rejection(64)
    assert rejection.code == jsonrpc.INVALID_REQUEST and "64" in rejection.message
    assert rejection.status == 400


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t", "arguments": {"x": {}}}},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"arguments": {}}},  # absent: the server's call
        {"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": "file:///a"}},
        {"jsonrpc": "2.0", "id": 1, "method": "vendor/x", "params": {"name": {}}},  # not a known name field
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "r-1"}},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7, "reason": "x"}},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 1, "method": "wéird/méthod\u00a0name"},  # unusual, but a header can carry it
        {"jsonrpc": "2.0", "id": 1, "result": {"name": {}}},  # a response: not the proxy's to judge
    ],
)
def test_well_formed_messages_have_no_problem(message: jsonrpc.JSONDict) -> None:
    assert message_problem(message) is None


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/li\x01st"}, jsonrpc.INVALID_REQUEST),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/list\r\nX-Injected: 1"}, jsonrpc.INVALID_REQUEST),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/list\x7f"}, jsonrpc.INVALID_REQUEST),
        ({"jsonrpc": "2.0", "method": "notifications/\x00"}, jsonrpc.INVALID_REQUEST),
        # Looked for in any name but a known one (tools/call is): this one only starts like it.
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call\n", "params": {"name": "t"}}, jsonrpc.INVALID_REQUEST),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": {}}}, jsonrpc.INVALID_PARAMS),
        ({"jsonrpc": "2.0", "id": 1, "method": "prompts/get", "params": {"name": ["a"]}}, jsonrpc.INVALID_PARAMS),
        ({"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": 5}}, jsonrpc.INVALID_PARAMS),
        ({"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe", "params": {"uri": {}}}, jsonrpc.INVALID_PARAMS),
        (
            {"jsonrpc": "2.0", "id": 1, "method": "resources/unsubscribe", "params": {"uri": None}},
            jsonrpc.INVALID_PARAMS,
        ),
        ({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": {}}}, jsonrpc.INVALID_PARAMS),
        ({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": [1]}}, jsonrpc.INVALID_PARAMS),
        (
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": True}},
            jsonrpc.INVALID_PARAMS,
        ),
        ({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1.5}}, jsonrpc.INVALID_PARAMS),
    ],
)
def test_what_no_relay_can_carry_is_refused_with_its_code(message: jsonrpc.JSONDict, code: int) -> None:
    problem = message_problem(message)
    assert problem is not None and problem.code == code
    assert problem.status == 400
