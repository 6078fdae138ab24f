"""What a reply relayed byte for byte may be (proxy/protocol/relayed_reply.py)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.protocol import jsonrpc
from proxy.protocol.relayed_reply import EventCheck, Sent, check_and_rewrite, check_body, excerpt, streams

UP = "up"
REQUEST = jsonrpc.request(7, "tools/call", {"name": "x"})
POST = Sent.of("POST", REQUEST, legacy=False)
IN_SESSION = Sent.of("POST", REQUEST, legacy=True, in_session=True)
NOTE = Sent.of("POST", jsonrpc.notification("notifications/initialized"), legacy=True)
GET = Sent.of("GET", None, legacy=True, in_session=True)
PROGRESS = jsonrpc.notification("notifications/progress", {"progressToken": "p", "progress": 1})


def body(message: Any) -> bytes:
    return json.dumps(message).encode()


def event(message: Any, line_end: bytes = b"\n") -> bytes:
    return b"data: " + body(message) + line_end + line_end


# ---------------------------------------------------------------- excerpt


def test_an_html_page_is_quoted_by_its_title():
    page = b"<!DOCTYPE html><html><head><title>\n 502  Bad Gateway </title></head><body>" + b"x" * 5000
    assert excerpt(page) == "502 Bad Gateway"


def test_an_html_page_without_a_title_is_quoted_by_its_text_without_tags_scripts_or_styles():
    page = "<html><style>body{color:red}</style><script>alert(1)</script><h1>Not   Found</h1><p>Try <b>again</b>"
    assert excerpt(page) == "Not Found Try again"


def test_a_long_text_is_cut_short_and_a_tag_cut_in_half_leaves_no_bracket():
    assert excerpt("word " * 100) == ("word " * 20)[:99] + "…"
    assert len(excerpt("word " * 100)) == 100
    assert "<" not in excerpt("<p>" + "a" * 5000 + "<di")


def test_plain_text_and_json_are_quoted_as_they_are():
    assert excerpt(b'{"hello": 1}') == '{"hello": 1}'
    assert excerpt(b"\xff bad utf-8") == "\ufffd bad utf-8"
    assert excerpt(b"") == ""


# ---------------------------------------------------------------- what was sent


def test_the_requests_of_a_message_or_batch_are_what_is_awaited():
    batch = [REQUEST, jsonrpc.request("b", "ping"), jsonrpc.notification("n"), jsonrpc.result_response(3, {})]
    assert Sent.of("POST", batch, legacy=True).awaited == {7, "b"}
    assert NOTE.awaited == frozenset() and GET.awaited == frozenset()
    assert IN_SESSION.resumable and IN_SESSION.in_session and not POST.resumable


@pytest.mark.parametrize(
    ("status", "content_type", "expected"),
    [
        (200, "text/event-stream", True),
        (202, "text/event-stream", True),
        (200, "application/json", False),
        (500, "text/event-stream", False),
        (404, "text/event-stream", False),
    ],
)
def test_only_a_successful_event_stream_is_relayed_as_it_arrives(status: int, content_type: str, expected: bool):
    assert streams(status, content_type) is expected


# ---------------------------------------------------------------- whole bodies


@pytest.mark.parametrize(
    "reply",
    [
        jsonrpc.result_response(7, {"content": [], "unknown": {"kept": True}}),
        jsonrpc.error_response(7, -32602, "bad arguments"),
        jsonrpc.error_response(None, -32700, "could not parse"),
    ],
)
def test_an_answer_to_the_request_passes(reply: Any):
    assert check_body(POST, 200, "application/json", body(reply), UP) is None


def test_json_typed_otherwise_passes_when_it_plainly_is_json():
    assert check_body(POST, 200, "text/plain", body(jsonrpc.result_response(7, {})), UP) is None


def test_a_batch_reply_answers_the_requests_of_the_batch():
    sent = Sent.of("POST", [REQUEST, jsonrpc.request(8, "ping")], legacy=True)
    answers = [jsonrpc.result_response(7, {}), jsonrpc.result_response(8, {})]
    assert check_body(sent, 200, "application/json", body(answers), UP) is None
    twice = [jsonrpc.result_response(7, {}), jsonrpc.result_response(7, {})]
    refused = check_body(sent, 200, "application/json", body(twice), UP)
    assert refused is not None and refused.failure.detail == "answered request 7 twice"


@pytest.mark.parametrize(
    ("status", "content_type", "raw", "detail"),
    [
        (200, "application/json", b"", "answered HTTP 200 with no reply"),
        (200, "application/json", b"  \n", "answered HTTP 200 with no reply"),
        (200, "application/json", b"{not json", "sent a body that is not JSON: '{not json'"),
        (200, "text/plain", b"[1, 2", "sent a body that is not JSON: '[1, 2'"),
        (200, "text/plain", b"OK", "sent a text/plain body that is not JSON-RPC: 'OK'"),
        (200, "", b"OK", "sent a untyped body that is not JSON-RPC: 'OK'"),
        (200, "application/json", b'{"hello": 1}', "sent a message that is not JSON-RPC: \"{'hello': 1}\""),
        (200, "application/json", b"[]", "sent an empty batch"),
        (200, "application/json", body(jsonrpc.result_response(8, {})), "answered another request (id 8)"),
        (200, "application/json", body(PROGRESS), "sent a notification where the reply was due"),
        (200, "application/json", body(jsonrpc.request(1, "ping")), "sent a request where the reply was due"),
    ],
)
def test_a_success_that_is_no_answer_is_invalid(status: int, content_type: str, raw: bytes, detail: str):
    refused = check_body(POST, status, content_type, raw, UP)
    assert refused is not None and refused.status is None
    failure = refused.failure
    assert (failure.kind, failure.code, failure.detail) == ("invalid", jsonrpc.UPSTREAM_INVALID, detail)


def test_a_notification_may_be_accepted_with_an_empty_success_and_nothing_else():
    assert check_body(NOTE, 202, "", b"", UP) is None
    assert check_body(NOTE, 200, "application/json", b"", UP) is None
    refused = check_body(NOTE, 200, "text/html", b"<html>hi</html>", UP)
    assert refused is not None and refused.failure.code == jsonrpc.UPSTREAM_INVALID


def test_a_get_or_delete_success_passes_whatever_it_says():
    delete = Sent.of("DELETE", None, legacy=True, in_session=True)
    assert check_body(delete, 200, "text/plain", b"bye", UP) is None
    assert check_body(GET, 200, "application/json", b"", UP) is None


@pytest.mark.parametrize(
    ("status", "content_type", "raw", "detail"),
    [
        (
            502,
            "text/html",
            b"<html><title>502 Bad Gateway</title>" + b"<p>x</p>" * 999,
            "answered HTTP 502: 502 Bad Gateway",
        ),
        (500, "", b"", "answered HTTP 500"),
        (503, "text/plain", b"  down for maintenance \n", "answered HTTP 503: down for maintenance"),
        (500, "application/json", b'{"detail": "boom"}', 'answered HTTP 500: {"detail": "boom"}'),
        (400, "application/json", body(jsonrpc.error_response(8, -32600, "x")), "answered HTTP 400: {"),
        (404, "text/html", b"<h1>Not Found</h1>", "answered HTTP 404: Not Found"),
        (405, "application/json", b"{broken", "answered HTTP 405: {broken"),
        (302, "", b"", "answered HTTP 302"),
    ],
)
def test_an_http_failure_without_a_json_rpc_error_is_upstream_unavailable_naming_its_status(
    status: int, content_type: str, raw: bytes, detail: str
):
    refused = check_body(POST, status, content_type, raw, UP)
    assert refused is not None and refused.status is None  # told in a 200, like any -32010
    failure = refused.failure
    assert (failure.kind, failure.code, failure.http_status) == ("http", jsonrpc.UPSTREAM_UNAVAILABLE, status)
    assert failure.detail.startswith(detail) and len(failure.detail) < 130 and "<" not in failure.detail


@pytest.mark.parametrize(
    "reply",
    [jsonrpc.error_response(7, -32022, "unsupported version"), jsonrpc.error_response(None, -32001, "No session")],
)
def test_a_json_rpc_error_with_a_failure_status_passes_as_it_came(reply: Any):
    assert check_body(POST, 400, "application/json", body(reply), UP) is None
    assert check_body(POST, 500, "application/json", body([reply]), UP) is None


@pytest.mark.parametrize("status", [401, 403])
def test_an_authentication_failure_passes_with_an_empty_or_json_body(status: int):
    assert check_body(POST, status, "", b"", UP) is None
    assert check_body(POST, status, "application/json", b'{"error": "invalid_token"}', UP) is None


@pytest.mark.parametrize("status", [401, 403])
def test_an_authentication_failure_with_a_page_keeps_its_status_and_loses_the_page(status: int):
    refused = check_body(POST, status, "text/html", b"<html><title>Log in</title></html>", UP)
    assert refused is not None and refused.status == status
    assert refused.failure.is_auth and refused.failure.detail == f"answered HTTP {status}: Log in"


def test_a_404_in_a_session_keeps_its_status_the_session_is_gone():
    assert check_body(IN_SESSION, 404, "application/json", b'{"detail": "unknown session"}', UP) is None
    assert check_body(IN_SESSION, 404, "", b"", UP) is None
    refused = check_body(IN_SESSION, 404, "text/plain", b"Session not found", UP)
    assert refused is not None and refused.status == 404
    assert refused.failure.detail == "answered HTTP 404: Session not found"
    outside = check_body(POST, 404, "text/plain", b"Session not found", UP)
    assert outside is not None and outside.status is None


def test_any_status_to_a_get_keeps_its_meaning():
    assert check_body(GET, 405, "", b"", UP) is None
    refused = check_body(GET, 405, "text/html", b"<title>Method Not Allowed</title>", UP)
    assert refused is not None and refused.status == 405


# ---------------------------------------------------------------- SSE streams


def feed_all(check: EventCheck, *chunks: bytes) -> tuple[bytes, Any]:
    relayed = b""
    for chunk in chunks:
        data, failure = check.feed(chunk)
        relayed += data
        if failure is not None:
            return relayed, failure
    return relayed, None


def test_whole_events_pass_as_they_came_and_the_answer_is_noted():
    check = EventCheck(POST, UP, 1 << 20)
    stream = (
        event(PROGRESS)
        + b": keep-alive\n\n"
        + b"id: 1\nevent: message\ndata: "
        + body(jsonrpc.result_response(7, {}))
        + b"\n\n"
    )
    assert check.feed(stream) == (stream, None)
    assert check.unanswered == set()
    assert check.ended() is None


def test_an_event_is_relayed_only_once_it_is_complete():
    check = EventCheck(POST, UP, 1 << 20)
    whole = event(PROGRESS)
    assert check.feed(whole[:10]) == (b"", None)
    assert check.feed(whole[10:-1]) == (b"", None)
    assert check.feed(whole[-1:] + b"data: {") == (whole, None)
    assert check.unanswered == {7}


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
def test_every_kind_of_line_end_ends_events(line_end: bytes):
    check = EventCheck(POST, UP, 1 << 20)
    stream = event(PROGRESS, line_end) + event(jsonrpc.result_response(7, {}), line_end)
    assert check.feed(stream) == (stream, None)
    assert check.unanswered == set()


def test_a_crlf_split_between_two_reads_is_one_line_end():
    check = EventCheck(POST, UP, 1 << 20)
    first = b"data: " + body(PROGRESS) + b"\r\n\r"
    assert check.feed(first) == (first, None)
    # The LF completing that CRLF goes out at once, and starts no empty line of its own.
    assert check.feed(b"\ndata: " + body(PROGRESS) + b"\r\n") == (b"\n", None)
    assert check.feed(b"\r\n") == (b"data: " + body(PROGRESS) + b"\r\n\r\n", None)
    # A line (not an event) ended by a split CRLF: its LF waits with the rest of the event.
    assert check.feed(b"data: " + body(PROGRESS) + b"\r") == (b"", None)
    assert check.feed(b"\n\n") == (b"data: " + body(PROGRESS) + b"\r\n\n", None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=400), max_size=8), st.sampled_from([b"\n", b"\r\n", b"\r"]))
def test_however_a_stream_is_cut_the_same_bytes_pass_each_once(cuts: list[int], line_end: bytes):
    stream = event(PROGRESS, line_end) + b":" + line_end + line_end + event(jsonrpc.result_response(7, {}), line_end)
    points = sorted({min(cut, len(stream)) for cut in cuts} | {0, len(stream)})
    check = EventCheck(POST, UP, 1 << 20)
    relayed, failure = feed_all(check, *(stream[a:b] for a, b in itertools.pairwise(points)))
    assert failure is None
    assert relayed == stream and check.unanswered == set()


@pytest.mark.parametrize(
    ("bad", "detail"),
    [
        (b"data: {not json\n\n", "sent an SSE event that is not JSON: '{not json'"),
        (event({"hello": 1}), "sent a message that is not JSON-RPC"),
        (event(jsonrpc.result_response(8, {})), "answered another request (id 8)"),
    ],
)
def test_an_invalid_event_stops_the_stream_after_the_events_before_it(bad: bytes, detail: str):
    check = EventCheck(POST, UP, 1 << 20)
    before = event(PROGRESS)
    relayed, failure = feed_all(check, before + bad + event(jsonrpc.result_response(7, {})))
    assert relayed == before
    assert failure is not None and failure.code == jsonrpc.UPSTREAM_INVALID and failure.detail.startswith(detail)
    assert check.unanswered == {7}


def test_a_second_answer_to_the_same_request_is_invalid():
    check = EventCheck(POST, UP, 1 << 20)
    answer = event(jsonrpc.result_response(7, {}))
    relayed, failure = feed_all(check, answer, answer)
    assert relayed == answer and failure is not None and failure.detail == "answered request 7 twice"


def test_an_error_without_an_id_ends_what_is_awaited():
    check = EventCheck(POST, UP, 1 << 20)
    assert check.feed(event(jsonrpc.error_response(None, -32603, "no idea whose")))[1] is None
    assert check.unanswered == set()


def test_empty_data_and_batches_of_messages_are_events_too():
    check = EventCheck(Sent.of("POST", [REQUEST, jsonrpc.request(8, "ping")], legacy=True), UP, 1 << 20)
    stream = b"data:\n\n" + event([jsonrpc.result_response(7, {}), jsonrpc.result_response(8, {})])
    assert check.feed(stream) == (stream, None)
    assert check.unanswered == set()


def test_a_get_stream_may_replay_responses_to_earlier_requests():
    check = EventCheck(GET, UP, 1 << 20)
    replayed = event(jsonrpc.result_response(3, {}))
    assert check.feed(replayed) == (replayed, None)
    assert check.ended() is None


def test_an_event_over_the_bound_is_invalid_naming_the_bound():
    check = EventCheck(POST, UP, 100)
    assert check.feed(b"data: " + b"x" * 60) == (b"", None)
    data, failure = check.feed(b"x" * 60)
    assert data == b"" and failure is not None
    assert failure.detail == "sent an SSE event over upstream.max_reply_bytes (100 bytes)"


def ended_early(sent: Sent, stream: bytes) -> str | None:
    check = EventCheck(sent, UP, 1 << 20)
    assert check.feed(stream)[1] is None
    failure = check.ended()
    if failure is None:
        return None
    assert (failure.kind, failure.code) == ("unavailable", jsonrpc.UPSTREAM_UNAVAILABLE)
    return failure.detail


PRIMING = b"id: e1\nretry: 100\ndata:\n\n"  # an event id and empty data: resumable from here


def test_a_modern_stream_ended_before_its_answer_lost_its_request():
    assert ended_early(POST, PRIMING + event(PROGRESS)) == "ended the stream without a reply"


def test_a_legacy_stream_may_end_before_its_answer_once_it_can_be_resumed():
    assert ended_early(IN_SESSION, PRIMING + event(PROGRESS) + b": bye") is None


def test_a_legacy_stream_without_an_event_id_cannot_be_resumed():
    assert ended_early(IN_SESSION, event(PROGRESS)) == "ended the stream without a reply"


@pytest.mark.parametrize("sent", [POST, IN_SESSION], ids=["modern", "legacy"])
def test_a_stream_ended_in_the_middle_of_an_event_was_broken(sent: Sent):
    assert (
        ended_early(sent, PRIMING + b'data: {"jsonrpc": "2.0", "id": ') == "ended the stream in the middle of an event"
    )


def test_a_stream_that_answered_or_a_get_stream_may_end_any_time():
    assert ended_early(POST, event(jsonrpc.result_response(7, {})) + b"data: {") is None
    assert ended_early(GET, event(PROGRESS) + b"data: {") is None


# ---------------------------------------------------------------- rewriting (resource_server's binding)


def _seal_state(value: Any) -> Any:
    """A rewrite like relay/binding.py's: a result's requestState replaced, else None."""
    result = value.get("result") if isinstance(value, dict) else None
    if not isinstance(result, dict) or "requestState" not in result:
        return None
    return {**value, "result": {**result, "requestState": "sealed:" + result["requestState"]}}


PARKED = jsonrpc.result_response(7, {"resultType": "input_required", "requestState": "s1"})


def test_a_whole_reply_is_rewritten_from_the_value_the_check_parsed():
    refusal, out = check_and_rewrite(POST, 200, "application/json", body(PARKED), UP, _seal_state)
    assert refusal is None and json.loads(out)["result"]["requestState"] == "sealed:s1"
    unchanged = body(jsonrpc.result_response(7, {"resultType": "complete"}))
    assert check_and_rewrite(POST, 200, "application/json", unchanged, UP, _seal_state) == (None, unchanged)


def test_a_reply_that_is_no_answer_is_refused_before_any_rewrite():
    refusal, _ = check_and_rewrite(POST, 200, "text/html", b"<html>oops</html>", UP, _seal_state)
    assert refusal is not None and refusal.failure.code == jsonrpc.UPSTREAM_INVALID
    failed = body(jsonrpc.error_response(7, -32602, "bad"))
    assert check_and_rewrite(POST, 400, "application/json", failed, UP, _seal_state) == (None, failed)


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6))
def test_an_sse_event_carrying_a_request_state_is_re_encoded_however_the_stream_is_cut(cuts: list[int]):
    stream = event(PROGRESS) + b"id: e2\nretry: 500\n" + event(PARKED)
    check = EventCheck(POST, UP, 1 << 20, _seal_state)
    out = b""
    points = sorted({min(cut, len(stream)) for cut in cuts})
    for start, end in itertools.pairwise([0, *points, len(stream)]):
        data, failure = check.feed(stream[start:end])
        assert failure is None
        out += data
    assert out.startswith(event(PROGRESS))  # untouched, byte for byte
    rewritten = out[len(event(PROGRESS)) :]
    lines = rewritten.decode().splitlines()
    assert "id: e2" in lines and "retry: 500" in lines and rewritten.endswith(b"\n\n")
    [data_line] = [line for line in lines if line.startswith("data: ")]
    assert json.loads(data_line[6:])["result"]["requestState"] == "sealed:s1"
    assert check.unanswered == set() and check.ended() is None


def test_what_a_message_awaits_is_the_same_with_its_kind_given() -> None:
    for message in (REQUEST, jsonrpc.notification("notifications/initialized")):
        found = Sent.of("POST", message, legacy=False)
        assert Sent.of("POST", message, legacy=False, kind=jsonrpc.kind(message)) == found
