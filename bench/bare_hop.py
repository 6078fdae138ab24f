"""The reference cost of one Python hop: an aiohttp server that parses the body once and forwards
it with a pooled client, on uvloop and orjson like the proxy; nothing MCP about it.

    python -m bench.bare_hop --upstream http://127.0.0.1:3500/mcp --port 3510

Reads the POST body and parses it once with orjson (not JSON: 400 with a JSON-RPC parse error),
forwards the original bytes and the relevant headers to the upstream on one shared, pooled
aiohttp ClientSession, streams the reply back chunk by chunk. Same event loop as the proxy
(uvloop where available); no logging, no metrics, no validation beyond the parse.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator

import aiohttp
import orjson
from aiohttp import web

FORWARDED = (
    "Content-Type",
    "Accept",
    "Authorization",
    "MCP-Protocol-Version",
    "Mcp-Method",
    "Mcp-Name",
    "Mcp-Session-Id",
    "Last-Event-ID",
)
RETURNED = ("Content-Type", "Mcp-Session-Id", "Allow", "WWW-Authenticate")
SESSION = web.AppKey("session", aiohttp.ClientSession)
URL = web.AppKey("url", str)
PARSE_ERROR = orjson.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}})


async def relay(request: web.Request) -> web.StreamResponse:
    body = await request.read() if request.can_read_body else None
    if request.method == "POST":
        try:
            orjson.loads(body or b"")  # parsed once, as the proxy must; the original bytes go on
        except orjson.JSONDecodeError:
            return web.Response(body=PARSE_ERROR, status=400, content_type="application/json")
    headers = {name: request.headers[name] for name in FORWARDED if name in request.headers}
    async with request.app[SESSION].request(request.method, request.app[URL], data=body, headers=headers) as up:
        response = web.StreamResponse(
            status=up.status, headers={name: up.headers[name] for name in RETURNED if name in up.headers}
        )
        await response.prepare(request)
        async for chunk in up.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


def build(upstream: str, path: str = "/mcp") -> web.Application:
    app = web.Application()
    app[URL] = upstream

    async def client(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
        app[SESSION] = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False
        )
        yield
        await app[SESSION].close()

    app.cleanup_ctx.append(client)
    for method in ("POST", "GET", "DELETE"):
        app.router.add_route(method, path, relay)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        loop = asyncio.new_event_loop()
    else:
        loop = uvloop.new_event_loop()
    web.run_app(build(args.upstream), host=args.host, port=args.port, access_log=None, print=None, loop=loop)


if __name__ == "__main__":
    main()
