"""The minimal 2026-07-28 Streamable HTTP client.

Every request carries the per-request `_meta` envelope (protocolVersion, clientCapabilities,
clientInfo, optionally logLevel) and the headers a modern client must send (MCP-Protocol-Version,
Mcp-Method, Mcp-Name) computed from the body; a test breaks any of them on purpose with
`headers={name: None | value}` or by editing the message. Replies are read as JSON or SSE with the
tests' own parser (mcp_client.py), and every message is checked against the 2026-07-28 schema. Modern
replies must never carry a session id.

`ModernClient` talks to the proxy in-process (aiohttp test client, streams a test can close);
`call` speaks the same requests to a proxy process through an `mcp_client.Endpoint` (raw HTTP).
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
from collections.abc import Callable
from typing import Any

from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from proxy.protocol import meta
from proxy.protocol.headers import METHOD_HEADER, NAME_HEADER, PROTOCOL_VERSION_HEADER, SESSION_HEADER
from proxy.protocol.versions import LATEST_MODERN
from tests.support import raw_http_client
from tests.support.mcp_client import (
    ACCEPT,
    PATH,
    Endpoint,
    JSONDict,
    McpReply,
    SseReader,
    content_type,
    read_messages,
)
from tests.support.schema import server_message_errors

MODERN = LATEST_MODERN
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


def envelope(
    capabilities: JSONDict,
    client_info: JSONDict | None = None,
    *,
    log_level: str | None = None,
    version: str = MODERN,
) -> JSONDict:
    """The per-request `_meta` envelope (without clientInfo when `client_info` is None)."""
    out: JSONDict = {meta.PROTOCOL_VERSION: version, meta.CLIENT_CAPABILITIES: copy.deepcopy(capabilities)}
    if client_info is not None:
        out[meta.CLIENT_INFO] = client_info
    if log_level is not None:
        out[meta.LOG_LEVEL] = log_level
    return out


def _object(value: Any) -> JSONDict:
    return value if isinstance(value, dict) else {}


def request_message(request_id: Any, method: str, params: JSONDict | None, request_envelope: JSONDict) -> JSONDict:
    """A request with `request_envelope` under `params._meta` (the message's own `_meta` keys win)."""
    body = copy.deepcopy(params) if params else {}
    body["_meta"] = {**request_envelope, **_object(body.get("_meta"))}
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": body}


def routing_headers(
    method: str, name: str | None = None, version: str = MODERN, *, raw_name: bool = False
) -> dict[str, str]:
    """The headers a 2026-07-28 request carries beside its body (`raw_name`: Mcp-Name not encoded)."""
    headers = {PROTOCOL_VERSION_HEADER: version, METHOD_HEADER: method}
    if name is not None:
        headers[NAME_HEADER] = name if raw_name else header_value(name)
    return headers


def headers_for(message: Any) -> dict[str, str]:
    """The routing headers computed from `message`'s body (none but the version for a non-request)."""
    if not isinstance(message, dict):
        return {}
    params = _object(message.get("params"))
    version = _object(params.get("_meta")).get(meta.PROTOCOL_VERSION)
    version = version if isinstance(version, str) else MODERN
    method = message.get("method")
    if not isinstance(method, str):
        return {PROTOCOL_VERSION_HEADER: version}
    name = params.get(NAME_FIELDS.get(method, ""))
    return routing_headers(method, name if isinstance(name, str) else None, version)


def check(message: JSONDict, request_method: str | None = None) -> None:
    problems = server_message_errors(MODERN, message, request_method)
    assert not problems, f"invalid {MODERN} message {message!r}: {problems}"


async def read_reply(response: ClientResponse, message: Any) -> McpReply:
    """Read a whole reply (JSON, SSE, or empty) and validate every message in it."""
    request_method = message.get("method") if isinstance(message, dict) else None
    request_id = message.get("id") if isinstance(message, dict) else None
    assert SESSION_HEADER not in response.headers, "a modern reply must never carry a session id"
    reply = McpReply(response.status, content_type(response), response.headers, request_id)
    if reply.content_type == "text/event-stream":
        assert response.headers.get("X-Accel-Buffering") == "no"
    await read_messages(response, reply, batches=False)
    for item in reply.messages:
        check(item, request_method if reply.is_final(item) else None)
    return reply


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


class ModernClient:
    """A modern client, in-process: no session, everything it is and can do travels with each request."""

    def __init__(
        self,
        http: TestClient[Any, Any],
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
        chosen = self.capabilities if capabilities is None else capabilities
        return envelope(chosen, self.client_info, log_level=log_level, version=version)

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
        request_id = self.next_id() if id is _DEFAULT else id
        request_envelope = self.envelope(capabilities=capabilities, log_level=log_level, version=version)
        return request_message(request_id, method, params, request_envelope)

    def headers(self, message: Any, overrides: dict[str, str | None] | None = None) -> dict[str, str]:
        """The headers a modern client sends for `message`; `overrides` sets (or with None, drops) some."""
        headers: dict[str, str] = {"Accept": ACCEPT, "Content-Type": "application/json", **self.base_headers}
        headers.update(headers_for(message))
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
    ) -> McpReply:
        """POST a request and read the whole (validated) reply."""
        message, response = await self.send(method, params, headers=headers, **options)
        return await read_reply(response, message)

    def stream(self, response: ClientResponse, message: JSONDict) -> ModernStream:
        return ModernStream(response, message.get("method"), message.get("id"))


# ---------------------------------------------------------------- a proxy process (raw HTTP)


def call(
    endpoint: Endpoint,
    request_id: Any,
    method: str,
    params: JSONDict | None = None,
    capabilities: JSONDict | None = None,
    when: tuple[bytes, Callable[[], None]] | None = None,
) -> raw_http_client.Reply:
    """POST a request (an envelope without clientInfo; no capabilities unless given) with the routing
    headers computed from it."""
    message = request_message(request_id, method, params, envelope(capabilities or {}))
    return endpoint.post(message, list(headers_for(message).items()), when)
