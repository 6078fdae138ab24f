"""A 2024-11-05 HTTP+SSE client for in-process tests: the event stream of GET /sse open, POSTing
to the endpoint its first event named (docs/use/pairings.md, HTTP+SSE clients)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urljoin, urlsplit

from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

WAIT = 10.0
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2024-11-05",
        "capabilities": {"roots": {}, "sampling": {}},
        "clientInfo": {"name": "sse-client", "version": "1"},
    },
}


class SseClient:
    """One HTTP+SSE client: the event stream open, posting to the endpoint it named."""

    def __init__(self, client: TestClient, response: ClientResponse, headers: dict[str, str]) -> None:
        self.client = client
        self.response = response
        self.headers = headers
        self.endpoint = ""
        self.seen: list[dict[str, Any]] = []

    async def event(self) -> tuple[str, str] | None:
        """The next (event name, data); None at the end of the stream."""
        name, data = "message", []
        while True:
            raw = await asyncio.wait_for(self.response.content.readline(), WAIT)
            if not raw:
                return None
            line = raw.decode().rstrip("\r\n")
            if not line:
                if data:
                    return name, "\n".join(data)
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)

    async def message(self, match: Any = lambda m: True) -> dict[str, Any]:
        for seen in self.seen:
            if match(seen):
                self.seen.remove(seen)
                return seen
        while True:
            got = await self.event()
            assert got is not None, "the stream ended"
            name, data = got
            assert name == "message", got
            message = json.loads(data)
            if match(message):
                return message
            self.seen.append(message)

    async def post(self, body: Any, headers: dict[str, str] | None = None) -> ClientResponse:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return await self.client.post(
            self.endpoint, data=data, headers={"Content-Type": "application/json", **self.headers, **(headers or {})}
        )

    async def request(self, request_id: Any, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            body["params"] = params
        posted = await self.post(body)
        assert posted.status == 202, await posted.text()
        return await self.message(lambda m: m.get("id") == request_id and "method" not in m)

    async def initialize(self) -> dict[str, Any]:
        reply = await self.request(0, "initialize", INITIALIZE["params"])
        posted = await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert posted.status == 202
        return reply


@asynccontextmanager
async def sse_client(
    http: TestClient, headers: dict[str, str] | None = None, post_via: TestClient | None = None
) -> AsyncIterator[SseClient]:
    """The stream opened on `http`; its messages posted there too, or through `post_via` (another
    replica behind the same balancer)."""
    response = await http.get("/sse", headers={"Accept": "text/event-stream", **(headers or {})})
    assert response.status == 200, await response.text()
    assert response.headers["Content-Type"].startswith("text/event-stream")
    client = SseClient(post_via or http, response, headers or {})
    first = await client.event()
    assert first is not None and first[0] == "endpoint", first
    named = urlsplit(urljoin(str(response.url), first[1]))
    assert named.netloc == response.url.raw_authority  # on the stream's own origin
    client.endpoint = f"{named.path}?{named.query}"
    try:
        yield client
    finally:
        response.close()
