"""A scripted modern (2026-07-28) MCP server for integration tests.

Serve `FakeModern().app` with pytest-aiohttp's `aiohttp_server` and point the proxy at
`/mcp`. Each test decides what the server does per JSON-RPC method::

    async def call_tool(call: Call) -> Outcome:
        await call.send(notification("notifications/progress", {...}))  # opens an SSE reply
        return complete(content=[{"type": "text", "text": "ok"}])       # final result

    fake.handlers["tools/call"] = call_tool

A handler returns a result object (wrapped into a JSON-RPC response under the request's id),
a whole JSON-RPC message (a dict with "jsonrpc"), a `Reply` (any HTTP response, e.g.
`error(...)` with a status), or None to end an SSE reply without a response. Everything the
server receives is recorded (`fake.calls`, `await fake.next_call(method)`), and each `Call`
knows whether the peer closed the connection before the handler finished (`call.cancelled`),
which is how a 2026-07-28 client cancels a request.

Built in: `server/discover` (answers `fake.discover`), `tools/list` (answers `fake.tools`),
`subscriptions/listen` (an SSE stream: acknowledgement first, then whatever the test pushes
through `Listen.push`), and -32601 with HTTP 404 for any other method without a handler.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDictProxy

from proxy.protocol import jsonrpc, meta
from proxy.protocol.versions import MODERN_VERSIONS
from tests.support.schema import client_request_methods, ext_tasks_errors
from tests.support.schema import errors as schema_errors

JSONDict = dict[str, Any]
MODERN = MODERN_VERSIONS[0]
PATH = "/mcp"
SERVER_INFO = {"name": "fake-modern", "version": "1.2.3"}
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
_EXT_TASK_REQUESTS = {
    "tasks/get": "GetTaskRequest",
    "tasks/update": "UpdateTaskRequest",
    "tasks/cancel": "CancelTaskRequest",
}


@dataclass
class Reply:
    """An HTTP response exactly as given (status, body, content type, extra headers)."""

    status: int = 200
    body: bytes | str | JSONDict | list[Any] | None = None
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    def response(self) -> web.Response:
        body = self.body
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        return web.Response(status=self.status, body=body, headers={"Content-Type": self.content_type, **self.headers})


@dataclass
class RpcError:
    """A JSON-RPC error response to the request, sent with `status` (or as an SSE event)."""

    code: int
    message: str
    data: Any = None
    status: int = 200


Outcome = JSONDict | Reply | RpcError | None
Handler = Callable[["Call"], Awaitable[Outcome]]


def complete(**fields: Any) -> JSONDict:
    """A complete 2026-07-28 result."""
    return {"resultType": "complete", **fields}


def input_required(input_requests: JSONDict | None = None, request_state: str | None = None) -> JSONDict:
    result: JSONDict = {"resultType": "input_required"}
    if input_requests is not None:
        result["inputRequests"] = input_requests
    if request_state is not None:
        result["requestState"] = request_state
    return result


def error(code: int, message: str, data: Any = None, *, status: int = 200) -> RpcError:
    return RpcError(code, message, data, status)


def notification(method: str, params: JSONDict | None = None) -> JSONDict:
    return jsonrpc.notification(method, params)


def discover_result() -> JSONDict:
    return {
        "resultType": "complete",
        "supportedVersions": list(MODERN_VERSIONS),
        "capabilities": {
            "tools": {"listChanged": True},
            "prompts": {"listChanged": True},
            "resources": {"subscribe": True, "listChanged": True},
            "logging": {},
            "completions": {},
        },
        "instructions": "A scripted fake modern MCP server.",
        "ttlMs": 60_000,
        "cacheScope": "public",
        "_meta": {meta.SERVER_INFO: dict(SERVER_INFO)},
    }


class Call:
    """One POST the fake received, and the means to answer it."""

    def __init__(self, request: web.Request, raw: bytes, body: Any) -> None:
        self.request = request
        self.raw = raw
        self.body = body
        self.headers: CIMultiDictProxy[str] = request.headers
        self.response: web.StreamResponse | None = None
        self.cancelled = asyncio.Event()  # the peer closed the connection before we finished
        self.done = asyncio.Event()  # the handler finished, one way or another

    @property
    def method(self) -> str | None:
        return self.body.get("method") if isinstance(self.body, dict) else None

    @property
    def id(self) -> Any:
        return self.body.get("id") if isinstance(self.body, dict) else None

    @property
    def params(self) -> JSONDict:
        params = self.body.get("params") if isinstance(self.body, dict) else None
        return params if isinstance(params, dict) else {}

    @property
    def meta(self) -> JSONDict:
        value = self.params.get("_meta")
        return value if isinstance(value, dict) else {}

    async def send(self, message: JSONDict) -> None:
        """Write one SSE event (opening the SSE reply on first use)."""
        await self.write(b"data: " + json.dumps(message).encode() + b"\n\n")

    async def write(self, data: bytes) -> None:
        if self.response is None:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await response.prepare(self.request)
            self.response = response
        try:
            await self.response.write(data)
        except ConnectionError:
            self.cancelled.set()
            raise

    def response_message(self, outcome: JSONDict) -> JSONDict:
        if "jsonrpc" in outcome:
            return outcome
        return jsonrpc.result_response(self.id, outcome)

    async def finish(self, outcome: Outcome) -> web.StreamResponse:
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


class Listen:
    """One `subscriptions/listen` stream the fake holds open."""

    def __init__(self, call: Call) -> None:
        self.call = call
        requested = call.params.get("notifications")
        self.filter: JSONDict = requested if isinstance(requested, dict) else {}
        self.ack: JSONDict | None = None
        self.acked = asyncio.Event()
        self._queue: asyncio.Queue[JSONDict | None] = asyncio.Queue()

    @property
    def subscription_id(self) -> Any:
        return self.call.id

    @property
    def closed(self) -> asyncio.Event:
        """Set when the proxy closed this listen stream."""
        return self.call.cancelled

    def push(self, method: str, params: JSONDict | None = None) -> None:
        """Queue a notification on this stream, tagged with the subscription id."""
        params = copy.deepcopy(params) if params else {}
        params.setdefault("_meta", {})[meta.SUBSCRIPTION_ID] = self.subscription_id
        self._queue.put_nowait(notification(method, params))

    def end(self) -> None:
        """End the subscription gracefully (a SubscriptionsListenResult, then close)."""
        self._queue.put_nowait(None)


class FakeModern:
    def __init__(self) -> None:
        self.discover: JSONDict = discover_result()
        self.tools: list[JSONDict] = []
        self.handlers: dict[str, Handler] = {
            "server/discover": self._discover,
            "tools/list": self._tools_list,
            "subscriptions/listen": self._listen,
        }
        self.calls: list[Call] = []
        self._arrivals: defaultdict[str | None, asyncio.Queue[Call]] = defaultdict(asyncio.Queue)
        self.listens: list[Listen] = []
        self._listens_changed = asyncio.Condition()
        # Listen behaviour: what to acknowledge for a requested filter, and an optional gate the
        # acknowledgement waits for (a test holds it to observe the proxy before the ack).
        self.listen_ack: Callable[[JSONDict], JSONDict] = lambda requested: dict(requested)
        self.ack_gate: asyncio.Event | None = None
        self.app = web.Application()
        self.app.router.add_route("*", PATH, self._handle)
        self.url: str | None = None  # set by whoever serves `app`

    # ------------------------------------------------------------ observing

    def calls_of(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    async def next_call(self, method: str) -> Call:
        """The next not-yet-consumed request for `method` (waits for it to arrive)."""
        return await self._arrivals[method].get()

    async def wait_listen(self, predicate: Callable[[Listen], bool] | None = None, *, acked: bool = True) -> Listen:
        """The newest listen stream matching `predicate` (acknowledged, unless acked=False)."""
        async with self._listens_changed:
            while True:
                for listen in reversed(self.listens):
                    if (predicate is None or predicate(listen)) and (listen.acked.is_set() or not acked):
                        return listen
                await self._listens_changed.wait()

    async def _listens_update(self) -> None:
        async with self._listens_changed:
            self._listens_changed.notify_all()

    def schema_problems(self) -> list[str]:
        """Every received request that is not a valid 2026-07-28 ClientRequest (or, for the
        methods of the io.modelcontextprotocol/tasks extension, a valid request of its schema)."""
        problems: list[str] = []
        for call in self.calls:
            if call.request.method == "POST" and isinstance(call.body, dict) and "id" in call.body:
                extension = _EXT_TASK_REQUESTS.get(call.method or "")
                found = (
                    ext_tasks_errors(extension, call.body)
                    if extension is not None
                    else schema_errors(MODERN, "ClientRequest", call.body)
                    if call.method in client_request_methods(MODERN)
                    else schema_errors(MODERN, "JSONRPCRequest", call.body)  # an extension's request
                )
                problems += [f"{call.method}: {p}" for p in found]
        return problems

    # ------------------------------------------------------------ serving

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        call = Call(request, raw, body)
        self.calls.append(call)
        self._arrivals[call.method].put_nowait(call)
        if request.method != "POST":
            return web.Response(status=405)
        if body is None:
            return Reply(400, jsonrpc.error_response(None, jsonrpc.PARSE_ERROR, "Parse error")).response()
        if call.id is None:
            return web.Response(status=202)  # a notification
        handler = self.handlers.get(call.method or "", self._method_not_found)
        try:
            return await call.finish(await handler(call))
        except asyncio.CancelledError:
            call.cancelled.set()
            raise
        except ConnectionError:
            call.cancelled.set()
            return call.response or web.Response(status=499)
        finally:
            call.done.set()

    async def _discover(self, call: Call) -> Outcome:
        return copy.deepcopy(self.discover)

    async def _tools_list(self, call: Call) -> Outcome:
        return complete(tools=copy.deepcopy(self.tools))

    async def _method_not_found(self, call: Call) -> Outcome:
        return error(jsonrpc.METHOD_NOT_FOUND, f"Method not found: {call.method}", status=404)

    async def _listen(self, call: Call) -> Outcome:
        listen = Listen(call)
        self.listens.append(listen)
        await self._listens_update()
        if self.ack_gate is not None:
            await self.ack_gate.wait()
        listen.ack = self.listen_ack(listen.filter)
        await call.send(
            notification(ACKNOWLEDGED, {"_meta": {meta.SUBSCRIPTION_ID: call.id}, "notifications": listen.ack})
        )
        listen.acked.set()
        await self._listens_update()
        while True:
            message = await listen._queue.get()
            if message is None:
                return complete(_meta={meta.SUBSCRIPTION_ID: call.id})
            await call.send(message)


async def hang(call: Call) -> Outcome:
    """A handler that never answers (until the proxy gives up and closes the request)."""
    await asyncio.Event().wait()
    return None


__all__ = [
    "MODERN",
    "PATH",
    "SERVER_INFO",
    "Call",
    "FakeModern",
    "Listen",
    "Outcome",
    "Reply",
    "RpcError",
    "complete",
    "discover_result",
    "error",
    "hang",
    "input_required",
    "notification",
]
