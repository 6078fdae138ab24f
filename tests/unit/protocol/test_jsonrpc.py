"""JSON-RPC envelope: codec, message kinds and builders (proxy/protocol/jsonrpc.py)."""

from __future__ import annotations

import json

import orjson
import pytest

from proxy.protocol import jsonrpc
from proxy.protocol.versions import LATEST_MODERN, LEGACY_VERSIONS, Era, era_of
from tests.support.schema import errors


def test_decode_reads_bytes_and_text_alike():
    assert jsonrpc.decode(b'{"jsonrpc":"2.0","id":1,"method":"ping"}') == jsonrpc.decode(
        '{"jsonrpc":"2.0","id":1,"method":"ping"}'
    )
    assert jsonrpc.decode(b'{"a":[1,"x",null,true]}') == {"a": [1, "x", None, True]}


@pytest.mark.parametrize("raw", [b"", b"{", b"not json", b'{"a":1,}', b"NaN", b"\xff\xfe"])
def test_decode_raises_decode_error_which_is_a_value_error_for_non_json(raw):
    with pytest.raises(jsonrpc.DecodeError):
        jsonrpc.decode(raw)
    assert issubclass(jsonrpc.DecodeError, ValueError)


@pytest.mark.parametrize("digits", [b"", b"12345678901234567890"], ids=["fast-codec", "exact-codec"])
def test_json_nested_deeper_than_a_decoder_goes_is_too_deep_not_unreadable(digits: bytes) -> None:
    """Valid JSON all the same: the edges refuse it as too deep (-32600), not as a parse error."""
    deep = b'{"jsonrpc": "2.0", "id": 1, "n": ' + (digits or b"0") + b', "params": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    with pytest.raises(jsonrpc.TooDeep):
        jsonrpc.decode(deep)
    assert issubclass(jsonrpc.TooDeep, jsonrpc.DecodeError)
    assert jsonrpc.decode(b"[" * 1000 + b"]" * 1000) is not None  # within orjson's 1024 levels


def test_the_depth_where_a_decoder_stopped_counts_brackets_outside_strings_only() -> None:
    # Brackets and escaped quotes inside strings open nothing; the decoder's own message for its
    # limit differs between its releases, so only the depth decides.
    strings = b'{"a": "[[{\\"[", "b": ' + b"[" * 1100 + b"]" * 1100 + b"}"
    with pytest.raises(jsonrpc.TooDeep):
        jsonrpc.decode(strings)
    broken = b'{"a": "' + b"[" * 2000 + b'", "b": [}'  # unreadable, not deep: the brackets are a string
    with pytest.raises(jsonrpc.DecodeError) as refused:
        jsonrpc.decode(broken)
    assert not isinstance(refused.value, jsonrpc.TooDeep)


def test_encode_then_decode_gives_back_the_same_message_with_unknown_fields():
    message = {
        "jsonrpc": "2.0",
        "id": "abc",
        "method": "tools/call",
        "params": {"name": "t", "x-vendor": {"nested": [1.5, "é", None]}},
        "extension-field": True,
    }
    assert jsonrpc.decode(jsonrpc.encode(message)) == message


def test_integers_beyond_64_bits_survive_a_decode_encode_round_trip():
    # Pass-through data must not be corrupted: JSON has no integer range limit.
    raw = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"n":123456789012345678901234567890}}'
    decoded = jsonrpc.decode(raw)
    assert decoded["params"]["n"] == 123456789012345678901234567890
    assert jsonrpc.decode(jsonrpc.encode(decoded)) == decoded


LONG = b"12345678901234567890123"  # 23 digits: the message goes through the exact (stdlib) codec


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b'{"n":' + LONG + b',"x":NaN}', id="nan"),
        pytest.param(b'{"n":' + LONG + b',"x":Infinity}', id="infinity"),
        pytest.param(b'{"n":' + LONG + b',"x":-Infinity}', id="minus-infinity"),
        pytest.param(b'{"n":' + LONG + b',"x":1e400}', id="float-overflowing-to-infinity"),
        pytest.param(b'{"n":' + LONG + b',"x":"\xff"}', id="invalid-utf8"),
        pytest.param(b'{"n":' + LONG + b',"x":"\xed\xa0\x80"}', id="utf8-encoded-surrogate"),
        pytest.param(b"\xef\xbb\xbf" + b'{"n":' + LONG + b"}", id="utf8-bom"),
        # Ten U+3031 are twenty digit bytes in UTF-16, which json.loads would detect and decode.
        pytest.param(('{"x":"' + "\u3031" * 10 + '"}').encode("utf-16"), id="utf16"),
        pytest.param(b'{"n":' + LONG + b',"x":"\\ud800"}', id="lone-high-surrogate"),
        pytest.param(b'{"n":' + LONG + b',"x":"\\udfff!"}', id="lone-low-surrogate"),
        pytest.param(b'{"n":' + LONG + b',"\\ud800":1}', id="lone-surrogate-in-a-member-name"),
        pytest.param(b'{"n":' + LONG + b',"x":[' + b"[" * 5000 + b"]" * 5000 + b"]}", id="nested-beyond-recursion"),
    ],
)
def test_the_exact_codec_for_long_numbers_is_as_strict_as_orjson(raw):
    """A run of 20 digits must not make the proxy accept what it refuses otherwise."""
    with pytest.raises(jsonrpc.DecodeError):
        jsonrpc.decode(raw)
    without_long_number = raw.replace(LONG, b"1")
    with pytest.raises(jsonrpc.DecodeError):
        jsonrpc.decode(without_long_number)


def test_the_exact_codec_keeps_floats_valid_surrogate_pairs_and_escaped_backslashes():
    raw = b'{"n":' + LONG + b',"f":-1.5e3,"pairs":["\\ud83d\\ude00"],"text":"\\\\ud800"}'
    decoded = jsonrpc.decode(raw)
    assert decoded == {"n": 12345678901234567890123, "f": -1500.0, "pairs": ["\U0001f600"], "text": "\\ud800"}


def test_text_that_is_not_valid_unicode_is_a_decode_error():
    with pytest.raises(jsonrpc.DecodeError):
        jsonrpc.decode('{"x":"\ud800"}')


def test_canonical_sorts_member_names_at_every_depth_exactly_as_orjson_does():
    value = {"b": 1, "a": {"d": [1, {"z": 0, "y": "é"}], "c": None}}
    assert jsonrpc.canonical(value) == orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    assert jsonrpc.canonical({"a": 1, "b": {"c": 2, "d": 3}}) == jsonrpc.canonical({"b": {"d": 3, "c": 2}, "a": 1})


@pytest.mark.parametrize(
    "value",
    [
        pytest.param({"b": 123456789012345678901234567890, "a": [1]}, id="integer-beyond-64-bits"),
        pytest.param({"b": json.loads("[" * 300 + "]" * 300), "a": 1}, id="nested-beyond-254"),
    ],
)
def test_canonical_writes_what_orjson_cannot_and_always_the_same_way(value):
    written = jsonrpc.canonical(value)
    assert json.loads(written) == value
    assert jsonrpc.canonical(dict(reversed(list(value.items())))) == written


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"jsonrpc": "2.0", "id": 1, "method": "ping"}, "request"),
        ({"jsonrpc": "2.0", "id": "s-1", "method": "tools/list", "params": {}}, "request"),
        ({"jsonrpc": "2.0", "id": 0, "method": "ping"}, "request"),
        ({"jsonrpc": "2.0", "method": "notifications/initialized"}, "notification"),
        ({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}, "notification"),
        ({"jsonrpc": "2.0", "id": 1, "result": {}}, "response"),
        ({"jsonrpc": "2.0", "id": "x", "error": {"code": -32601, "message": "nope"}}, "response"),
        ({"jsonrpc": "2.0", "id": 1, "error": {"code": -1, "message": "m", "data": [1]}}, "response"),
    ],
)
def test_kind_recognises_requests_notifications_and_responses(message, expected):
    assert jsonrpc.kind(message) == expected


@pytest.mark.parametrize(
    "message",
    [
        [],
        "text",
        None,
        {"id": 1, "method": "ping"},  # no jsonrpc member
        {"jsonrpc": "1.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "id": 1, "method": 5},
        {"jsonrpc": "2.0", "id": 1, "method": "x", "params": [1, 2]},  # MCP params are objects
        {"jsonrpc": "2.0", "id": 1, "method": "x", "params": "p"},
        {"jsonrpc": "2.0", "id": None, "method": "ping"},  # id null on a request
        {"jsonrpc": "2.0", "id": True, "method": "ping"},
        {"jsonrpc": "2.0", "id": 1.5, "method": "ping"},
        {"jsonrpc": "2.0", "id": [1], "method": "ping"},
        {"jsonrpc": "2.0", "id": 1, "result": {}, "error": {"code": 1, "message": "m"}},
        {"jsonrpc": "2.0", "id": 1},
        {"jsonrpc": "2.0", "id": 1, "error": {"message": "no code"}},
        {"jsonrpc": "2.0", "id": 1, "error": {"code": "1", "message": "m"}},
        {"jsonrpc": "2.0", "id": 1, "error": {"code": True, "message": "m"}},
        {"jsonrpc": "2.0", "id": 1, "error": {"code": 1}},
        {"jsonrpc": "2.0", "id": 1, "error": "boom"},
    ],
)
def test_kind_calls_everything_else_invalid(message):
    assert jsonrpc.kind(message) == "invalid"


def test_an_error_response_without_id_is_a_response():
    # The id may be omitted when the request id was unreadable (2026-07-28 basic/index §Error
    # Responses); jsonrpc.error_response(None, ...) builds exactly that message.
    reply = jsonrpc.error_response(None, jsonrpc.PARSE_ERROR, "Parse error")
    assert "id" not in reply
    assert errors(LATEST_MODERN, "JSONRPCErrorResponse", reply) == []
    assert jsonrpc.kind(reply) == "response"


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (0, True),
        (-3, True),
        ("", True),
        ("a", True),
        (True, False),
        (False, False),
        (1.0, False),
        (None, False),
        ({}, False),
    ],
)
def test_request_ids_are_strings_or_integers_but_never_booleans_or_floats(value, ok):
    assert jsonrpc.is_request_id(value) is ok


class _Int(int):
    pass


class _Str(str):
    pass


def test_subclasses_of_int_and_str_are_ids_too_where_the_exact_types_are_checked_first():
    """kind and id_of try the exact types decoded JSON gives, then the full check."""
    for request_id in (_Int(3), _Str("a")):
        assert jsonrpc.is_request_id(request_id)
        assert jsonrpc.kind({"jsonrpc": "2.0", "id": request_id, "method": "ping"}) == "request"
        assert jsonrpc.kind({"jsonrpc": "2.0", "id": request_id, "result": {}}) == "response"
        assert jsonrpc.id_of({"id": request_id}) == request_id
    assert jsonrpc.kind({"jsonrpc": "2.0", "id": 1, "error": {"code": _Int(-1), "message": "m"}}) == "response"
    assert jsonrpc.kind({"jsonrpc": "2.0", "id": False, "result": {}}) == "invalid"
    assert jsonrpc.kind({"jsonrpc": "2.0", "id": 1.0, "error": {"code": -1, "message": "m"}}) == "invalid"
    assert jsonrpc.kind({"jsonrpc": "2.0", "id": None, "error": {"code": -1, "message": "m"}}) == "response"


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"jsonrpc": "2.0", "id": 7, "method": "x"}, 7),
        ({"jsonrpc": "2.0", "id": "7", "method": "x"}, "7"),
        ({"jsonrpc": "2.0", "id": True, "method": "x"}, None),
        ({"jsonrpc": "2.0", "id": None}, None),
        ({"jsonrpc": "2.0", "method": "x"}, None),
        ([{"id": 1}], None),
        ("x", None),
    ],
)
def test_id_of_returns_only_a_readable_request_id(message, expected):
    assert jsonrpc.id_of(message) == expected


def test_error_response_carries_id_code_message_and_data_only_when_given():
    assert jsonrpc.error_response(4, jsonrpc.INVALID_PARAMS, "bad") == {
        "jsonrpc": "2.0",
        "id": 4,
        "error": {"code": jsonrpc.INVALID_PARAMS, "message": "bad"},
    }
    with_data = jsonrpc.error_response("r", jsonrpc.UNSUPPORTED_PROTOCOL_VERSION, "v", {"supported": ["x"]})
    assert with_data["error"]["data"] == {"supported": ["x"]}
    assert with_data["id"] == "r"
    # Falsy data other than None is still data.
    assert jsonrpc.error_object(jsonrpc.INTERNAL_ERROR, "m", 0) == {
        "code": jsonrpc.INTERNAL_ERROR,
        "message": "m",
        "data": 0,
    }


def test_builders_produce_messages_of_the_kind_they_name():
    assert jsonrpc.kind(jsonrpc.request(1, "ping")) == "request"
    assert jsonrpc.kind(jsonrpc.request("a", "tools/list", {"cursor": "c"})) == "request"
    assert jsonrpc.kind(jsonrpc.notification("notifications/tools/list_changed")) == "notification"
    assert jsonrpc.kind(jsonrpc.result_response(3, {})) == "response"
    assert jsonrpc.kind(jsonrpc.error_response(3, jsonrpc.METHOD_NOT_FOUND, "m")) == "response"


def test_request_and_notification_omit_params_only_when_none_is_given():
    assert "params" not in jsonrpc.request(1, "ping")
    assert jsonrpc.request(1, "ping", {})["params"] == {}
    assert "params" not in jsonrpc.notification("notifications/initialized")
    assert jsonrpc.notification("n", {"a": 1}) == {"jsonrpc": "2.0", "method": "n", "params": {"a": 1}}
    assert jsonrpc.result_response("q", {"x": 1}) == {"jsonrpc": "2.0", "id": "q", "result": {"x": 1}}


@pytest.mark.parametrize("revision", [*LEGACY_VERSIONS, LATEST_MODERN])
def test_built_envelopes_validate_against_every_revision(revision):
    for message in (
        jsonrpc.request(1, "ping"),
        jsonrpc.notification("notifications/initialized"),
        # 2026-07-28 makes resultType a required result member.
        jsonrpc.result_response(1, {"resultType": "complete"} if era_of(revision) is Era.MODERN else {}),
        jsonrpc.error_response(1, jsonrpc.INTERNAL_ERROR, "boom", {"detail": 1}),
    ):
        assert errors(revision, "JSONRPCMessage", message) == []


def test_proxy_error_codes_sit_in_the_implementation_defined_range_and_do_not_collide():
    proxy_codes = [
        jsonrpc.UPSTREAM_UNAVAILABLE,
        jsonrpc.UPSTREAM_TIMEOUT,
        jsonrpc.UPSTREAM_INVALID,
        jsonrpc.LIMIT_EXCEEDED,
    ]
    assert all(-32019 <= code <= -32000 for code in proxy_codes)
    protocol_codes = [
        jsonrpc.PARSE_ERROR,
        jsonrpc.INVALID_REQUEST,
        jsonrpc.METHOD_NOT_FOUND,
        jsonrpc.INVALID_PARAMS,
        jsonrpc.INTERNAL_ERROR,
        jsonrpc.RESOURCE_NOT_FOUND,
        jsonrpc.HEADER_MISMATCH,
        jsonrpc.MISSING_REQUIRED_CAPABILITY,
        jsonrpc.UNSUPPORTED_PROTOCOL_VERSION,
        jsonrpc.URL_ELICITATION_REQUIRED,
    ]
    assert len(set(proxy_codes + protocol_codes)) == len(proxy_codes) + len(protocol_codes)


@pytest.mark.parametrize("number", [-9223372036854775809, -(10**18) * 9 - 999, 18446744073709551616, -(2**70)])
def test_integers_beyond_64_bits_survive_decoding_exactly(number: int) -> None:
    # orjson reads these as floats (-9223372036854775809 has only 19 digits): the proxy would
    # change a number a client sent.
    raw = f'{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"n":{number}}}}}'.encode()
    assert jsonrpc.decode(raw)["params"]["n"] == number
    assert jsonrpc.decode(jsonrpc.encode(jsonrpc.decode(raw)))["params"]["n"] == number
