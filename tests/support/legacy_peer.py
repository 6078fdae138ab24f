"""A minimal legacy (2024-11-05 .. 2025-11-25) Streamable HTTP client for integration tests.

It reads replies as JSON or SSE with its own small SSE parser (not the proxy's), and checks
every message the proxy sends against the official schema of the negotiated revision.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from proxy.protocol.headers import PROTOCOL_VERSION_HEADER, SESSION_HEADER
from proxy.protocol.versions import LATEST_LEGACY, legacy_at_least
from tests.support.schema import server_message_errors

JSONDict = dict[str, Any]
ACCEPT = "application/json, text/event-stream"
PATH = "/mcp"
VISIBLE_ASCII = frozenset(chr(c) for c in range(0x21, 0x7F))
FULL_CAPABILITIES: JSONDict = {
    "roots": {"listChanged": True},
    "sampling": {},
    "elicitation": {"form": {}},
}
CLIENT_INFO = {"name": "legacy-test-client", "version": "0.0.1"}


def initialize_message(
    version: str = LATEST_LEGACY, capabilities: JSONDict | None = None, client_info: JSONDict | None = None
) -> JSONDict:
    return {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": FULL_CAPABILITIES if capabilities is None else capabilities,
            "clientInfo": client_info or CLIENT_INFO,
        },
    }


def check(revision: str, message: JSONDict, request_method: str | None = None) -> None:
    """Fail unless `message` is valid for `revision` (id-less errors: checked as 2025-11-25)."""
    if "error" in message and "id" not in message:
        revision = LATEST_LEGACY  # older revisions cannot express an error without an id
    problems = server_message_errors(revision, message, request_method)
    assert not problems, f"invalid {revision} message {message!r}: {problems}"


class SseReader:
    """Incremental reader of an SSE response body: messages, comments and the end."""

    def __init__(self, response: ClientResponse) -> None:
        self.response = response
        self.comments = 0
        self.event_ids: list[str] = []

    async def _event(self, *, stop_at_comment: bool = False) -> str | None:
        data: list[str] = []
        while True:
            raw = await self.response.content.readline()
            if not raw:
                return "\n".join(data) if data else None
            line = raw.decode("utf-8").rstrip("\r\n")
            if line == "":
                text = "\n".join(data)
                data = []
                if text:  # an event with empty data (a priming event: only an id) is not dispatched
                    return text
                continue
            if line.startswith(":"):
                self.comments += 1
                if stop_at_comment:
                    return ""
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                data.append(value)
            elif name == "id":
                self.event_ids.append(value)

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


@dataclass
class Reply:
    """Everything one POST got back."""

    status: int
    content_type: str
    headers: Any
    messages: list[JSONDict] = field(default_factory=list)
    request_id: Any = None

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
        assert final is not None and "result" in final, f"expected a result, got {self.messages!r}"
        return final["result"]

    @property
    def error(self) -> JSONDict:
        final = self.final
        assert final is not None and "error" in final, f"expected an error, got {self.messages!r}"
        return final["error"]

    @property
    def interim(self) -> list[JSONDict]:
        return [m for m in self.messages if m is not self.final]


def content_type(response: ClientResponse) -> str:
    return response.headers.get("Content-Type", "").split(";")[0].strip().lower()


async def read_reply(
    response: ClientResponse, revision: str | None, request_method: str | None = None, request_id: Any = None
) -> Reply:
    """Read a whole reply (JSON, SSE, or empty) and validate every message in it.

    `revision` None defers validation to the caller (initialize: the revision is in the reply).
    """
    reply = Reply(response.status, content_type(response), response.headers, request_id=request_id)
    if reply.content_type == "text/event-stream":
        reader = SseReader(response)
        while (message := await reader.message()) is not None:
            reply.messages.append(message)
    else:
        body = await response.read()
        if body:
            assert reply.content_type == "application/json", f"non-JSON body {body[:200]!r}"
            decoded = json.loads(body)
            reply.messages.extend(decoded if isinstance(decoded, list) else [decoded])
    if revision is not None:
        for message in reply.messages:
            is_final = "method" not in message and message.get("id") == request_id
            check(revision, message, request_method if is_final else None)
    return reply


async def error_body(response: ClientResponse, revision: str = LATEST_LEGACY) -> JSONDict:
    """The JSON-RPC error an HTTP error reply carries (validated)."""
    assert content_type(response) == "application/json", f"expected JSON, got {response.headers}"
    message = json.loads(await response.read())
    assert "error" in message, message
    check(revision, message)
    return message["error"]


class LegacyPeer:
    """One initialized legacy session against the proxy."""

    def __init__(
        self, client: TestClient, version: str, session_id: str, headers: dict[str, str], initialize: JSONDict
    ) -> None:
        self.client = client
        self.version = version
        self.session_id = session_id
        self.base_headers = headers
        self.initialize_result = initialize
        self._ids = itertools.count(1)

    @classmethod
    async def connect(
        cls,
        client: TestClient,
        version: str = LATEST_LEGACY,
        *,
        capabilities: JSONDict | None = None,
        client_info: JSONDict | None = None,
        headers: dict[str, str] | None = None,
        initialized: bool = True,
    ) -> LegacyPeer:
        message = initialize_message(version, capabilities, client_info)
        extra = dict(headers or {})
        response = await client.post(PATH, json=message, headers={"Accept": ACCEPT, **extra})
        assert response.status == 200, await response.text()
        reply = await read_reply(response, None, "initialize", 0)
        negotiated = reply.result["protocolVersion"]
        assert len(reply.messages) == 1, reply.messages
        check(negotiated, reply.messages[0], "initialize")
        session_id = response.headers.get(SESSION_HEADER)
        assert session_id, "initialize must mint a session id"
        peer = cls(client, negotiated, session_id, extra, reply.result)
        if initialized:
            assert await peer.notify("notifications/initialized") == 202
        return peer

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        out = {"Accept": ACCEPT, "Content-Type": "application/json", SESSION_HEADER: self.session_id}
        if legacy_at_least(self.version, "2025-06-18"):
            out[PROTOCOL_VERSION_HEADER] = self.version
        out.update(self.base_headers)
        out.update(extra or {})
        return out

    def next_id(self) -> int:
        return next(self._ids)

    async def post(self, message: Any, headers: dict[str, str] | None = None) -> ClientResponse:
        """POST a message (bytes are sent as they are) inside this session."""
        data = message if isinstance(message, bytes) else json.dumps(message).encode()
        return await self.client.post(PATH, data=data, headers=self.headers(headers))

    async def send(
        self, method: str, params: JSONDict | None = None, *, id: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[Any, ClientResponse]:
        """POST a request; return its id and the response (body not read yet)."""
        request_id = self.next_id() if id is None else id
        message: JSONDict = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        return request_id, await self.post(message, headers)

    async def request(
        self, method: str, params: JSONDict | None = None, *, id: Any = None, headers: dict[str, str] | None = None
    ) -> Reply:
        """POST a request and read the whole (validated) reply."""
        request_id, response = await self.send(method, params, id=id, headers=headers)
        return await read_reply(response, self.version, method, request_id)

    async def notify(self, method: str, params: JSONDict | None = None) -> int:
        message: JSONDict = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        response = await self.post(message)
        body = await response.read()
        assert body == b"" or response.status >= 400, f"a 202 carries no body, got {body!r}"
        return response.status

    async def respond(self, request_id: Any, result: JSONDict | None = None, error: JSONDict | None = None) -> int:
        message: JSONDict = {"jsonrpc": "2.0", "id": request_id}
        if error is not None:
            message["error"] = error
        else:
            message["result"] = result if result is not None else {}
        response = await self.post(message)
        body = await response.read()
        assert body == b"" or response.status >= 400, f"a 202 carries no body, got {body!r}"
        return response.status

    async def get_stream(self, headers: dict[str, str] | None = None) -> ClientResponse:
        hdrs = self.headers(headers)
        hdrs["Accept"] = "text/event-stream"
        hdrs.pop("Content-Type")
        return await self.client.get(PATH, headers=hdrs)

    async def delete(self, headers: dict[str, str] | None = None) -> ClientResponse:
        hdrs = self.headers(headers)
        hdrs.pop("Content-Type")
        return await self.client.delete(PATH, headers=hdrs)

    def check(self, message: JSONDict, request_method: str | None = None) -> None:
        check(self.version, message, request_method)
