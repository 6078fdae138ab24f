"""What the two minimal MCP clients (`legacy_client.py`, `modern_client.py`) share, era-neutral: the wire
constants, an SSE parser of the tests' own (not the proxy's), a reply read whole into its JSON-RPC
messages, and `Endpoint`, a proxy process reached over the raw HTTP client (raw_http_client.py) for
suites that must see status, headers, framing and the close; Prometheus samples."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from aiohttp import ClientResponse

from tests.support import raw_http_client

JSONDict = dict[str, Any]
ACCEPT = "application/json, text/event-stream"
PATH = "/mcp"


# ---------------------------------------------------------------- SSE


class SseParser:
    """SSE fed line by line: the data of each event, comments counted, event ids kept."""

    def __init__(self) -> None:
        self.comments = 0
        self.event_ids: list[str] = []
        self._data: list[str] = []

    def line(self, line: str) -> str | None:
        """Feed one line (without its end): the data of an event it completes, "" for a comment, else None."""
        if line == "":
            text = "\n".join(self._data)
            self._data = []
            return text or None  # an event with empty data (a priming event: only an id) is not dispatched
        if line.startswith(":"):
            self.comments += 1
            return ""
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "id":
            self.event_ids.append(value)
        return None

    def end(self) -> str | None:
        """At the end of the stream: the data of an unterminated last event, if any."""
        text = "\n".join(self._data) if self._data else None
        self._data = []
        return text


class SseReader:
    """Incremental reader of an SSE response body (aiohttp): messages, comments and the end."""

    def __init__(self, response: ClientResponse) -> None:
        self.response = response
        self._parser = SseParser()

    @property
    def comments(self) -> int:
        return self._parser.comments

    @property
    def event_ids(self) -> list[str]:
        return self._parser.event_ids

    async def _event(self, *, stop_at_comment: bool = False) -> str | None:
        while True:
            raw = await self.response.content.readline()
            if not raw:
                return self._parser.end()
            text = self._parser.line(raw.decode("utf-8").rstrip("\r\n"))
            if text is None or (text == "" and not stop_at_comment):
                continue
            return text

    async def message(self) -> JSONDict | None:
        """The next JSON-RPC message, or None at the end of the stream."""
        text = await self._event()
        return None if text is None else json.loads(text)

    async def comment(self) -> bool:
        """Read until a comment line; False if the stream ended first."""
        while True:
            text = await self._event(stop_at_comment=True)
            if text is None:
                return False
            if text == "":
                return True


def sse_messages(body: bytes) -> list[JSONDict]:
    """The JSON-RPC messages of a whole SSE body (an unterminated last event included)."""
    parser = SseParser()
    texts = [parser.line(line.decode("utf-8", errors="replace")) for line in body.splitlines()]
    texts.append(parser.end())
    return [json.loads(text) for text in texts if text and text.startswith("{")]


# ---------------------------------------------------------------- replies


@dataclass
class McpReply:
    """Everything one POST got back."""

    status: int
    content_type: str
    headers: Any
    request_id: Any = None
    messages: list[JSONDict] = field(default_factory=list)

    @property
    def final(self) -> JSONDict | None:
        """The response to the request (None when none came)."""
        for message in self.messages:
            if "method" not in message and message.get("id") == self.request_id:
                return message
        return None

    @property
    def result(self) -> JSONDict:
        final = self.final
        assert final is not None and "result" in final, f"expected a result, got {self.status} {self.messages!r}"
        result: JSONDict = final["result"]
        return result

    @property
    def error(self) -> JSONDict:
        final = self.final
        assert final is not None and "error" in final, f"expected an error, got {self.status} {self.messages!r}"
        error: JSONDict = final["error"]
        return error

    @property
    def interim(self) -> list[JSONDict]:
        """Every message but the response."""
        return [m for m in self.messages if m is not self.final]

    @property
    def notes(self) -> list[JSONDict]:
        """The notifications that preceded the response."""
        return [m for m in self.messages if "method" in m and "id" not in m]

    def is_final(self, message: JSONDict) -> bool:
        return "method" not in message and message.get("id") == self.request_id


def content_type(response: ClientResponse) -> str:
    return response.headers.get("Content-Type", "").split(";")[0].strip().lower()


async def read_messages(response: ClientResponse, reply: McpReply, *, batches: bool) -> McpReply:
    """Read a whole reply (JSON, SSE, or empty) into `reply.messages`; `batches`: a JSON array is its
    messages (otherwise it is one message)."""
    if reply.content_type == "text/event-stream":
        reader = SseReader(response)
        while (message := await reader.message()) is not None:
            reply.messages.append(message)
    else:
        body = await response.read()
        if body:
            assert reply.content_type == "application/json", f"non-JSON body {body[:200]!r}"
            decoded = json.loads(body)
            reply.messages.extend(decoded if batches and isinstance(decoded, list) else [decoded])
    return reply


def messages_of(reply: raw_http_client.Reply) -> list[JSONDict]:
    """The JSON-RPC messages of a raw reply, JSON body or SSE stream."""
    if reply.content_type == "application/json" and reply.body:
        value = json.loads(reply.body)
        return value if isinstance(value, list) else [value]
    if reply.content_type == "text/event-stream":
        return sse_messages(reply.body)
    return []


def answer_to(reply: raw_http_client.Reply, request_id: Any) -> JSONDict | None:
    """The response to `request_id` in a raw reply, if any."""
    for message in messages_of(reply):
        if message.get("id") == request_id and ("result" in message or "error" in message):
            return message
    return None


# ---------------------------------------------------------------- a proxy process

Headers = list[tuple[str, bytes | str]]


@dataclass
class Endpoint:
    """A proxy process's MCP endpoint over raw HTTP; each era's client (`legacy_client`, `modern_client`)
    speaks through it."""

    url: str
    timeout: float = 30.0
    authorization: str | None = None  # sent with every request when set (the caller's identity)

    @property
    def port(self) -> int:
        port = urlsplit(self.url).port
        assert port is not None
        return port

    @property
    def path(self) -> str:
        return urlsplit(self.url).path

    def post(
        self, body: Any, headers: Headers | None = None, when: tuple[bytes, Callable[[], None]] | None = None
    ) -> raw_http_client.Reply:
        raw = json.dumps(body).encode()
        base: Headers = [("Content-Type", "application/json"), ("Accept", ACCEPT)]
        if self.authorization is not None:
            base.append(("Authorization", self.authorization))
        request = raw_http_client.build("POST", self.path, [*base, *(headers or [])], raw)
        return raw_http_client.exchange(self.port, request, timeout=self.timeout, when=when)

    def get(self, path: str) -> raw_http_client.Reply:
        return raw_http_client.exchange(self.port, raw_http_client.build("GET", path, []), timeout=self.timeout)

    def delete(self, headers: Headers) -> raw_http_client.Reply:
        request = raw_http_client.build("DELETE", self.path, headers)
        return raw_http_client.exchange(self.port, request, timeout=self.timeout)

    def metrics(self) -> str:
        return self.get("/metrics").body.decode()


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when none)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        series, _, label_text = head.partition("{")
        if series != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(value)
    return total
