"""A scripted MCP server of either era that misbehaves on request, for fault injection, run as a
process: the scripted upstream of its era (tests/support/fake_legacy.py, tests/support/fake_modern.py)
with the faults as its tools. From the repository's root:

    python -m tests.support.fault_upstream --era modern --port 9000

The fault is chosen per call by the tool's name, so one server serves a faulty call and sound
ones side by side: `echo` answers; `fault_<mode>` misbehaves (FAULTS lists them). `POST
/control/forget` drops every legacy session (the next request of each gets 404), `POST
/control/health` answers 200. (Over stdio: tests/support/stdio_server.py, $STDIO_SERVER_FAULT.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from aiohttp import web

from tests.support.fake_legacy import Call as LegacyCall
from tests.support.fake_legacy import FakeLegacy
from tests.support.fake_modern import Call as ModernCall
from tests.support.fake_modern import FakeModern, Outcome, Reply

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
SERVER_INFO = {"name": "fault-upstream", "version": "1"}

# Faults a tools/call can ask for, over HTTP, with what the client should be told.
FAULTS = {
    "kill": "the connection is cut after part of an SSE reply",
    "hang": "the request is accepted and never answered",
    "html": "an HTML 502 page",
    "invalid_json": "a 200 whose body is not JSON",
    "not_jsonrpc": "a 200 whose JSON is not JSON-RPC",
    "empty": "a 200 with an empty body",
    "wrong_id": "a reply under another request's id",
    "truncated_sse": "an SSE stream that ends in the middle of an event, without a reply",
    "endless_sse": "an SSE stream of keep-alives that never carries the reply",
    "truncated_json": "a JSON body shorter than its Content-Length says",
    "huge": "a valid 3 MiB result (must be relayed, not refused)",
    "split": "a valid reply written in two parts 200 ms apart (must be relayed)",
}
TOOLS = [
    {
        "name": "echo",
        "description": "Echo text.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
    *(
        {"name": f"fault_{mode}", "description": text, "inputSchema": {"type": "object"}}
        for mode, text in FAULTS.items()
    ),
]


def result_of(era: str, text: str) -> dict[str, Any]:
    content = {"content": [{"type": "text", "text": text}]}
    return {"resultType": "complete", **content} if era == "modern" else content


Call = LegacyCall | ModernCall


def web_request(call: Call) -> web.Request:
    return call.web_request if isinstance(call, LegacyCall) else call.request


def fake_of(era: str) -> FakeLegacy | FakeModern:
    """The scripted upstream of `era`, with only the tools, ping and capabilities of this server."""
    fake: FakeLegacy | FakeModern
    if era == "legacy":
        fake = FakeLegacy()
        fake.initialize_result = {"protocolVersion": LEGACY, "capabilities": {"tools": {}}, "serverInfo": SERVER_INFO}
        fake.get_status = 405
        for method in ("logging/setLevel", "resources/subscribe", "resources/unsubscribe"):
            fake.handlers.pop(method, None)  # not declared, so not served
    else:
        fake = FakeModern()
        fake.discover = {
            "resultType": "complete",
            "supportedVersions": [MODERN],
            "capabilities": {"tools": {}},
            "_meta": {"io.modelcontextprotocol/serverInfo": SERVER_INFO},
        }
        fake.handlers.pop("subscriptions/listen")
        fake.handlers["ping"] = pong
    fake.tools = TOOLS
    fake.handlers["tools/call"] = lambda call: call_tool(call, era)
    return fake


async def pong(call: Call) -> Outcome:
    return {}


async def call_tool(call: Call, era: str) -> Outcome:
    name = str(call.params.get("name"))
    if name == "echo":
        return result_of(era, str((call.params.get("arguments") or {}).get("text", "")))
    return await fault(call, era, name.removeprefix("fault_"))


async def fault(call: Call, era: str, mode: str) -> Outcome:
    reply = {"jsonrpc": "2.0", "id": call.id, "result": result_of(era, "ok")}
    request = web_request(call)
    if mode == "html":
        return Reply(502, "<html><body><h1>502 Bad Gateway</h1>" + "x" * 5000, "text/html; charset=utf-8")
    if mode == "invalid_json":
        return Reply(200, b'{"jsonrpc": "2.0", "id": oops')
    if mode == "not_jsonrpc":
        return Reply(200, {"hello": "world"})
    if mode == "empty":
        return Reply(200, b"")
    if mode == "wrong_id":
        return {**reply, "id": "somebody-else"}
    if mode == "huge":
        return {**reply, "result": result_of(era, "h" * (3 * 1024 * 1024))}
    if mode == "hang":
        await asyncio.Event().wait()  # until the client goes away
    if mode in ("split", "truncated_json"):
        raw = json.dumps({**reply, "result": result_of(era, "s" * 1600)}).encode()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(raw)
        await response.prepare(request)
        call.response = response
        await response.write(raw[:700])
        await asyncio.sleep(0.2)
        if mode == "truncated_json":
            cut(call, abort=False)
            return None
        await response.write(raw[700:])
        return None  # the fake ends the response
    if mode not in ("kill", "truncated_sse", "endless_sse"):
        return Reply(400, f"unknown fault {mode}", "text/plain")
    progress = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "working"}}
    await call.send(progress)  # opens the SSE reply
    assert call.response is not None
    if mode == "kill":
        cut(call, abort=True)
        return None
    if mode == "truncated_sse":
        await call.response.write(b'data: {"jsonrpc": "2.0", "id": ')
        return None  # the fake ends the stream there
    while True:  # endless_sse
        await call.response.write(b": keep-alive\n\n")
        await asyncio.sleep(0.2)


def cut(call: Call, *, abort: bool) -> None:
    """Close the connection under the reply (`abort`: reset it, as a killed server would)."""
    if isinstance(call, LegacyCall):
        call.dropped = True  # the fake then leaves the reply as it is
    transport = web_request(call).transport
    assert transport is not None
    transport.abort() if abort else transport.close()


def app_of(era: str) -> web.Application:
    fake = fake_of(era)

    async def health(request: web.Request) -> web.Response:
        sessions = len(fake.live_sessions) if isinstance(fake, FakeLegacy) else 0
        return web.json_response({"sessions": sessions})

    async def forget(request: web.Request) -> web.Response:
        if isinstance(fake, FakeLegacy):
            for session in fake.live_sessions:
                fake.forget(session.id)
        return web.json_response({"forgotten": True})

    fake.app.router.add_post("/control/forget", forget)
    fake.app.router.add_post("/control/health", health)
    return fake.app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--era", choices=["modern", "legacy"], required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(app_of(args.era), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
