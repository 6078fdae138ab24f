"""Several modern clients at once, each declaring different capabilities, through one proxy in
front of one real legacy server (mcp==1.30.0): each gets only its own input requests and its
own notifications, and a missing capability is reported the way a modern server reports it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from proxy.protocol import jsonrpc, meta
from proxy.protocol.sse import Decoder
from tests.support.schema import server_message_errors

pytestmark = pytest.mark.e2e
MODERN = "2026-07-28"


class ModernClient:
    """Hand-written 2026-07-28 requests, so each client's capabilities are exactly what we say."""

    def __init__(self, http: aiohttp.ClientSession, url: str, name: str, capabilities: dict[str, Any]) -> None:
        self.http, self.url, self.name, self.capabilities = http, url, name, capabilities
        self.ids = iter(range(1, 1000))
        self.received: list[dict[str, Any]] = []  # every message this client got, in order

    def request_body(
        self, method: str, params: dict[str, Any], *, log_level: str | None = None, progress: bool = False
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """A 2026-07-28 request and its headers, the envelope set from this client's profile."""
        request_id = next(self.ids)
        request_meta: dict[str, Any] = {
            meta.PROTOCOL_VERSION: MODERN,
            meta.CLIENT_CAPABILITIES: self.capabilities,
            meta.CLIENT_INFO: {"name": self.name, "version": "1"},
        }
        if log_level:
            request_meta[meta.LOG_LEVEL] = log_level
        if progress:
            request_meta["progressToken"] = f"{self.name}-progress"
        body = jsonrpc.request(request_id, method, {**params, "_meta": request_meta})
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": MODERN,
            "Mcp-Method": method,
        }
        if "name" in params:
            headers["Mcp-Name"] = params["name"]
        return body, headers

    async def call(
        self, method: str, params: dict[str, Any], *, log_level: str | None = None, progress: bool = False
    ) -> tuple[int, dict[str, Any]]:
        body, headers = self.request_body(method, params, log_level=log_level, progress=progress)
        request_id = body["id"]
        async with asyncio.timeout(20), self.http.post(self.url, data=json.dumps(body), headers=headers) as response:
            messages = await self._read(response)
        for message in messages:
            problems = server_message_errors(MODERN, message, method if message.get("id") == request_id else None)
            assert problems == [], problems
        self.received += messages
        final = [m for m in messages if m.get("id") == request_id]
        assert len(final) == 1, messages
        return response.status, final[0]

    @staticmethod
    async def _read(response: aiohttp.ClientResponse) -> list[dict[str, Any]]:
        if response.headers.get("Content-Type", "").startswith("text/event-stream"):
            decoder, out = Decoder(), []
            async for chunk in response.content.iter_any():
                out += [json.loads(e.data) for e in decoder.feed(chunk) if e.data.strip()]
            return out
        return [json.loads(await response.read())]

    async def tool_with_input(self, tool: str, arguments: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        """Call a tool, answer every round of input, return (the input methods asked, final)."""
        status, reply = await self.call("tools/call", {"name": tool, "arguments": arguments})
        assert status == 200, reply
        asked = [r["method"] for r in reply["result"]["inputRequests"].values()]
        assert reply["result"]["resultType"] == "input_required", reply
        responses = {key: answer for key in reply["result"]["inputRequests"]}
        status, final = await self.call(
            "tools/call",
            {
                "name": tool,
                "arguments": arguments,
                "inputResponses": responses,
                "requestState": reply["result"]["requestState"],
            },
        )
        assert status == 200, final
        return {"asked": asked, "result": final["result"]}

    def notifications(self) -> list[dict[str, Any]]:
        return [m for m in self.received if "method" in m and "id" not in m]


async def test_concurrent_clients_with_different_capabilities_each_get_only_their_own_input_and_notifications(
    proxy_to_legacy_server: str,
) -> None:
    async with aiohttp.ClientSession() as http:
        elicitor = ModernClient(http, proxy_to_legacy_server, "elicitor", {"elicitation": {}})
        sampler = ModernClient(http, proxy_to_legacy_server, "sampler", {"sampling": {}})
        rooted = ModernClient(http, proxy_to_legacy_server, "rooted", {"roots": {}})
        watcher = ModernClient(http, proxy_to_legacy_server, "watcher", {})
        elicited, sampled, listed, (progress_status, progressed), (log_status, logged) = await asyncio.gather(
            elicitor.tool_with_input("elicit", {"message": "who?"}, {"action": "accept", "content": {"name": "Ada"}}),
            sampler.tool_with_input(
                "sample",
                {"prompt": "hi"},
                {"role": "assistant", "content": {"type": "text", "text": "from-sampler"}, "model": "m"},
            ),
            rooted.tool_with_input("roots", {}, {"roots": [{"uri": "file:///rooted"}]}),
            watcher.call("tools/call", {"name": "progress", "arguments": {}}, progress=True),
            watcher.call("tools/call", {"name": "log", "arguments": {}}, log_level="debug"),
        )
    assert elicited["asked"] == ["elicitation/create"]
    assert elicited["result"]["content"][0]["text"] == "elicited: action=accept name=Ada"
    assert sampled["asked"] == ["sampling/createMessage"]
    assert sampled["result"]["content"][0]["text"] == "sampled: from-sampler"
    assert listed["asked"] == ["roots/list"]
    assert listed["result"]["content"][0]["text"] == "roots: file:///rooted"
    assert progress_status == log_status == 200
    assert progressed["result"]["content"][0]["text"] == "progress done"
    assert logged["result"]["content"][0]["text"] == "logged"
    # Notifications went to the one request that asked for them, and nowhere else.
    watcher_notes = watcher.notifications()
    assert [n["params"]["progressToken"] for n in watcher_notes if n["method"] == "notifications/progress"] == [
        "watcher-progress"
    ] * 3
    assert [n["params"]["level"] for n in watcher_notes if n["method"] == "notifications/message"] == [
        "debug",
        "info",
        "warning",
        "error",
    ]
    for other in (elicitor, sampler, rooted):
        assert other.notifications() == []


async def test_a_client_lacking_the_capability_a_legacy_tool_needs_gets_missing_capability(
    proxy_to_legacy_server: str,
) -> None:
    async with aiohttp.ClientSession() as http:
        client = ModernClient(http, proxy_to_legacy_server, "sampling-only", {"sampling": {}})
        status, reply = await client.call("tools/call", {"name": "elicit", "arguments": {"message": "who?"}})
        # The session still works afterwards: the refused call did not poison it.
        after_status, after = await client.call("tools/call", {"name": "echo", "arguments": {"text": "still here"}})
    assert status == 400
    assert reply["error"]["code"] == jsonrpc.MISSING_REQUIRED_CAPABILITY
    assert reply["error"]["data"]["requiredCapabilities"] == {"elicitation": {"form": {}}}
    assert after_status == 200 and after["result"]["content"][0]["text"] == "echo: still here", after
