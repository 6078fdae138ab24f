"""A minimal, fast MCP upstream for the benchmark: a bare aiohttp app, no SDK, no validation.

    python -m bench.upstream --port 3500                 # 2026-07-28 (modern), stateless
    python -m bench.upstream --port 3501 --era legacy    # 2025-11-25 (legacy), sessionful
    python -m bench.upstream --port 3500 --listen        # modern, with subscriptions/listen

Modern: `server/discover`, `tools/list` (complete, ttlMs 60000, cacheScope public) and
`tools/call` (echo of `arguments.message`); notifications get 202.
Legacy: `initialize` (protocolVersion 2025-11-25 plus an `Mcp-Session-Id` header),
notifications and responses 202, `ping`, `tools/list`, `tools/call`; GET 405, DELETE 200.
`GET /stats` returns how many requests of each method arrived (the cache check reads it).
With `--listen` (modern only) the server advertises `listChanged` for tools and prompts and
`resources.subscribe`, and serves `subscriptions/listen`: an SSE stream acknowledging the filter
asked for, then every notification `POST /notify {"method", "params"}` pushes that the filter asks
for (a list change of an asked list, an update of a subscribed URI); `/stats` then also says how
many listens are open (`listens_open`).
Not part of the test suite: it answers as fast as possible and checks nothing it need not.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
SERVER_INFO = {"name": "bench-upstream", "version": "1.0.0"}
ECHO_TOOL = {
    "name": "echo",
    "description": "Echoes the message back",
    "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]},
}
JSON = "application/json"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
LIST_CHANGED = {
    "notifications/tools/list_changed": "toolsListChanged",
    "notifications/prompts/list_changed": "promptsListChanged",
    "notifications/resources/list_changed": "resourcesListChanged",
}


def _reply(request_id: Any, result: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    body = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})
    return web.Response(body=body, content_type=JSON, headers=headers)


def _error(request_id: Any, code: int, message: str, status: int = 200) -> web.Response:
    body = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})
    return web.Response(body=body, status=status, content_type=JSON)


def _echo(params: dict[str, Any]) -> list[dict[str, str]]:
    arguments = params.get("arguments") or {}
    return [{"type": "text", "text": str(arguments.get("message", ""))}]


@dataclass(eq=False)
class _Listen:
    subscription_id: Any
    filter: dict[str, Any]
    queue: asyncio.Queue[bytes] = field(default_factory=asyncio.Queue)

    def asks_for(self, method: str, params: dict[str, Any]) -> bool:
        if method == "notifications/resources/updated":
            return params.get("uri") in (self.filter.get("resourceSubscriptions") or ())
        return bool(self.filter.get(LIST_CHANGED.get(method, "")))


def _event(message: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(message) + b"\n\n"


class Upstream:
    def __init__(self, era: str, listen: bool = False) -> None:
        self.era = era
        self.listen = listen and era == "modern"
        self.counts: Counter[str] = Counter()
        self.sessions: set[str] = set()
        self.listens: set[_Listen] = set()

    async def post(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _error(None, -32700, "Parse error", 400)
        if not isinstance(body, dict):
            return _error(None, -32600, "batches are not served here", 400)
        method = body.get("method")
        self.counts[method or "response"] += 1
        if "id" not in body or method is None:
            return web.Response(status=202)  # a notification or a response
        params = body.get("params") or {}
        if self.listen and method == "subscriptions/listen":
            return await self._listen(request, body["id"], params)
        if self.era == "modern":
            return self._modern(body["id"], method, params)
        return self._legacy(request, body["id"], method, params)

    def _modern(self, request_id: Any, method: str, params: dict[str, Any]) -> web.Response:
        if method == "tools/call":
            return _reply(request_id, {"resultType": "complete", "content": _echo(params)})
        if method == "tools/list":
            return _reply(
                request_id,
                {"resultType": "complete", "tools": [ECHO_TOOL], "ttlMs": 60000, "cacheScope": "public"},
            )
        if method == "server/discover":
            return _reply(
                request_id,
                {
                    "resultType": "complete",
                    "supportedVersions": [MODERN],
                    "capabilities": (
                        {
                            "tools": {"listChanged": True},
                            "prompts": {"listChanged": True},
                            "resources": {"subscribe": True},
                        }
                        if self.listen
                        else {"tools": {}}
                    ),
                    "ttlMs": 60000,
                    "cacheScope": "public",
                    "_meta": {"io.modelcontextprotocol/serverInfo": SERVER_INFO},
                },
            )
        if method == "initialize":
            return _error(request_id, -32022, "Unsupported protocol version", 400)
        return _error(request_id, -32601, f"Method not found: {method}", 404)

    def _legacy(self, request: web.Request, request_id: Any, method: str, params: dict[str, Any]) -> web.Response:
        if method == "initialize":
            session_id = secrets.token_hex(16)
            self.sessions.add(session_id)
            result = {"protocolVersion": LEGACY, "capabilities": {"tools": {}}, "serverInfo": SERVER_INFO}
            return _reply(request_id, result, {"Mcp-Session-Id": session_id})
        session_id = request.headers.get("Mcp-Session-Id")
        if session_id is None:
            return _error(request_id, -32000, "Bad Request: Missing session ID", 400)
        if session_id not in self.sessions:
            return _error(request_id, -32001, "Session not found", 404)
        if method == "tools/call":
            return _reply(request_id, {"content": _echo(params)})
        if method == "tools/list":
            return _reply(request_id, {"tools": [ECHO_TOOL]})
        if method == "ping":
            return _reply(request_id, {})
        return _error(request_id, -32601, f"Method not found: {method}")

    async def _listen(self, request: web.Request, request_id: Any, params: dict[str, Any]) -> web.StreamResponse:
        """One subscriptions/listen: the acknowledgement, then what /notify pushes, until the
        client closes the stream."""
        asked = params.get("notifications")
        listen = _Listen(request_id, asked if isinstance(asked, dict) else {})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        ack = {"_meta": {SUBSCRIPTION_ID: request_id}, "notifications": listen.filter}
        await response.write(
            _event({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged", "params": ack})
        )
        self.listens.add(listen)
        try:
            while True:
                await response.write(await listen.queue.get())
        except (ConnectionError, asyncio.CancelledError):
            return response
        finally:
            self.listens.discard(listen)

    async def notify(self, request: web.Request) -> web.Response:
        """Push one notification to every open listen that asks for it; answers how many."""
        body = orjson.loads(await request.read())
        method, params = body["method"], body.get("params") or {}
        pushed = 0
        for listen in self.listens:
            if listen.asks_for(method, params):
                tagged = {**params, "_meta": {SUBSCRIPTION_ID: listen.subscription_id}}
                listen.queue.put_nowait(_event({"jsonrpc": "2.0", "method": method, "params": tagged}))
                pushed += 1
        return web.Response(body=orjson.dumps({"pushed": pushed}), content_type=JSON)

    async def get(self, request: web.Request) -> web.Response:
        return web.Response(status=405, headers={"Allow": "POST" if self.era == "modern" else "POST, DELETE"})

    async def delete(self, request: web.Request) -> web.Response:
        if self.era == "modern":
            return web.Response(status=405, headers={"Allow": "POST"})
        self.sessions.discard(request.headers.get("Mcp-Session-Id", ""))
        return web.Response(status=200)

    async def stats(self, request: web.Request) -> web.Response:
        counts: dict[str, int] = dict(self.counts)
        if self.listen:
            counts["listens_open"] = len(self.listens)
        return web.Response(body=orjson.dumps(counts), content_type=JSON)


def build(era: str, path: str = "/mcp", listen: bool = False) -> web.Application:
    upstream = Upstream(era, listen)
    app = web.Application()
    app.router.add_post(path, upstream.post)
    app.router.add_get(path, upstream.get)
    app.router.add_delete(path, upstream.delete)
    app.router.add_get("/stats", upstream.stats)
    if upstream.listen:
        app.router.add_post("/notify", upstream.notify)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--era", choices=["modern", "legacy"], default="modern")
    parser.add_argument("--listen", action="store_true", help="serve subscriptions/listen (modern)")
    args = parser.parse_args()
    try:
        import uvloop  # same event loop as the proxy, where available
    except ImportError:
        loop = asyncio.new_event_loop()
    else:
        loop = uvloop.new_event_loop()
    # With listens, a client closing its stream cancels the handler, so a closed listen leaves at once.
    extra = {"handler_cancellation": True} if args.listen else {}
    app = build(args.era, listen=args.listen)
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None, loop=loop, **extra)


if __name__ == "__main__":
    main()
