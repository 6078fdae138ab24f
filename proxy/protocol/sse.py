"""Server-Sent Events codec, sans-IO: bytes in, events out; events in, bytes out."""

from __future__ import annotations

from dataclasses import dataclass

KEEPALIVE = b":\n\n"


@dataclass(frozen=True, slots=True)
class Event:
    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


def encode_event(data: bytes, *, event: str | None = None, event_id: str | None = None) -> bytes:
    """One SSE event whose data is a single JSON document (which never contains a newline)."""
    head = b""
    if event_id is not None:
        head += b"id: " + event_id.encode() + b"\n"
    if event is not None:
        head += b"event: " + event.encode() + b"\n"
    if b"\n" in data or b"\r" in data:
        lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        return head + b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"
    return head + b"data: " + data + b"\n\n"


class Decoder:
    """Incremental SSE parser (WHATWG rules): feed chunks split anywhere, get whole events."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[Event]:
        data = self._buffer + chunk if self._buffer else chunk
        self._buffer = b""
        events: list[Event] = []
        lines = data.splitlines(keepends=True)  # bytes split only on \n, \r and \r\n
        last = len(lines) - 1
        for index, line in enumerate(lines):
            if line.endswith(b"\r\n"):
                content = line[:-2]
            elif line.endswith(b"\n"):
                content = line[:-1]
            elif line.endswith(b"\r") and index < last:
                content = line[:-1]
            else:
                # Unterminated, or a CR that may be the first half of a CRLF split by the chunking.
                self._buffer = line
                break
            event = self._line(content.decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
        return events

    def _line(self, line: str) -> Event | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None  # comment / keep-alive
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)
        return None

    def _dispatch(self) -> Event | None:
        if not self._data:
            self._event = ""
            return None
        event = Event("\n".join(self._data), self._event or "message", self._id, self._retry)
        self._data = []
        self._event = ""
        return event
