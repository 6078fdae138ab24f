"""A scripted MCP server that misbehaves on request, for fault injection: run it as a process.

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
import uuid
from typing import Any

from aiohttp import web

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
PROTOCOL_META = "io.modelcontextprotocol/protocolVersion"

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


class Server:
    def __init__(self, era: str) -> None:
        self.era = era
        self.sessions: set[str] = set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/mcp", self.post)
        app.router.add_delete("/mcp", self.delete)
        app.router.add_get("/mcp", self.get)
        app.router.add_post("/control/forget", self.forget)
        app.router.add_post("/control/health", self.health)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"sessions": len(self.sessions)})

    async def forget(self, request: web.Request) -> web.Response:
        self.sessions.clear()
        return web.json_response({"forgotten": True})

    async def get(self, request: web.Request) -> web.Response:
        return web.Response(status=405)

    async def delete(self, request: web.Request) -> web.Response:
        self.sessions.discard(request.headers.get("Mcp-Session-Id", ""))
        return web.Response(status=200)

    async def post(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        method, request_id = body.get("method"), body.get("id")
        headers: dict[str, str] = {}
        if self.era == "legacy":
            if method == "initialize":
                session = uuid.uuid4().hex
                self.sessions.add(session)
                headers["Mcp-Session-Id"] = session
                result = {
                    "protocolVersion": LEGACY,
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "fault-upstream", "version": "1"},
                }
                return web.json_response({"jsonrpc": "2.0", "id": request_id, "result": result}, headers=headers)
            if request.headers.get("Mcp-Session-Id") not in self.sessions:
                error = {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32001, "message": "Session not found"}}
                return web.json_response(error, status=404)
        if request_id is None:
            return web.Response(status=202)
        if method == "server/discover" and self.era == "modern":
            result = {
                "resultType": "complete",
                "supportedVersions": [MODERN],
                "capabilities": {"tools": {}},
                "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "fault-upstream", "version": "1"}},
            }
            return web.json_response({"jsonrpc": "2.0", "id": request_id, "result": result})
        if method == "ping":
            return web.json_response({"jsonrpc": "2.0", "id": request_id, "result": {}})
        if method == "tools/list":
            result = {"tools": TOOLS, **({"resultType": "complete"} if self.era == "modern" else {})}
            return web.json_response({"jsonrpc": "2.0", "id": request_id, "result": result})
        if method != "tools/call":
            error = {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": f"no {method}"}}
            return web.json_response(error, status=404 if self.era == "modern" else 200)
        name = str((body.get("params") or {}).get("name"))
        if name == "echo":
            text = str(((body.get("params") or {}).get("arguments") or {}).get("text", ""))
            return web.json_response({"jsonrpc": "2.0", "id": request_id, "result": result_of(self.era, text)})
        return await self.fault(request, name.removeprefix("fault_"), request_id)

    async def fault(self, request: web.Request, mode: str, request_id: Any) -> web.StreamResponse:
        reply = {"jsonrpc": "2.0", "id": request_id, "result": result_of(self.era, "ok")}
        if mode == "html":
            return web.Response(
                status=502, text="<html><body><h1>502 Bad Gateway</h1>" + "x" * 5000, content_type="text/html"
            )
        if mode == "invalid_json":
            return web.Response(status=200, body=b'{"jsonrpc": "2.0", "id": oops', content_type="application/json")
        if mode == "not_jsonrpc":
            return web.json_response({"hello": "world"})
        if mode == "empty":
            return web.Response(status=200, body=b"", content_type="application/json")
        if mode == "wrong_id":
            return web.json_response({**reply, "id": "somebody-else"})
        if mode == "huge":
            return web.json_response({**reply, "result": result_of(self.era, "h" * (3 * 1024 * 1024))})
        if mode == "hang":
            await asyncio.Event().wait()  # until the client goes away
        if mode in ("split", "truncated_json"):
            raw = json.dumps({**reply, "result": result_of(self.era, "s" * 1600)}).encode()
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.content_length = len(raw)
            await response.prepare(request)
            await response.write(raw[:700])
            await asyncio.sleep(0.2)
            if mode == "truncated_json":
                assert request.transport is not None
                request.transport.close()
                return response
            await response.write(raw[700:])
            await response.write_eof()
            return response
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await stream.prepare(request)
        progress = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "working"}}
        await stream.write(b"data: " + json.dumps(progress).encode() + b"\n\n")
        if mode == "kill":
            assert request.transport is not None
            request.transport.abort()
            return stream
        if mode == "truncated_sse":
            await stream.write(b'data: {"jsonrpc": "2.0", "id": ')
            await stream.write_eof()
            return stream
        if mode == "endless_sse":
            while True:
                await stream.write(b": keep-alive\n\n")
                await asyncio.sleep(0.2)
        raise web.HTTPBadRequest(text=f"unknown fault {mode}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--era", choices=["modern", "legacy"], required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(Server(args.era).app(), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
