"""Server-Sent Events codec (proxy/protocol/sse.py), WHATWG parsing rules."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.protocol import jsonrpc
from proxy.protocol.sse import KEEPALIVE, Decoder, Event, encode_event


def _decode(*chunks: bytes) -> list[Event]:
    decoder = Decoder()
    events: list[Event] = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
    return events


def test_one_data_line_and_a_blank_line_make_one_message_event():
    assert _decode(b'data: {"a":1}\n\n') == [Event('{"a":1}')]


def test_event_type_and_id_are_read():
    assert _decode(b"event: endpoint\nid: 7\ndata: /messages?s=1\n\n") == [Event("/messages?s=1", "endpoint", "7")]


def test_multi_line_data_is_joined_with_newlines():
    assert _decode(b"data: line1\ndata: line2\ndata:\n\n") == [Event("line1\nline2\n")]


def test_crlf_and_lone_cr_end_lines_too():
    assert _decode(b"data: a\r\n\r\ndata: b\r\rdata: c\n\n") == [Event("a"), Event("b"), Event("c")]


def test_only_one_leading_space_is_stripped_from_a_value():
    assert _decode(b"data:x\n\ndata:  y \n\n") == [Event("x"), Event(" y ")]


def test_comments_and_keepalives_produce_nothing():
    assert _decode(KEEPALIVE, b": ping\n\n", b":\r\n\r\n") == []
    assert _decode(b": note\ndata: x\n\n") == [Event("x")]


def test_an_event_without_data_is_not_dispatched_and_resets_the_event_type():
    assert _decode(b"event: custom\n\ndata: x\n\n") == [Event("x")]


def test_a_field_line_without_colon_is_a_field_with_an_empty_value():
    assert _decode(b"data\ndata\n\n") == [Event("\n")]


def test_unknown_fields_are_ignored():
    assert _decode(b"foo: bar\ndata: x\nbaz\n\n") == [Event("x")]


def test_the_last_event_id_persists_until_changed_and_ids_with_nul_are_ignored():
    events = _decode(b"id: 1\ndata: a\n\ndata: b\n\nid: 2\x00x\ndata: c\n\nid:\ndata: d\n\n")
    assert [e.id for e in events] == ["1", "1", "1", ""]


def test_retry_is_read_only_when_it_is_all_digits():
    events = _decode(b"retry: 1500\ndata: a\n\nretry: soon\ndata: b\n\n")
    assert [e.retry for e in events] == [1500, 1500]


def test_retry_with_non_ascii_digits_is_ignored_not_fatal():
    # WHATWG: the retry value must consist of ASCII digits only; "¹" and "٣" are Unicode digits.
    events = _decode("retry: ¹\ndata: a\n\nretry: ٣\ndata: b\n\n".encode())
    assert [(e.data, e.retry) for e in events] == [("a", None), ("b", None)]


def test_an_unterminated_final_event_is_not_dispatched():
    assert _decode(b"data: complete\n\ndata: partial\n") == [Event("complete")]
    assert _decode(b"data: partial") == []


def test_utf8_split_across_chunks_is_decoded_whole():
    raw = "data: grüße 世界\n\n".encode()
    split = raw.index("世".encode()) + 1
    assert _decode(raw[:split], raw[split:]) == [Event("grüße 世界")]


def test_a_crlf_split_between_chunks_ends_one_line_only():
    assert _decode(b"data: a\r", b"\n\r", b"\n") == [Event("a")]


def test_encode_event_writes_data_then_a_blank_line():
    assert encode_event(b'{"x":1}') == b'data: {"x":1}\n\n'
    assert encode_event(b"{}", event="message", event_id="s1.4") == b"id: s1.4\nevent: message\ndata: {}\n\n"


def test_an_encoded_json_message_decodes_to_the_same_message():
    message = jsonrpc.notification("notifications/message", {"level": "info", "data": "héllo\nworld"})
    (event,) = _decode(encode_event(jsonrpc.encode(message), event_id="9"))
    assert jsonrpc.decode(event.data) == message
    assert (event.event, event.id) == ("message", "9")


def test_data_containing_line_breaks_is_split_over_several_data_lines():
    encoded = encode_event(b"a\nb\r\nc\rd")
    assert encoded == b"data: a\ndata: b\ndata: c\ndata: d\n\n"
    assert _decode(encoded) == [Event("a\nb\nc\nd")]


# ---------------------------------------------------------------- any chunking, same events

_value = st.text(alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=12)
_line = st.one_of(
    st.builds(lambda v: f"data: {v}", _value),
    st.builds(lambda v: f"data:{v}", _value),
    st.just("data"),
    st.builds(lambda v: f"event: {v}", _value),
    st.builds(lambda v: f"id: {v}", _value),
    st.builds(lambda v: f"retry: {v}", st.integers(0, 99999).map(str) | _value),
    st.builds(lambda v: f": {v}", _value),
    st.just(""),
    st.just(""),
)
_stream = st.lists(st.tuples(_line, st.sampled_from(["\n", "\r\n", "\r"])), max_size=25).map(
    lambda lines: "".join(text + end for text, end in lines).encode()
)


@settings(max_examples=200)
@given(data=_stream, cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_any_chunking_of_a_stream_gives_the_same_events(data, cuts):
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    whole = _decode(data)
    assert _decode(*chunks) == whole
    assert _decode(*(data[i : i + 1] for i in range(len(data)))) == whole
