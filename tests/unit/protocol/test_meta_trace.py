"""Trace context travels both ways between HTTP headers and the request `_meta`."""

from __future__ import annotations

from proxy.protocol import jsonrpc, meta

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_trace_headers_are_copied_into_meta_and_the_original_message_is_left_alone():
    message = jsonrpc.request(1, "tools/call", {"name": "x", "_meta": {"progressToken": 5}})
    headers = {"traceparent": PARENT, "tracestate": "a=b", "Authorization": "Bearer t"}
    out = meta.carry_trace(message, headers)
    assert out["params"]["_meta"] == {"progressToken": 5, "traceparent": PARENT, "tracestate": "a=b"}
    assert "traceparent" not in message["params"]["_meta"]
    assert "Authorization" not in out["params"]["_meta"]


def test_trace_in_meta_becomes_headers_without_overriding_existing_ones():
    message = jsonrpc.request(1, "tools/list", {"_meta": {"traceparent": PARENT, "baggage": "k=v"}})
    headers = {"Baggage": "mine=1"}
    out = meta.carry_trace(message, headers)
    assert headers == {"Baggage": "mine=1", "traceparent": PARENT}
    assert out["params"]["_meta"]["baggage"] == "k=v"


def test_a_message_without_params_gets_them_only_when_there_is_trace_to_carry():
    assert meta.carry_trace(jsonrpc.request(1, "ping"), {}) == jsonrpc.request(1, "ping")
    out = meta.carry_trace(jsonrpc.request(1, "ping"), {"traceparent": PARENT})
    assert out["params"] == {"_meta": {"traceparent": PARENT}}


def test_with_meta_adds_one_key_to_a_copy_and_keeps_every_other_field():
    params = {"uri": "file:///a", "_meta": {"progressToken": 5, "com.example/x": 1}, "extra": [1]}
    out = meta.with_meta(params, meta.SUBSCRIPTION_ID, 7)
    assert out == {
        "uri": "file:///a",
        "_meta": {"progressToken": 5, "com.example/x": 1, meta.SUBSCRIPTION_ID: 7},
        "extra": [1],
    }
    assert params["_meta"] == {"progressToken": 5, "com.example/x": 1}
    assert meta.with_meta(None, "k", "v") == {"_meta": {"k": "v"}}
    assert meta.with_meta({"_meta": "not a dict"}, "k", "v") == {"_meta": {"k": "v"}}


def test_trace_in_meta_becomes_headers_when_there_are_none_yet_and_the_message_is_left_as_it_is():
    message = jsonrpc.request(1, "tools/list", {"_meta": {"traceparent": PARENT, "tracestate": 7, "other": "x"}})
    headers: dict[str, str] = {}
    assert meta.carry_trace(message, headers) is message
    assert headers == {"traceparent": PARENT}  # a value that is no string is not a header
    plain = jsonrpc.request(2, "tools/list", {"_meta": {"other": "x"}})
    untouched: dict[str, str] = {}
    assert meta.carry_trace(plain, untouched) is plain and untouched == {}


def test_a_requests_trace_context_is_told_from_its_credentials_in_any_case():
    headers = {"TraceParent": PARENT, "Authorization": "Bearer t", "baggage": "k=v"}
    assert meta.trace_of(headers) == {"TraceParent": PARENT, "baggage": "k=v"}
    assert meta.without_trace(headers) == {"Authorization": "Bearer t"}
    # None given, none found: each a dict of its own, which a caller may fill.
    empty: dict[str, str] = {}
    trace, rest = meta.trace_of(empty), meta.without_trace(empty)
    assert trace == rest == {} and trace is not empty and rest is not empty and trace is not rest
