"""A minimal, fast MCP upstream for the benchmark: a bare aiohttp app, no SDK, no validation.

    python -m bench.upstream --port 3500                 # 2026-07-28 (modern), stateless
    python -m bench.upstream --port 3501 --era legacy    # 2025-11-25 (legacy), sessionful

Modern: `server/discover`, `tools/list` (complete, ttlMs 60000, cacheScope public) and
`tools/call` (echo of `arguments.message`); notifications get 202.
Legacy: `initialize` (protocolVersion 2025-11-25 plus an `Mcp-Session-Id` header),
notifications and responses 202, `ping`, `tools/list`, `tools/call`; GET 405, DELETE 200.
`GET /stats` returns how many requests of each method arrived (the cache check reads it).
Not part of the test suite: it answers as fast as possible and checks nothing it need not.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from collections import Counter
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


def _reply(request_id: Any, result: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    body = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})
    return web.Response(body=body, content_type=JSON, headers=headers)


def _error(request_id: Any, code: int, message: str, status: int = 200) -> web.Response:
    body = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})
    return web.Response(body=body, status=status, content_type=JSON)


def _echo(params: dict[str, Any]) -> list[dict[str, str]]:
    arguments = params.get("arguments") or {}
    return [{"type": "text", "text": str(arguments.get("message", ""))}]


class Upstream:
    def __init__(self, era: str) -> None:
        self.era = era
        self.counts: Counter[str] = Counter()
        self.sessions: set[str] = set()

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
                    "capabilities": {"tools": {}},
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

    async def get(self, request: web.Request) -> web.Response:
        return web.Response(status=405, headers={"Allow": "POST" if self.era == "modern" else "POST, DELETE"})

    async def delete(self, request: web.Request) -> web.Response:
        if self.era == "modern":
            return web.Response(status=405, headers={"Allow": "POST"})
        self.sessions.discard(request.headers.get("Mcp-Session-Id", ""))
        return web.Response(status=200)

    async def stats(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(dict(self.counts)), content_type=JSON)


def build(era: str, path: str = "/mcp") -> web.Application:
    upstream = Upstream(era)
    app = web.Application()
    app.router.add_post(path, upstream.post)
    app.router.add_get(path, upstream.get)
    app.router.add_delete(path, upstream.delete)
    app.router.add_get("/stats", upstream.stats)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--era", choices=["modern", "legacy"], default="modern")
    args = parser.parse_args()
    try:
        import uvloop  # same event loop as the proxy, where available
    except ImportError:
        loop = asyncio.new_event_loop()
    else:
        loop = uvloop.new_event_loop()
    web.run_app(build(args.era), host=args.host, port=args.port, access_log=None, print=None, loop=loop)


if __name__ == "__main__":
    main()
