"""What the access log and metrics call a POST (proxy/downstream/messages.py)."""

from __future__ import annotations

import pytest

from proxy.downstream.messages import method_of


@pytest.mark.parametrize(
    ("body", "called"),
    [
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {}}, "tools/call"),
        ({"jsonrpc": "2.0", "method": "notifications/initialized"}, "notifications/initialized"),
        ({"jsonrpc": "2.0", "id": 3, "result": {"action": "accept"}}, "response"),
        ({"jsonrpc": "2.0", "id": 4, "error": {"code": -1, "message": "declined"}}, "response"),
        ([{"jsonrpc": "2.0", "id": 1, "method": "ping"}], "batch"),
        ({"jsonrpc": "2.0", "id": 5}, None),
        ("not a message", None),
    ],
    ids=["request", "notification", "result", "error", "batch", "neither", "no-object"],
)
def test_a_clients_answer_is_called_a_response_and_a_body_without_a_method_nothing(body: object, called: object):
    assert method_of(body) == called
