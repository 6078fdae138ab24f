"""A recording reverse proxy placed between a real client and the proxy under test.

It forwards every request unchanged (Host and Origin included) and streams every response
back unchanged, while writing each JSON-RPC message it sees to a JSON-lines file:
{"dir": "to_server"|"to_client", "exchange": n, "session": id|null, "message": {...}}, where
`exchange` numbers the HTTP request/response pairs.
Tests then validate what the proxy sent against the schema of the revision it negotiated.
Given several targets it sends each request to the next one in turn (strict round-robin, as a
balancer in front of replicas would).

    python -m tests.support.tap --port PORT --target URL [--target URL ...] --record FILE
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from proxy.protocol.sse import Decoder

_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive"}


class Tap:
    def __init__(self, targets: list[str], record: Path) -> None:
        self.targets = targets
        self.record = record.open("a", buffering=1)
        self.client: aiohttp.ClientSession | None = None
        self.exchanges = 0

    def write(self, direction: str, exchange: int, session: str | None, message: Any) -> None:
        for item in message if isinstance(message, list) else [message]:
            line = {"dir": direction, "exchange": exchange, "session": session, "message": item}
            self.record.write(json.dumps(line) + "\n")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self.client is not None
        body = await request.read()
        session = request.headers.get("Mcp-Session-Id")
        self.exchanges += 1
        exchange = self.exchanges
        if body:
            try:
                self.write("to_server", exchange, session, json.loads(body))
            except ValueError:
                pass
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self.client.request(
            request.method,
            self.targets[(exchange - 1) % len(self.targets)],
            data=body or None,
            headers=headers,
            allow_redirects=False,
        ) as upstream:
            session = upstream.headers.get("Mcp-Session-Id", session)
            response = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in _HOP | {"content-encoding"}},
            )
            await response.prepare(request)
            content_type = upstream.headers.get("Content-Type", "")
            decoder = Decoder() if content_type.startswith("text/event-stream") else None
            buffered = b""
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                    if decoder is not None:
                        for event in decoder.feed(chunk):
                            if event.data.strip():
                                self.write("to_client", exchange, session, json.loads(event.data))
                    else:
                        buffered += chunk
            except (ConnectionError, aiohttp.ClientError):
                return response
            if decoder is None and buffered.strip():
                try:
                    self.write("to_client", exchange, session, json.loads(buffered))
                except ValueError:
                    text = buffered[:200].decode("utf-8", "replace")
                    self.write("to_client", exchange, session, {"non_json_body": text})
            await response.write_eof()
            return response


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--target", action="append", required=True)
    parser.add_argument("--record", type=Path, required=True)
    args = parser.parse_args()
    tap = Tap(args.target, args.record)

    async def lifecycle(app: web.Application):  # type: ignore[no-untyped-def]
        tap.client = aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None))
        yield
        await tap.client.close()

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", tap.handle)
    app.cleanup_ctx.append(lifecycle)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, handler_cancellation=True)


def read_record(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def schema_violations(path: Path) -> tuple[int, list[str]]:
    """Validate every message the proxy sent to the client; returns (checked, problems).

    A reply is checked against the result type of the request of its own HTTP exchange, in the
    revision that request spoke: its `_meta` protocol version (modern), or the version its
    legacy session negotiated at initialize.
    """
    from proxy.protocol import meta

    from .schema import server_message_errors

    versions: dict[str | None, str] = {}  # legacy session id -> negotiated version
    requests: dict[int, dict[str, Any]] = {}  # exchange -> the request sent in it
    checked = 0
    problems: list[str] = []
    for entry in read_record(path):
        message, session, exchange = entry["message"], entry["session"], entry["exchange"]
        if entry["dir"] == "to_server":
            if isinstance(message, dict) and "method" in message:
                requests[exchange] = message
            continue
        if not isinstance(message, dict):
            problems.append(f"non-object message to client: {message!r:.200}")
            continue
        request = requests.get(exchange, {})
        method = request.get("method")
        request_meta = meta.meta_of(request.get("params")) or {}
        if method == "initialize" and isinstance(message.get("result"), dict):
            versions[session] = message["result"].get("protocolVersion")
        version = request_meta.get(meta.PROTOCOL_VERSION) or versions.get(session)
        if version is None:
            continue  # replies outside a legacy session (errors before initialize) have no revision
        checked += 1
        reply_to = method if message.get("id") == request.get("id") else None
        for problem in server_message_errors(version, message, reply_to):
            problems.append(f"[{version}] {problem} in {json.dumps(message)[:300]}")
    return checked, problems


if __name__ == "__main__":
    main()
