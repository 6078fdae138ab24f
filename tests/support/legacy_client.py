"""The minimal legacy (2024-11-05 .. 2025-11-25) Streamable HTTP client: sessions, replies read as JSON
or SSE with the tests' own parser (mcp_client.py), every message checked against the official schema
of the negotiated revision.

`LegacyClient` talks to the proxy in-process (aiohttp test client); `initialize`, `open_session`, `call`
and `delete` speak the same messages to a proxy process through an `mcp_client.Endpoint` (raw HTTP).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from proxy.protocol.headers import PROTOCOL_VERSION_HEADER, SESSION_HEADER
from proxy.protocol.versions import LATEST_LEGACY, legacy_at_least
from tests.support import raw_http_client
from tests.support.answers import assert_holds
from tests.support.mcp_client import ACCEPT, PATH, Endpoint, JSONDict, McpReply, content_type, read_messages
from tests.support.schema import server_message_errors

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


def request_message(request_id: Any, method: str, params: JSONDict | None = None) -> JSONDict:
    """A request (or, with `request_id` None, a notification); no `params` unless given."""
    message: JSONDict = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if request_id is None:
        del message["id"]
    if params is not None:
        message["params"] = params
    return message


def session_headers(session_id: str, version: str) -> dict[str, str]:
    """The headers that place a request in a session (the protocol version from 2025-06-18 on)."""
    headers = {SESSION_HEADER: session_id}
    if legacy_at_least(version, "2025-06-18"):
        headers[PROTOCOL_VERSION_HEADER] = version
    return headers


def check(revision: str, message: JSONDict, request_method: str | None = None) -> None:
    """Fail unless `message` is valid for `revision` (id-less errors: checked as 2025-11-25)."""
    if "error" in message and "id" not in message:
        revision = LATEST_LEGACY  # older revisions cannot express an error without an id
    problems = server_message_errors(revision, message, request_method)
    assert not problems, f"invalid {revision} message {message!r}: {problems}"


async def read_reply(
    response: ClientResponse, revision: str | None, request_method: str | None = None, request_id: Any = None
) -> McpReply:
    """Read a whole reply (JSON, a JSON batch, SSE, or empty) and validate every message in it.

    `revision` None defers validation to the caller (initialize: the revision is in the reply).
    """
    reply = McpReply(response.status, content_type(response), response.headers, request_id)
    await read_messages(response, reply, batches=True)
    if revision is not None:
        for message in reply.messages:
            check(revision, message, request_method if reply.is_final(message) else None)
    return reply


async def error_body(response: ClientResponse, revision: str = LATEST_LEGACY) -> JSONDict:
    """The JSON-RPC error an HTTP error reply carries (validated)."""
    assert content_type(response) == "application/json", f"expected JSON, got {response.headers}"
    message = json.loads(await response.read())
    assert "error" in message, message
    check(revision, message)
    error: JSONDict = message["error"]
    return error


class LegacyClient:
    """One initialized legacy session against the proxy, in-process."""

    def __init__(
        self, client: TestClient[Any, Any], version: str, session_id: str, headers: dict[str, str], initialize: JSONDict
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
        client: TestClient[Any, Any],
        version: str = LATEST_LEGACY,
        *,
        capabilities: JSONDict | None = None,
        client_info: JSONDict | None = None,
        headers: dict[str, str] | None = None,
        initialized: bool = True,
    ) -> LegacyClient:
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
        out = {"Accept": ACCEPT, "Content-Type": "application/json", **session_headers(self.session_id, self.version)}
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
        return request_id, await self.post(request_message(request_id, method, params), headers)

    async def request(
        self, method: str, params: JSONDict | None = None, *, id: Any = None, headers: dict[str, str] | None = None
    ) -> McpReply:
        """POST a request and read the whole (validated) reply."""
        request_id, response = await self.send(method, params, id=id, headers=headers)
        return await read_reply(response, self.version, method, request_id)

    async def _accepted(self, message: JSONDict) -> int:
        response = await self.post(message)
        body = await response.read()
        assert body == b"" or response.status >= 400, f"a 202 carries no body, got {body!r}"
        return response.status

    async def notify(self, method: str, params: JSONDict | None = None) -> int:
        return await self._accepted(request_message(None, method, params))

    async def respond(self, request_id: Any, result: JSONDict | None = None, error: JSONDict | None = None) -> int:
        message: JSONDict = {"jsonrpc": "2.0", "id": request_id}
        if error is not None:
            message["error"] = error
        else:
            message["result"] = result if result is not None else {}
        return await self._accepted(message)

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


# ---------------------------------------------------------------- a proxy process (raw HTTP)


def initialize(endpoint: Endpoint, capabilities: JSONDict | None = None) -> raw_http_client.Reply:
    """POST a 2025-11-25 initialize (client "t" 1, no capabilities unless given)."""
    return endpoint.post(initialize_message(LATEST_LEGACY, capabilities or {}, {"name": "t", "version": "1"}))


def open_session(endpoint: Endpoint, capabilities: JSONDict | None = None) -> str:
    """Initialize a session (its reply holding the answer invariant) and send `initialized`; its id."""
    reply = initialize(endpoint, capabilities)
    assert_holds(reply, "initialize")
    session = reply.header(SESSION_HEADER)
    assert reply.status == 200 and session, f"initialize failed: HTTP {reply.status} {reply.body[:400]!r}"
    done = endpoint.post(request_message(None, "notifications/initialized"), [(SESSION_HEADER, session)])
    assert done.status == 202, done
    return session


def call(
    endpoint: Endpoint,
    session: str,
    request_id: Any,
    method: str,
    params: JSONDict | None = None,
    when: tuple[bytes, Callable[[], None]] | None = None,
) -> raw_http_client.Reply:
    """POST a request in `session` (at 2025-11-25)."""
    headers: list[tuple[str, bytes | str]] = list(session_headers(session, LATEST_LEGACY).items())
    return endpoint.post(request_message(request_id, method, params), headers, when)


def delete(endpoint: Endpoint, session: str) -> raw_http_client.Reply:
    """DELETE `session`."""
    return endpoint.delete([(SESSION_HEADER, session)])
