"""A scripted legacy (2025-11-25) Streamable HTTP MCP server for integration tests.

Serve `FakeLegacy().app` with pytest-aiohttp's `aiohttp_server` and point the proxy at `/mcp`
with `upstream.era = "legacy"`. It keeps sessions the legacy way: `initialize` mints an
`Mcp-Session-Id` and records the client's declared capabilities, `notifications/initialized`
completes the handshake, each session may hold GET SSE streams (the test pushes notifications
and server requests onto them), DELETE ends a session, and a session the server does not know
answers HTTP 404 (`forget()` drops one without DELETE, to test re-initialization).

Each test scripts what the server does per JSON-RPC method::

    async def deploy(call: Call) -> Outcome:
        await call.progress(1, 2)                                      # opens an SSE reply
        answer = await call.ask("elicitation/create", {...})           # the client's JSON-RPC response
        return {"content": [{"type": "text", "text": answer["result"]["action"]}]}

    fake.handlers["tools/call"] = deploy

A handler returns a result object (wrapped in a JSON-RPC response under the request's id), a
whole JSON-RPC message (a dict with "jsonrpc"), an `RpcError` (`error(...)`), a `Reply` (any
HTTP response), or None to end an SSE reply without a response. `call.request(...)` sends a
server-to-client request on the POST's own stream and returns its `Pending` (whose `response`
future the client's POSTed answer resolves, even after the call itself was cancelled);
`call.drop()` kills the connection mid-stream. Everything received is recorded (`fake.calls`,
`fake.calls_of(method)`, `await fake.next_call(method | "response" | "GET" | "DELETE")`), and
each `Call` knows whether the peer closed its connection first (`call.cancelled`).

Built in: `initialize`, `ping`, `logging/setLevel`, `resources/subscribe` / `unsubscribe`
(recorded on the session), `tools/list` (answers `fake.tools`), and -32601 (in an HTTP 200, as
legacy servers do) for any other method without a handler.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import secrets
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from multidict import CIMultiDictProxy

from proxy.errors import SESSION_NOT_FOUND
from proxy.protocol import jsonrpc
from proxy.protocol.headers import PROTOCOL_VERSION_HEADER, SESSION_HEADER
from proxy.protocol.versions import LATEST_LEGACY, legacy_at_least
from tests.support.fake_modern import Reply, RpcError, error, notification
from tests.support.schema import client_notification_methods, client_request_methods
from tests.support.schema import errors as schema_errors

JSONDict = dict[str, Any]
LEGACY = LATEST_LEGACY
PATH = "/mcp"
SERVER_INFO = {"name": "fake-legacy", "version": "0.9.1"}
INSTRUCTIONS = "A scripted fake legacy MCP server."
# What a server request's answer must look like, by the request's method.
_ANSWER_TYPES = {
    "elicitation/create": "ElicitResult",
    "sampling/createMessage": "CreateMessageResult",
    "roots/list": "ListRootsResult",
    "ping": "EmptyResult",
}

Outcome = JSONDict | Reply | RpcError | None
Handler = Callable[["Call"], Awaitable[Outcome]]


def initialize_result() -> JSONDict:
    return {
        "protocolVersion": LEGACY,
        "capabilities": {
            "tools": {"listChanged": True},
            "prompts": {"listChanged": True},
            "resources": {"subscribe": True, "listChanged": True},
            "logging": {},
            "completions": {},
        },
        "serverInfo": dict(SERVER_INFO),
        "instructions": INSTRUCTIONS,
    }


def sse_event(message: JSONDict, event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n".encode() if event_id is not None else b""
    return head + b"data: " + json.dumps(message).encode() + b"\n\n"


class Pending:
    """A server-to-client request the fake sent; `response` resolves with the client's answer."""

    def __init__(self, message: JSONDict) -> None:
        self.message = message
        self.response: asyncio.Future[JSONDict] = asyncio.get_running_loop().create_future()

    @property
    def id(self) -> Any:
        return self.message["id"]

    @property
    def method(self) -> str:
        return self.message["method"]

    async def answer(self) -> JSONDict:
        """The client's whole JSON-RPC response (result or error)."""
        return await asyncio.shield(self.response)


class GetStream:
    """One standalone GET SSE stream a session holds open."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self.queue: asyncio.Queue[JSONDict | None] = asyncio.Queue()
        self.closed = asyncio.Event()  # ended by either side
        self._event_ids = itertools.count(1)

    @property
    def last_event_id(self) -> str | None:
        return self.call.headers.get("Last-Event-ID")

    def end(self) -> None:
        self.queue.put_nowait(None)


class Session:
    def __init__(self, fake: FakeLegacy, initialize: Call) -> None:
        self.fake = fake
        self.id = secrets.token_hex(16)
        self.initialize = initialize
        params = initialize.params
        self.requested_version = params.get("protocolVersion")
        self.capabilities: JSONDict = params.get("capabilities") or {}  # what the client declared
        self.client_info: JSONDict = params.get("clientInfo") or {}
        self.protocol_version: str = fake.initialize_result["protocolVersion"]
        self.live_when_opened = len(fake.live_sessions)  # other sessions the server held at that moment
        self.initialized = asyncio.Event()
        self.known = True
        self.deleted = asyncio.Event()
        self.log_levels: list[str] = []  # every logging/setLevel, in order
        self.subscribed: list[str] = []
        self.unsubscribed: list[str] = []
        self.streams: list[GetStream] = []
        self.pending: dict[Any, Pending] = {}
        self._streams_changed = asyncio.Condition()

    # ------------------------------------------------------------ the GET stream

    async def stream(self) -> GetStream:
        """The newest open GET stream (waits for one to open)."""
        async with self._streams_changed:
            while not self.streams:
                await self._streams_changed.wait()
            return self.streams[-1]

    async def _streams_update(self) -> None:
        async with self._streams_changed:
            self._streams_changed.notify_all()

    def push(self, method: str, params: JSONDict | None = None) -> None:
        """Send a notification on every open GET stream of this session."""
        self.push_message(notification(method, params))

    def push_message(self, message: JSONDict) -> None:
        assert self.streams, "no GET stream is open for this session"
        for stream in self.streams:
            stream.queue.put_nowait(message)

    def request(self, method: str, params: JSONDict | None = None, *, id: Any = None) -> Pending:
        """Send a server-to-client request on the GET stream (not tied to any client request)."""
        pending = self._pending(method, params, id)
        self.push_message(pending.message)
        return pending

    def _pending(self, method: str, params: JSONDict | None, request_id: Any) -> Pending:
        request_id = self.fake.next_server_request_id() if request_id is None else request_id
        pending = Pending(jsonrpc.request(request_id, method, params))
        self.pending[request_id] = pending
        return pending


class Call:
    """One HTTP request the fake received (POST, GET or DELETE), and the means to answer it."""

    def __init__(self, fake: FakeLegacy, request: web.Request, raw: bytes, body: Any) -> None:
        self.fake = fake
        self.web_request = request
        self.raw = raw
        self.body = body
        self.headers: CIMultiDictProxy[str] = request.headers
        self.session: Session | None = None
        self.status: int | None = None  # the HTTP status it was answered with, once known
        self.response: web.StreamResponse | None = None
        self.asked: list[Pending] = []  # server requests sent on this POST's stream
        self.answers: Pending | None = None  # for a POSTed response: the server request it answers
        self.cancelled = asyncio.Event()  # the peer closed the connection before we finished
        self.done = asyncio.Event()  # the handler finished, one way or another
        self.dropped = False

    @property
    def http_method(self) -> str:
        return self.web_request.method

    @property
    def method(self) -> str | None:
        value = self.body.get("method") if isinstance(self.body, dict) else None
        return value if isinstance(value, str) else None

    @property
    def id(self) -> Any:
        return self.body.get("id") if isinstance(self.body, dict) else None

    @property
    def kind(self) -> str:
        return jsonrpc.kind(self.body) if self.http_method == "POST" else self.http_method

    @property
    def params(self) -> JSONDict:
        params = self.body.get("params") if isinstance(self.body, dict) else None
        return params if isinstance(params, dict) else {}

    @property
    def meta(self) -> JSONDict:
        value = self.params.get("_meta")
        return value if isinstance(value, dict) else {}

    @property
    def session_id(self) -> str | None:
        return self.headers.get(SESSION_HEADER)

    # ------------------------------------------------------------ streaming on the POST

    async def send(self, message: JSONDict) -> None:
        """Write one SSE event on this POST's reply (opening the SSE reply on first use)."""
        if self.response is None:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await response.prepare(self.web_request)
            self.response = response
        try:
            await self.response.write(sse_event(message))
        except ConnectionError:
            self.cancelled.set()
            raise

    async def notify(self, method: str, params: JSONDict | None = None) -> None:
        await self.send(notification(method, params))

    async def progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        """A progress notification under the token this request carries."""
        token = self.meta.get("progressToken")
        assert token is not None, f"{self.method} carries no progressToken"
        params: JSONDict = {"progressToken": token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        await self.notify("notifications/progress", params)

    async def log(self, level: str, data: Any, logger: str | None = None) -> None:
        params: JSONDict = {"level": level, "data": data}
        if logger is not None:
            params["logger"] = logger
        await self.notify("notifications/message", params)

    async def request(self, method: str, params: JSONDict | None = None, *, id: Any = None) -> Pending:
        """Send a server-to-client request on this POST's stream; its answer comes as a POST."""
        assert self.session is not None
        pending = self.session._pending(method, params, id)
        self.asked.append(pending)
        await self.send(pending.message)
        return pending

    async def withdraw(self, pending: Pending, reason: str | None = None) -> None:
        """Cancel one of our own server requests (notifications/cancelled on this stream)."""
        assert self.session is not None
        self.session.pending.pop(pending.id, None)
        params: JSONDict = {"requestId": pending.id}
        if reason is not None:
            params["reason"] = reason
        await self.notify("notifications/cancelled", params)

    async def ask(self, method: str, params: JSONDict | None = None) -> JSONDict:
        """`request`, then wait for the client's JSON-RPC response to it."""
        pending = await self.request(method, params)
        return await pending.answer()

    def drop(self) -> None:
        """Kill the connection mid-reply, as a crashing server would."""
        self.dropped = True
        transport = self.web_request.transport
        assert transport is not None
        transport.close()

    # ------------------------------------------------------------ finishing

    def response_message(self, outcome: JSONDict) -> JSONDict:
        if "jsonrpc" in outcome:
            return outcome
        return jsonrpc.result_response(self.id, outcome)

    async def finish(self, outcome: Outcome) -> web.StreamResponse:
        if self.dropped:
            return self.response or web.Response(status=500)
        if isinstance(outcome, RpcError):
            message = jsonrpc.error_response(self.id, outcome.code, outcome.message, outcome.data)
            if self.response is not None:
                await self.send(message)
                return await self._end()
            return Reply(outcome.status, message).response()
        if isinstance(outcome, Reply):
            if self.response is not None:
                raise RuntimeError("cannot send a plain HTTP reply after the SSE stream started")
            return outcome.response()
        if outcome is None:
            if self.response is None:
                return web.Response(status=202)
            return await self._end()
        message = self.response_message(outcome)
        if self.response is None:
            return web.json_response(message)
        await self.send(message)
        return await self._end()

    async def _end(self) -> web.StreamResponse:
        assert self.response is not None
        try:
            await self.response.write_eof()
        except ConnectionError:
            self.cancelled.set()
        return self.response


class FakeLegacy:
    def __init__(self) -> None:
        self.initialize_result: JSONDict = initialize_result()
        self.initialize_error: JSONDict | None = None  # when set, initialize is refused with this error
        self.tools: list[JSONDict] = []
        self.handlers: dict[str, Handler] = {
            "ping": self._ping,
            "logging/setLevel": self._set_level,
            "resources/subscribe": self._subscribe,
            "resources/unsubscribe": self._unsubscribe,
            "tools/list": self._tools_list,
        }
        self.get_status = 200  # anything else: GET streams are refused with this status (e.g. 405)
        self.sessions: list[Session] = []  # every session ever minted, in order
        self.calls: list[Call] = []  # every HTTP request, in order of arrival
        self._arrivals: defaultdict[str | None, asyncio.Queue[Call]] = defaultdict(asyncio.Queue)
        self._server_ids = itertools.count(101)
        self.app = web.Application()
        self.app.router.add_route("*", PATH, self._handle)
        self.url: str | None = None  # set by whoever serves `app`

    # ------------------------------------------------------------ scripting and observing

    def next_server_request_id(self) -> int:
        """Ids of server-to-client requests: unique across sessions, so tests can tell them apart."""
        return next(self._server_ids)

    def session(self, session_id: str | None) -> Session:
        for session in self.sessions:
            if session.id == session_id:
                return session
        raise KeyError(session_id)

    @property
    def live_sessions(self) -> list[Session]:
        return [s for s in self.sessions if s.known]

    def forget(self, session_id: str) -> None:
        """Lose a session's state (as after a restart): its id now answers HTTP 404."""
        self.session(session_id).known = False

    def calls_of(self, method: str) -> list[Call]:
        """Every POSTed request or notification for `method`."""
        return [c for c in self.calls if c.http_method == "POST" and c.method == method]

    @property
    def posted(self) -> list[Call]:
        return [c for c in self.calls if c.http_method == "POST"]

    @property
    def responses(self) -> list[Call]:
        """Every JSON-RPC response the client POSTed (answers to server requests)."""
        return [c for c in self.calls if c.http_method == "POST" and c.kind == "response"]

    async def next_call(self, key: str) -> Call:
        """The next not-yet-consumed arrival: a JSON-RPC method, "response", "GET" or "DELETE"."""
        return await self._arrivals[key].get()

    def protocol_problems(self) -> list[str]:
        """What the proxy sent that a 2025-11-25 server must not accept: schema and header faults."""
        problems: list[str] = []
        for call in self.posted:
            body = call.body
            label = call.method or call.kind
            if not isinstance(body, dict):
                problems.append(f"POST body is not a JSON-RPC object: {call.raw[:120]!r}")
                continue
            if call.kind == "request":
                definition = "ClientRequest" if call.method in client_request_methods(LEGACY) else "JSONRPCRequest"
                problems += [f"{label}: {p}" for p in schema_errors(LEGACY, definition, body)]
            elif call.kind == "notification":
                known = call.method in client_notification_methods(LEGACY)  # else an extension's
                definition = "ClientNotification" if known else "JSONRPCNotification"
                problems += [f"{label}: {p}" for p in schema_errors(LEGACY, definition, body)]
            elif call.kind == "response":
                problems += [f"response: {p}" for p in schema_errors(LEGACY, "JSONRPCResponse", body)]
                answered = call.answers.method if call.answers is not None else None
                if "result" in body and answered in _ANSWER_TYPES:
                    problems += [
                        f"{answered} answer: {p}"
                        for p in schema_errors(LEGACY, _ANSWER_TYPES[answered], body["result"])
                    ]
            else:
                problems.append(f"invalid JSON-RPC message: {body!r}")
            if call.method != "initialize" and call.session is not None:
                version = call.headers.get(PROTOCOL_VERSION_HEADER)
                if legacy_at_least(call.session.protocol_version, "2025-06-18") and version is None:
                    problems.append(f"{label}: no {PROTOCOL_VERSION_HEADER} header in a {LEGACY} session")
        return problems

    # ------------------------------------------------------------ serving

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        call = Call(self, request, raw, body)
        self.calls.append(call)
        try:
            response = await self._dispatch(call)
        except asyncio.CancelledError:
            if not call.dropped:
                call.cancelled.set()
            raise
        except ConnectionError:
            if not call.dropped:
                call.cancelled.set()
            response = call.response or web.Response(status=499)
        finally:
            call.done.set()
        call.status = response.status
        return response

    def _arrived(self, key: str | None, call: Call) -> None:
        self._arrivals[key].put_nowait(call)

    async def _dispatch(self, call: Call) -> web.StreamResponse:
        request = call.web_request
        if request.method == "POST":
            if call.kind == "request" and call.method == "initialize":
                return self._initialize(call)
            problem = self._bind_session(call)
            if problem is not None:
                self._arrived(call.method or call.kind, call)
                return problem
            return await self._post(call)
        problem = self._bind_session(call)
        self._arrived(request.method, call)
        if problem is not None:
            return problem
        assert call.session is not None
        if request.method == "GET":
            return await self._get(call, call.session)
        if request.method == "DELETE":
            call.session.known = False
            call.session.deleted.set()
            for stream in call.session.streams:
                stream.end()
            return web.Response(status=200)
        return web.Response(status=405, headers={"Allow": "GET, POST, DELETE"})

    def _bind_session(self, call: Call) -> web.Response | None:
        session_id = call.session_id
        if session_id is None:
            return Reply(400, jsonrpc.error_response(None, jsonrpc.INVALID_REQUEST, "Missing session id")).response()
        try:
            session = self.session(session_id)
        except KeyError:
            session = None
        if session is None or not session.known:
            return Reply(404, jsonrpc.error_response(None, SESSION_NOT_FOUND, "Session not found")).response()
        call.session = session
        version = call.headers.get(PROTOCOL_VERSION_HEADER)
        if version is not None and version != session.protocol_version:
            message = f"Unsupported protocol version: {version}"
            return Reply(400, jsonrpc.error_response(None, jsonrpc.INVALID_REQUEST, message)).response()
        return None

    def _initialize(self, call: Call) -> web.Response:
        if self.initialize_error is not None:
            self._arrived("initialize", call)
            return web.json_response({"jsonrpc": "2.0", "id": call.id, "error": self.initialize_error})
        session = Session(self, call)
        call.session = session
        self.sessions.append(session)
        self._arrived("initialize", call)
        result = copy.deepcopy(self.initialize_result)
        return web.json_response(jsonrpc.result_response(call.id, result), headers={SESSION_HEADER: session.id})

    async def _post(self, call: Call) -> web.StreamResponse:
        session = call.session
        assert session is not None
        kind = call.kind
        if kind == "response":
            pending = session.pending.pop(call.id, None)
            call.answers = pending
            if pending is not None and not pending.response.done():
                pending.response.set_result(call.body)
            self._arrived("response", call)
            return web.Response(status=202)
        if kind == "notification":
            if call.method == "notifications/initialized":
                session.initialized.set()
            self._arrived(call.method, call)
            return web.Response(status=202)
        if kind != "request":
            self._arrived(None, call)
            return Reply(400, jsonrpc.error_response(None, jsonrpc.INVALID_REQUEST, "Invalid Request")).response()
        self._arrived(call.method, call)
        handler = self.handlers.get(call.method or "", self._method_not_found)
        return await call.finish(await handler(call))

    async def _get(self, call: Call, session: Session) -> web.StreamResponse:
        if self.get_status != 200:
            return web.Response(status=self.get_status, headers={"Allow": "POST, DELETE"})
        stream = GetStream(call)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(call.web_request)
        call.response = response
        await response.write(b": stream open\n\n")  # flushes the headers now
        session.streams.append(stream)
        await session._streams_update()
        try:
            while (message := await stream.queue.get()) is not None:
                await response.write(sse_event(message, f"{session.id[:8]}-{next(stream._event_ids)}"))
            await response.write_eof()
        finally:
            session.streams.remove(stream)
            stream.closed.set()
        return response

    # ------------------------------------------------------------ built-in methods

    async def _ping(self, call: Call) -> Outcome:
        return {}

    async def _set_level(self, call: Call) -> Outcome:
        assert call.session is not None
        call.session.log_levels.append(call.params.get("level"))
        return {}

    async def _subscribe(self, call: Call) -> Outcome:
        assert call.session is not None
        call.session.subscribed.append(call.params.get("uri"))
        return {}

    async def _unsubscribe(self, call: Call) -> Outcome:
        assert call.session is not None
        call.session.unsubscribed.append(call.params.get("uri"))
        return {}

    async def _tools_list(self, call: Call) -> Outcome:
        return {"tools": copy.deepcopy(self.tools)}

    async def _method_not_found(self, call: Call) -> Outcome:
        return error(jsonrpc.METHOD_NOT_FOUND, f"Method not found: {call.method}")


async def hang(call: Call) -> Outcome:
    """A handler that never answers (until the proxy closes the request)."""
    await asyncio.Event().wait()
    return None


__all__ = [
    "INSTRUCTIONS",
    "LEGACY",
    "PATH",
    "SERVER_INFO",
    "Call",
    "FakeLegacy",
    "GetStream",
    "Outcome",
    "Pending",
    "Reply",
    "RpcError",
    "Session",
    "error",
    "hang",
    "initialize_result",
    "notification",
    "sse_event",
]
