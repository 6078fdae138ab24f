"""What an upstream reply relayed byte for byte may be: the checks `relay/bytes.py` makes before
the client gets it, and while it streams (docs/design.md §Errors).

A valid reply reaches the client as it came. One that is no answer to what the client sent (an HTML
error page, a body that is not JSON-RPC, an empty 200 to a request, a response to another id) is
refused: the client gets a JSON-RPC error instead, -32010 for an HTTP failure (its status named)
and -32012 for an invalid reply. Statuses that mean something to the client's transport keep
their meaning: a 401/403 (authentication), a 404 to a request in a session (the session is gone),
anything to a GET or DELETE (405: no stream here). Those pass as they came when their body is
empty or JSON; a page in their place becomes a JSON-RPC error under the same status.

An SSE reply is checked event by event as it passes (`EventCheck`): only whole events are
relayed, each must be JSON-RPC, and a POST's stream may answer only the requests it carried.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import jsonrpc
from .outcome import UpstreamFailure, invalid
from .sse import Decoder, Event, encode_event

# A rewrite of a relayed reply's decoded JSON: the value to relay instead, or None to relay it as it
# came (resource_server mode seals a modern upstream's requestState: relay/binding.py).
Rewrite = Callable[[Any], Any]

_EXCERPT = 100  # characters of a body quoted in an error message
_TITLE = re.compile(r"<title[^>]*>(.*?)</title", re.IGNORECASE | re.DOTALL)
_HIDDEN = re.compile(r"<(script|style)\b.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]*>?")
_LINE_END = re.compile(rb"\r\n|\r|\n")


def excerpt(body: bytes | str, limit: int = _EXCERPT) -> str:
    """A short quote of a body for an error message: an HTML page's title (or its text, tags
    dropped), whitespace collapsed, at most `limit` characters. Never the page itself."""
    text = body[:4096].decode("utf-8", errors="replace") if isinstance(body, bytes) else body[:4096]
    if text.lstrip()[:1] == "<":
        title = _TITLE.search(text)
        text = title.group(1) if title else _TAG.sub(" ", _HIDDEN.sub(" ", text))
        text = text.replace("<", " ")  # an unclosed tag at the cut
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class Sent:
    """What the client sent: its HTTP method, the ids of the requests awaiting an answer (none for
    notifications and responses), whether it names an upstream session, and whether a stream
    that ends before its response can be resumed (legacy: with Last-Event-ID)."""

    method: str
    awaited: frozenset[Any] = frozenset()
    in_session: bool = False
    resumable: bool = False

    @classmethod
    def of(cls, method: str, message: Any, *, legacy: bool, in_session: bool = False, kind: str | None = None) -> Sent:
        """`kind`: the message's jsonrpc.kind, when the caller found it already."""
        if isinstance(message, dict):  # the usual: one message, no generator
            if kind is None:
                kind = jsonrpc.kind(message)
            awaited = frozenset((message["id"],)) if kind == "request" else frozenset()
            return cls(method, awaited, in_session, legacy)
        items = message if isinstance(message, list) else ()
        awaited = frozenset(item["id"] for item in items if jsonrpc.kind(item) == "request")
        return cls(method, awaited, in_session, legacy)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a reply cannot reach the client as it came: the failure the client is told (and that
    is counted), and the HTTP status it is told with when the upstream's must stay."""

    failure: UpstreamFailure
    status: int | None = None


def streams(status: int, content_type: str) -> bool:
    """Whether the reply is relayed as it arrives (an SSE stream), not read whole first."""
    return 200 <= status < 300 and content_type == "text/event-stream"


def check_body(sent: Sent, status: int, content_type: str, body: bytes, upstream: str) -> Refusal | None:
    """None if a whole (not streamed) reply may reach the client as it came, else why not."""
    if 200 <= status < 300:
        return _check_success(sent, status, content_type, body, upstream)[0]
    return _check_failure(sent, status, content_type, body, upstream)


def check_and_rewrite(
    sent: Sent, status: int, content_type: str, body: bytes, upstream: str, rewrite: Rewrite
) -> tuple[Refusal | None, bytes]:
    """check_body, and the body the client gets: a successful JSON reply `rewrite` changes is
    encoded anew (parsed once, for both)."""
    if not 200 <= status < 300:
        return _check_failure(sent, status, content_type, body, upstream), body
    refusal, value = _check_success(sent, status, content_type, body, upstream)
    if refusal is not None or value is _NOT_JSON:
        return refusal, body
    rewritten = rewrite(value)
    return None, body if rewritten is None else jsonrpc.encode(rewritten)


def _check_failure(sent: Sent, status: int, content_type: str, body: bytes, upstream: str) -> Refusal | None:
    kept = _transport_status(sent, status)
    if not body.strip():
        return None if kept else Refusal(http_failure(upstream, status, body))
    value = _json(content_type, body)
    if value is not _NOT_JSON and (kept or _is_error_reply(value, sent)):
        return None  # e.g. an OAuth error body with a 401, a JSON-RPC error with a 400
    return Refusal(http_failure(upstream, status, body), status if kept else None)


def http_failure(upstream: str, status: int, body: bytes) -> UpstreamFailure:
    """An HTTP failure status, with a short quote of what came with it."""
    quoted = excerpt(body)
    detail = f"answered HTTP {status}: {quoted}" if quoted else f"answered HTTP {status}"
    return UpstreamFailure(upstream, "http", jsonrpc.UPSTREAM_UNAVAILABLE, detail, status)


_NOT_JSON: Any = object()


def _json(content_type: str, body: bytes) -> Any:
    """The body's JSON value, if it is JSON (typed so, or plainly an object or array)."""
    if content_type != "application/json" and body.lstrip()[:1] not in (b"{", b"["):
        return _NOT_JSON
    try:
        return jsonrpc.decode(body)
    except jsonrpc.DecodeError:
        return _NOT_JSON


def _check_success(
    sent: Sent, status: int, content_type: str, body: bytes, upstream: str
) -> tuple[Refusal | None, Any]:
    """Why a successful reply may not pass, and its JSON value (_NOT_JSON when none was read)."""
    if sent.method != "POST":
        return None, _NOT_JSON  # a DELETE's 200, whatever it says
    if not body.strip():
        empty = Refusal(invalid(upstream, f"answered HTTP {status} with no reply")) if sent.awaited else None
        return empty, _NOT_JSON
    value = _json(content_type, body)
    if value is _NOT_JSON:
        if content_type == "application/json" or body.lstrip()[:1] in (b"{", b"["):
            return Refusal(invalid(upstream, f"sent a body that is not JSON: {excerpt(body)!r}")), value
        typed = content_type or "untyped"
        return Refusal(invalid(upstream, f"sent a {typed} body that is not JSON-RPC: {excerpt(body)!r}")), value
    problem = _answers(value, sent)
    return (Refusal(invalid(upstream, problem)) if problem is not None else None), value


def _transport_status(sent: Sent, status: int) -> bool:
    """Whether the client reads this status as it is (so it stays, whatever the body)."""
    return status in (401, 403) or (status == 404 and sent.in_session) or sent.method != "POST"


def _is_error_reply(value: Any, sent: Sent) -> bool:
    """A JSON-RPC error answering the request (or nobody in particular: a server that could not
    tell whose request it refused answers id null)."""
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(
        jsonrpc.kind(item) == "response" and "error" in item and item.get("id") in (sent.awaited | {None})
        for item in items
    )


def _answers(value: Any, sent: Sent) -> str | None:
    """Why a whole body is not the answer to `sent`, or None."""
    items = value if isinstance(value, list) else [value]
    if not items:
        return "sent an empty batch"
    unanswered = set(sent.awaited)
    for item in items:
        kind = jsonrpc.kind(item)
        if kind in ("request", "notification"):
            return f"sent a {kind} where the reply was due"
        problem = _answer(item, sent, unanswered, kind)
        if problem is not None:
            return problem
    return None


def _answer(item: Any, sent: Sent, unanswered: set[Any], kind: str | None = None) -> str | None:
    """Why one message may not be relayed in reply to `sent`, or None: a response must answer one
    of its requests (and leaves `unanswered`); requests and notifications pass. `kind`: the
    item's jsonrpc.kind, when the caller knows it already."""
    if kind is None:
        kind = jsonrpc.kind(item)
    if kind == "invalid":
        return f"sent a message that is not JSON-RPC: {excerpt(str(item))!r}"
    if kind != "response" or sent.method != "POST":
        return None  # a GET stream may replay responses (Last-Event-ID)
    request_id = item.get("id")  # an error may have none
    if request_id in unanswered:
        unanswered.discard(request_id)
        return None
    if request_id is None and "error" in item:
        unanswered.clear()  # whose it was, the server could not tell: it ends the exchange
        return None
    if request_id in sent.awaited:
        return f"answered request {request_id!r} twice"
    return f"answered another request (id {request_id!r})"


class EventCheck:
    """An SSE reply checked as it passes: `feed` takes the bytes as they arrive and returns those of
    the whole events among them (an event is relayed only once it is complete), each checked.
    `unanswered` is what the client still awaits, so that a stream that fails can end with an
    error for each."""

    __slots__ = (
        "_cr",
        "_decoder",
        "_event_id",
        "_held",
        "_held_size",
        "_limit",
        "_line_start",
        "_rewrite",
        "_upstream",
        "sent",
        "unanswered",
    )

    def __init__(self, sent: Sent, upstream: str, limit: int, rewrite: Rewrite | None = None) -> None:
        self.sent = sent
        self._rewrite = rewrite  # an event it changes is encoded anew
        self.unanswered = set(sent.awaited)
        self._upstream = upstream
        self._limit = limit
        self._decoder = Decoder()
        self._held: list[bytes] = []  # the start of the event not yet complete
        self._held_size = 0
        self._line_start = True  # the held bytes end a line (or there are none)
        self._cr = False  # they end with CR: a LF next is the rest of that line end
        self._event_id = False  # an event had an id: the client can resume the stream from it

    def feed(self, chunk: bytes) -> tuple[bytes, UpstreamFailure | None]:
        """The bytes to relay now and, if an event is invalid, why: the bytes are then those of the
        events before it, and nothing more may be relayed."""
        ends = self._event_ends(chunk)
        if not ends:
            self._hold(chunk)
            if self._held_size > self._limit:
                return b"", invalid(self._upstream, f"sent an SSE event over {_bound(self._limit)}")
            return b"", None
        relayed: list[bytes] = []
        start = 0
        for end in ends:
            block = chunk[start:end]
            if self._held:
                block = b"".join([*self._held, block])
                self._held, self._held_size = [], 0
            problem, block = self._check(block)
            if problem is not None:
                return b"".join(relayed), invalid(self._upstream, problem)
            relayed.append(block)
            start = end
        self._hold(chunk[start:])
        return relayed[0] if len(relayed) == 1 else b"".join(relayed), None

    def ended(self) -> UpstreamFailure | None:
        """The upstream ended the stream: why that fails the request, if it does. Before its
        response, a 2026-07-28 stream lost is its request lost (docs/translation.md §2: "lost
        stream = lost request"); a legacy server may close it to be resumed with Last-Event-ID,
        once it has sent an event id (2025-11-25/basic/transports.mdx §Resumability and
        Redelivery). A stream cut in the middle of an event was not closed but broken."""
        partial = any(line and not line.startswith(b":") for line in b"".join(self._held).splitlines())
        self._held, self._held_size = [], 0  # an unfinished last event is no event (WHATWG SSE)
        if not self.unanswered:
            return None
        if partial:
            detail = "ended the stream in the middle of an event"
        elif self.sent.resumable and self._event_id:
            return None
        else:
            detail = "ended the stream without a reply"
        return UpstreamFailure(self._upstream, "unavailable", jsonrpc.UPSTREAM_UNAVAILABLE, detail)

    def _hold(self, data: bytes) -> None:
        if data:
            self._held.append(data)
            self._held_size += len(data)

    def _event_ends(self, chunk: bytes) -> list[int]:
        """Where in `chunk` events end: after each empty line (a line end right after another),
        whatever the line ends are (CRLF, LF, CR)."""
        ends: list[int] = []
        position = 0
        line_start: int | None = 0 if self._line_start else None
        if self._cr and chunk[:1] == b"\n":
            position = line_start = 1  # the LF of a CRLF split between two reads
            if not self._held:
                ends.append(1)  # that CRLF ended an event: its LF goes out at once, not with the next
        for match in _LINE_END.finditer(chunk, position):
            if match.start() == line_start:
                ends.append(match.end())
            line_start = match.end()
        self._line_start = line_start == len(chunk)
        self._cr = chunk.endswith(b"\r")
        return ends

    def _check(self, block: bytes) -> tuple[str | None, bytes]:
        """Why the events of `block` may not pass, and the bytes to relay for them."""
        # A block ending in CR: the decoder waits to see whether a LF follows; it ends the line either way.
        rewritten: list[bytes] | None = None
        for event in self._decoder.feed(block + b"\n" if block.endswith(b"\r") else block):
            if event.id:
                self._event_id = True
            if not event.data.strip():
                continue
            try:
                value = jsonrpc.decode(event.data)
            except jsonrpc.DecodeError:
                return f"sent an SSE event that is not JSON: {excerpt(event.data)!r}", block
            for item in value if isinstance(value, list) else [value]:
                problem = _answer(item, self.sent, self.unanswered)
                if problem is not None:
                    return problem, block
            if self._rewrite is not None:
                new = self._rewrite(value)
                if new is not None:
                    rewritten = [] if rewritten is None else rewritten
                    rewritten.append(_event_bytes(event, jsonrpc.encode(new)))
        # A block holds one event (it ends at the first empty line): rewritten, that event replaces it.
        return None, block if rewritten is None else b"".join(rewritten)


def _event_bytes(event: Event, data: bytes) -> bytes:
    encoded = encode_event(data, event=event.event, event_id=event.id)
    return encoded if event.retry is None else b"retry: %d\n" % event.retry + encoded


def _bound(limit: int) -> str:
    return f"upstream.max_reply_bytes ({limit} bytes)"
