"""A scripted 2024-11-05 HTTP+SSE MCP server on aiohttp, for integration tests of the proxy's
HTTP+SSE upstream (proxy/upstream/sse.py). No MCP SDK.

GET /sse opens a session: the first event is `endpoint` (`/message?sessionId=ID`, or `endpoint`
as configured), a keepalive comment follows, then every message of the server as a `message`
event. POST /message?sessionId=ID takes one client message and answers 202; 404 for an unknown
session. It answers `initialize` (the client's version if legacy, else 2024-11-05), `ping`,
`tools/list` and `tools/call` by tool name:

  sid    the session's id
  echo   its `text` argument
  hold   a progress notification when it has a progressToken, then nothing
  drop   closes the session's stream without answering
  ask    a sampling/createMessage request to the client; answers with what the client replied

Every request's headers are recorded in `seen` (GET and POST alike). With `token`, a GET without
that bearer token gets 401 with a challenge.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

LEGACY = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
TOOLS = [{"name": name, "inputSchema": {"type": "object"}} for name in ("sid", "echo", "hold", "drop", "ask")]
JSONDict = dict[str, Any]


@dataclass
class Session:
    id: str
    queue: asyncio.Queue[JSONDict | None] = field(default_factory=asyncio.Queue)
    waiting: dict[Any, asyncio.Future[JSONDict]] = field(default_factory=dict)
    closed: bool = False


class FakeSseServer:
    def __init__(self, *, endpoint: str | None = None, send_endpoint: bool = True, token: str | None = None) -> None:
        self.endpoint = endpoint
        self.token = token  # when set, a GET without `Authorization: Bearer <token>` gets 401
        self.send_endpoint = send_endpoint
        self.sessions: dict[str, Session] = {}
        self.seen: list[tuple[str, dict[str, str]]] = []  # (method, headers)
        self.received: list[JSONDict] = []
        self.opened = 0
        self.capabilities: JSONDict = {"tools": {}}  # what its InitializeResult declares
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/sse", self.get)
        app.router.add_post("/message", self.post)
        return app

    def live(self) -> int:
        return sum(not s.closed for s in self.sessions.values())

    async def get(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(("GET", dict(request.headers)))
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            challenge = 'Bearer resource_metadata="http://127.0.0.1/.well-known/oauth-protected-resource"'
            return web.Response(status=401, text="unauthorized", headers={"WWW-Authenticate": challenge})
        session = Session(str(next(self._ids)))
        self.sessions[session.id] = session
        self.opened += 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        try:
            if self.send_endpoint:
                target = self.endpoint or f"/message?sessionId={session.id}"
                await response.write(f"event: endpoint\ndata: {target}\n\n".encode())
            await response.write(b": keepalive\n\n")
            while True:
                message = await session.queue.get()
                if message is None:
                    break
                await response.write(b"event: message\ndata: " + json.dumps(message).encode() + b"\n\n")
        finally:
            session.closed = True
        return response

    async def post(self, request: web.Request) -> web.Response:
        self.seen.append(("POST", dict(request.headers)))
        session = self.sessions.get(request.query.get("sessionId", ""))
        if session is None or session.closed:
            return web.Response(status=404, text="Session not found")
        message = await request.json()
        self.received.append(message)
        task = asyncio.create_task(self._handle(session, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return web.Response(status=202, text="Accepted")

    async def _handle(self, session: Session, message: JSONDict) -> None:
        if "method" not in message:  # the client's answer to one of ours
            future = session.waiting.pop(message.get("id"), None)
            if future is not None and not future.done():
                future.set_result(message)
            return
        if "id" not in message:
            return
        method, params = message["method"], message.get("params") or {}

        def reply(result: JSONDict) -> None:
            session.queue.put_nowait({"jsonrpc": "2.0", "id": message["id"], "result": result})

        if method == "initialize":
            version = params.get("protocolVersion")
            reply(
                {
                    "protocolVersion": version if version in LEGACY else "2024-11-05",
                    "capabilities": self.capabilities,
                    "serverInfo": {"name": "scripted-sse-server", "version": "1.0.0"},
                }
            )
        elif method == "ping":
            reply({})
        elif method == "tools/list":
            reply({"tools": TOOLS})
        elif method == "tools/call":
            name, arguments = params.get("name"), params.get("arguments") or {}
            token = (params.get("_meta") or {}).get("progressToken")
            if name == "sid":
                reply({"content": [{"type": "text", "text": session.id}]})
            elif name == "echo":
                reply({"content": [{"type": "text", "text": str(arguments.get("text", ""))}]})
            elif name == "hold":
                if token is not None:
                    session.queue.put_nowait(
                        {
                            "jsonrpc": "2.0",
                            "method": "notifications/progress",
                            "params": {"progressToken": token, "progress": 1},
                        }
                    )
            elif name == "drop":
                session.queue.put_nowait(None)
            elif name == "ask":
                future: asyncio.Future[JSONDict] = asyncio.get_running_loop().create_future()
                ask_id = f"s-{message['id']}"
                session.waiting[ask_id] = future
                session.queue.put_nowait(
                    {
                        "jsonrpc": "2.0",
                        "id": ask_id,
                        "method": "sampling/createMessage",
                        "params": {"messages": [], "maxTokens": 10},
                    }
                )
                answer = await future
                text = json.dumps(answer.get("result", answer.get("error")))
                reply({"content": [{"type": "text", "text": text}]})
        else:
            session.queue.put_nowait(
                {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "Method not found"}}
            )
