"""A minimal 2026-07-28 Streamable HTTP client for integration tests.

Every request carries the per-request `_meta` envelope (protocolVersion, clientCapabilities,
clientInfo, optionally logLevel) and the headers a modern client must send (MCP-Protocol-Version,
Mcp-Method, Mcp-Name) computed from the body; a test breaks any of them on purpose with
`headers={name: None | value}` or by editing the message. Replies are read as JSON or SSE with
the SSE parser of legacy_peer (not the proxy's), and every message is checked against the
2026-07-28 schema. Modern replies must never carry a session id.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from proxy.protocol import meta
from proxy.protocol.headers import METHOD_HEADER, NAME_HEADER, PROTOCOL_VERSION_HEADER, SESSION_HEADER
from proxy.protocol.versions import LATEST_MODERN
from tests.support.legacy_peer import SseReader, content_type
from tests.support.schema import server_message_errors

JSONDict = dict[str, Any]
MODERN = LATEST_MODERN
ACCEPT = "application/json, text/event-stream"
PATH = "/mcp"
CLIENT_INFO = {"name": "modern-test-client", "version": "0.0.1"}
FULL_CAPABILITIES: JSONDict = {
    "roots": {},
    "sampling": {"context": {}, "tools": {}},
    "elicitation": {"form": {}, "url": {}},
}
# Which body field a name-bearing method mirrors into Mcp-Name (2026-07-28 streamable-http.mdx).
NAME_FIELDS = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
    # the tasks extension (specification/draft/tasks.md, "Streamable HTTP: Routing Headers")
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
}
_DEFAULT: Any = object()


def header_value(value: str) -> str:
    """Header encoding written independently of the proxy's: base64 sentinel unless plain visible ASCII."""
    plain = (
        all(0x20 <= ord(c) <= 0x7E for c in value)
        and value == value.strip(" \t")
        and not (value.startswith("=?base64?") and value.endswith("?="))
    )
    return value if plain else "=?base64?" + base64.b64encode(value.encode()).decode("ascii") + "?="


def check(message: JSONDict, request_method: str | None = None) -> None:
    problems = server_message_errors(MODERN, message, request_method)
    assert not problems, f"invalid {MODERN} message {message!r}: {problems}"


@dataclass
class ModernReply:
    """Everything one POST got back."""

    status: int
    content_type: str
    headers: Any
    request_id: Any
    messages: list[JSONDict] = field(default_factory=list)

    @property
    def final(self) -> JSONDict | None:
        for message in self.messages:
            if "method" not in message and message.get("id") == self.request_id:
                return message
        return None

    @property
    def result(self) -> JSONDict:
        final = self.final
        assert final is not None and "result" in final, f"expected a result, got {self.status} {self.messages!r}"
        return final["result"]

    @property
    def error(self) -> JSONDict:
        final = self.final
        assert final is not None and "error" in final, f"expected an error, got {self.status} {self.messages!r}"
        return final["error"]

    @property
    def notes(self) -> list[JSONDict]:
        """The notifications that preceded the response."""
        return [m for m in self.messages if "method" in m and "id" not in m]


class ModernStream:
    """An SSE reply read message by message (listen streams, or a reply the test closes early)."""

    def __init__(self, response: ClientResponse, request_method: str | None, request_id: Any) -> None:
        assert response.status == 200, response.status
        assert content_type(response) == "text/event-stream", response.headers
        assert response.headers.get("X-Accel-Buffering") == "no"
        assert SESSION_HEADER not in response.headers
        self.response = response
        self.request_method = request_method
        self.request_id = request_id
        self._reader = SseReader(response)

    async def next(self) -> JSONDict | None:
        """The next message (validated), or None at the end of the stream."""
        message = await self._reader.message()
        if message is not None:
            is_final = "method" not in message and message.get("id") == self.request_id
            check(message, self.request_method if is_final else None)
        return message

    async def comment(self) -> bool:
        """Read up to the next comment (a keep-alive); False if the stream ended first."""
        return await self._reader.comment()

    def close(self) -> None:
        """Close the connection: for 2026-07-28, the cancellation of the request."""
        self.response.close()


class ModernPeer:
    """A modern client: no session, everything it is and can do travels with each request."""

    def __init__(
        self,
        http: TestClient,
        *,
        capabilities: JSONDict | None = None,
        client_info: JSONDict | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.http = http
        self.capabilities = copy.deepcopy(FULL_CAPABILITIES if capabilities is None else capabilities)
        self.client_info = client_info or CLIENT_INFO
        self.base_headers = dict(headers or {})
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        return next(self._ids)

    def envelope(
        self, *, capabilities: JSONDict | None = None, log_level: str | None = None, version: str = MODERN
    ) -> JSONDict:
        envelope: JSONDict = {
            meta.PROTOCOL_VERSION: version,
            meta.CLIENT_CAPABILITIES: copy.deepcopy(self.capabilities if capabilities is None else capabilities),
            meta.CLIENT_INFO: self.client_info,
        }
        if log_level is not None:
            envelope[meta.LOG_LEVEL] = log_level
        return envelope

    def message(
        self,
        method: str,
        params: JSONDict | None = None,
        *,
        id: Any = _DEFAULT,
        capabilities: JSONDict | None = None,
        log_level: str | None = None,
        version: str = MODERN,
    ) -> JSONDict:
        """A request with the `_meta` envelope merged into `params._meta` (a fresh id unless given)."""
        body = copy.deepcopy(params) if params else {}
        own_meta = body.get("_meta") if isinstance(body.get("_meta"), dict) else {}
        body["_meta"] = {**self.envelope(capabilities=capabilities, log_level=log_level, version=version), **own_meta}
        return {"jsonrpc": "2.0", "id": self.next_id() if id is _DEFAULT else id, "method": method, "params": body}

    def headers(self, message: Any, overrides: dict[str, str | None] | None = None) -> dict[str, str]:
        """The headers a modern client sends for `message`; `overrides` sets (or with None, drops) some."""
        headers: dict[str, str] = {"Accept": ACCEPT, "Content-Type": "application/json", **self.base_headers}
        if isinstance(message, dict):
            params = message.get("params") if isinstance(message.get("params"), dict) else {}
            request_meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
            version = request_meta.get(meta.PROTOCOL_VERSION)
            headers[PROTOCOL_VERSION_HEADER] = version if isinstance(version, str) else MODERN
            method = message.get("method")
            if isinstance(method, str):
                headers[METHOD_HEADER] = method
                name = params.get(NAME_FIELDS.get(method, ""))
                if isinstance(name, str):
                    headers[NAME_HEADER] = header_value(name)
        for name, value in (overrides or {}).items():
            for present in [h for h in headers if h.lower() == name.lower()]:
                del headers[present]
            if value is not None:
                headers[name] = value
        return headers

    async def post(self, message: Any, headers: dict[str, str | None] | None = None) -> ClientResponse:
        """POST a message (bytes are sent as they are) with the headers computed for it."""
        data = message if isinstance(message, bytes) else json.dumps(message).encode()
        return await self.http.post(PATH, data=data, headers=self.headers(message, headers))

    async def send(
        self,
        method: str,
        params: JSONDict | None = None,
        *,
        headers: dict[str, str | None] | None = None,
        **options: Any,
    ) -> tuple[JSONDict, ClientResponse]:
        """POST a request; return it and the response (body not read yet)."""
        message = self.message(method, params, **options)
        return message, await self.post(message, headers)

    async def request(
        self,
        method: str,
        params: JSONDict | None = None,
        *,
        headers: dict[str, str | None] | None = None,
        **options: Any,
    ) -> ModernReply:
        """POST a request and read the whole (validated) reply."""
        message, response = await self.send(method, params, headers=headers, **options)
        return await read_reply(response, message)

    def stream(self, response: ClientResponse, message: JSONDict) -> ModernStream:
        return ModernStream(response, message.get("method"), message.get("id"))


async def read_reply(response: ClientResponse, message: Any) -> ModernReply:
    """Read a whole reply (JSON, SSE, or empty) and validate every message in it."""
    request_method = message.get("method") if isinstance(message, dict) else None
    request_id = message.get("id") if isinstance(message, dict) else None
    assert SESSION_HEADER not in response.headers, "a modern reply must never carry a session id"
    reply = ModernReply(response.status, content_type(response), response.headers, request_id)
    if reply.content_type == "text/event-stream":
        assert response.headers.get("X-Accel-Buffering") == "no"
        reader = SseReader(response)
        while (item := await reader.message()) is not None:
            reply.messages.append(item)
    else:
        body = await response.read()
        if body:
            assert reply.content_type == "application/json", f"non-JSON body {body[:200]!r}"
            reply.messages.append(json.loads(body))
    for item in reply.messages:
        is_final = "method" not in item and item.get("id") == request_id
        check(item, request_method if is_final else None)
    return reply
