"""Modern-only (MCP 2026-07-28) e2e test peer built on the `mcp==2.3.0` SDK.

Serves Streamable HTTP at http://127.0.0.1:PORT/mcp. A small ASGI middleware in
front of the SDK app rejects every legacy request:

* POST whose JSON body has ``method == "initialize"`` (also inside a batch), or
  whose ``MCP-Protocol-Version`` header is missing or not ``2026-07-28``
  -> HTTP 400, JSON-RPC error -32022 "Unsupported protocol version".
* GET / DELETE -> HTTP 405.

Everything else reaches the SDK unchanged (the SDK itself then enforces the
modern envelope: ``_meta`` protocol version / client capabilities, the
``Mcp-Method`` / ``Mcp-Name`` / ``Mcp-Param-*`` header checks, ...).

Run with the mcp 2.3.0 virtualenv::

    /tmp/venv-mcp2/bin/python tests/e2e/peers/modern_server.py --port 8765

Prints ``READY http://127.0.0.1:PORT/mcp`` (flushed) on stdout once listening
(``--port 0`` picks a free port and prints the real one). Logs go to stderr.
Exits cleanly on SIGTERM / SIGINT.

``--stdio`` (instead of ``--port``) serves the same server over the MCP stdio
transport: newline-delimited JSON-RPC on stdin/stdout, nothing else on stdout
(no READY line; fd 1 is pointed at stderr while serving, the wire uses a private
duplicate), logs on stderr. Exits 0 when stdin reaches EOF (in-flight requests,
open listen streams included, are cancelled) and on SIGTERM / SIGINT (open
listen streams first get their final result frame). The SDK's stdio server picks
the era from the first request, so a line filter in front of it keeps the peer
modern-only: every request that is ``initialize`` or lacks
``_meta["io.modelcontextprotocol/protocolVersion"]`` is answered with JSON-RPC
error -32022 ``{"supported": ["2026-07-28"], "requested": <protocolVersion|null>}``
and never reaches the SDK.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Annotated, Any

# Logging must be configured before the SDK's MCPServer calls basicConfig, so
# that everything goes to stderr through a plain handler.
logging.basicConfig(
    stream=sys.stderr,
    level=logging.WARNING,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
)

import anyio  # noqa: E402
import uvicorn  # noqa: E402
from mcp.server.mcpserver import Context, MCPServer  # noqa: E402
from mcp.server.stdio import stdio_server  # noqa: E402
from mcp.server.transport_security import TransportSecuritySettings  # noqa: E402
from mcp.shared.exceptions import MCPDeprecationWarning  # noqa: E402
from mcp_types import (  # noqa: E402
    PROTOCOL_VERSION_META_KEY,
    Completion,
    CompletionArgument,
    CompletionContext,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    CreateMessageResultWithTools,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    EmptyResult,
    InputRequiredResult,
    ListRootsRequest,
    ListRootsResult,
    PromptReference,
    ResourceTemplateReference,
    SamplingMessage,
    SetLevelRequestParams,
    TextContent,
)
from pydantic import Field  # noqa: E402

# Logging / sampling / roots are deprecated at 2026-07-28 (SEP-2577) but still
# served; silence the SDK's deprecation warnings.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

logger = logging.getLogger("modern-server")

MODERN_VERSION = "2026-07-28"
HOST = "127.0.0.1"
PATH = "/mcp"

SERVER_NAME = "modern-e2e-server"
SERVER_VERSION = "1.0.0"
INSTRUCTIONS = "modern e2e test server"

ELICIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string", "description": "Your name"}},
    "required": ["name"],
}

mcp: MCPServer = MCPServer(
    SERVER_NAME,
    version=SERVER_VERSION,
    instructions=INSTRUCTIONS,
    log_level="WARNING",
)

_state: dict[str, int] = {"dynamic": 0, "watched": 1}


# --------------------------------------------------------------------------- helpers


def _text(result: Any) -> str:
    """Concatenate the text blocks of a sampling result's content."""
    content = getattr(result, "content", None)
    blocks = content if isinstance(content, list) else [content]
    return "".join(getattr(b, "text", "") or "" for b in blocks if b is not None)


def _elicit_request(message: str) -> ElicitRequest:
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=ELICIT_SCHEMA))


def _sampling_request(prompt: str) -> CreateMessageRequest:
    return CreateMessageRequest(
        params=CreateMessageRequestParams(
            messages=[SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
            max_tokens=50,
        )
    )


def _elicit_summary(resp: Any) -> tuple[str, str]:
    if not isinstance(resp, ElicitResult):
        return "missing", ""
    name = (resp.content or {}).get("name", "") if resp.action == "accept" else ""
    return resp.action, str(name)


# --------------------------------------------------------------------------- tools


@mcp.tool(description="Echo the given text back.", structured_output=False)
def echo(text: str) -> str:
    return f"echo: {text}"


@mcp.tool(description="Send three progress notifications, then finish.", structured_output=False)
async def progress(ctx: Context) -> str:
    for i in (1, 2, 3):
        await ctx.report_progress(i, 3, f"step {i} of 3")
        await asyncio.sleep(0.02)
    return "progress done"


CANCELLED = {"count": 0}  # `slow` calls cancelled before they finished (a 2026-07-28 client closes the POST)


@mcp.tool(description="Sleep `seconds` in 0.1 s steps, reporting progress each step.", structured_output=False)
async def slow(seconds: float, ctx: Context) -> str:
    steps = max(1, round(seconds / 0.1))
    print(f"STARTED slow id={ctx.request_id}", file=sys.stderr, flush=True)  # a test can see it run
    try:
        for i in range(1, steps + 1):
            await ctx.report_progress(i, steps, f"step {i} of {steps}")
            await asyncio.sleep(0.1)
    except anyio.get_cancelled_exc_class():
        CANCELLED["count"] += 1
        print(f"CANCELLED slow id={ctx.request_id}", file=sys.stderr, flush=True)
        raise
    return "slow done"


@mcp.tool(description="Number of `slow` calls cancelled so far.", structured_output=False)
def cancelled_count() -> str:
    return str(CANCELLED["count"])


@mcp.tool(description="Emit log messages at debug, info, warning and error.", structured_output=False)
async def log(ctx: Context) -> str:
    for level in ("debug", "info", "warning", "error"):
        await ctx.log(level, f"{level} message", logger_name="modern-server")  # type: ignore[arg-type]
    return "logged"


@mcp.tool(description="Ask the client for a name via elicitation (form mode).", structured_output=False)
async def elicit(message: str, ctx: Context) -> str | InputRequiredResult:
    responses = ctx.input_responses or {}
    if "elicit" not in responses:
        return InputRequiredResult(input_requests={"elicit": _elicit_request(message)})
    action, name = _elicit_summary(responses["elicit"])
    return f"elicited: action={action} name={name}"


@mcp.tool(description="Ask the client's LLM via sampling/createMessage.", structured_output=False)
async def sample(prompt: str, ctx: Context) -> str | InputRequiredResult:
    responses = ctx.input_responses or {}
    resp = responses.get("sample")
    if not isinstance(resp, CreateMessageResult | CreateMessageResultWithTools):
        return InputRequiredResult(input_requests={"sample": _sampling_request(prompt)})
    return f"sampled: {_text(resp)}"


@mcp.tool(description="Ask the client for its roots.", structured_output=False)
async def roots(ctx: Context) -> str | InputRequiredResult:
    responses = ctx.input_responses or {}
    resp = responses.get("roots")
    if not isinstance(resp, ListRootsResult):
        return InputRequiredResult(input_requests={"roots": ListRootsRequest()})
    return "roots: " + ",".join(str(r.uri) for r in resp.roots)


@mcp.tool(description="Two rounds: elicitation (key 'first'), then sampling (key 'second').", structured_output=False)
async def multi(ctx: Context) -> str | InputRequiredResult:
    responses = ctx.input_responses or {}
    state: dict[str, Any] = json.loads(ctx.request_state) if ctx.request_state else {}
    if "first" in responses:
        _, state["name"] = _elicit_summary(responses["first"])
        state["round"] = 2
    if "name" not in state:
        return InputRequiredResult(
            input_requests={"first": _elicit_request("multi: what is your name?")},
            request_state=json.dumps({"round": 1}),
        )
    second = responses.get("second")
    if not isinstance(second, CreateMessageResult | CreateMessageResultWithTools):
        return InputRequiredResult(
            input_requests={"second": _sampling_request(f"multi: say something to {state['name']}")},
            request_state=json.dumps(state),
        )
    return f"multi: name={state['name']} sample={_text(second)}"


@mcp.tool(description="Register a new tool dynamic_<n> and announce tools/list_changed.", structured_output=False)
async def add_tool(ctx: Context) -> str:
    _state["dynamic"] += 1
    name = f"dynamic_{_state['dynamic']}"

    def dynamic() -> str:
        return f"{name} called"

    mcp.add_tool(dynamic, name=name, description=f"Dynamically added tool {name}.", structured_output=False)
    await ctx.notify_tools_changed()
    return f"added {name}"


@mcp.tool(description="Announce notifications/resources/updated for a URI.", structured_output=False)
async def touch(uri: str, ctx: Context) -> str:
    if uri == "test://watched":
        _state["watched"] += 1
    await ctx.notify_resource_updated(uri)
    return f"touched {uri}"


@mcp.tool(description="Echo the region argument (mirrored into the Mcp-Param-Region header).", structured_output=False)
async def header_tool(
    region: Annotated[str, Field(description="Region", json_schema_extra={"x-mcp-header": "Region"})],
    ctx: Context,
) -> str:
    headers = ctx.headers
    value = headers.get("mcp-param-region") if headers is not None else None
    if value is None:
        return f"region: {region}"
    return f"region: {region} header: {value}"


# --------------------------------------------------------------------------- resources


@mcp.resource("test://static", name="static", mime_type="text/plain", description="Static test resource")
def static_resource() -> str:
    return "static content"


@mcp.resource("test://watched", name="watched", mime_type="text/plain", description="Changes on each touch")
def watched_resource() -> str:
    return f"watched v{_state['watched']}"


@mcp.resource("test://items/{id}", name="item", mime_type="text/plain", description="Item by id")
def item_resource(id: str) -> str:
    return f"item {id}"


# --------------------------------------------------------------------------- prompts / completions

GREET_NAMES = ["alice", "alan", "bob"]


@mcp.prompt(description="Greet someone by name.")
def greet(name: str) -> str:
    return f"Hello, {name}!"


@mcp.completion()
async def complete(
    ref: PromptReference | ResourceTemplateReference,
    argument: CompletionArgument,
    context: CompletionContext | None,
) -> Completion | None:
    if isinstance(ref, PromptReference) and ref.name == "greet" and argument.name == "name":
        values = [v for v in GREET_NAMES if v.startswith(argument.value or "")]
        return Completion(values=values, total=len(values), has_more=False)
    return Completion(values=[], total=0, has_more=False)


# logging capability: the SDK advertises `logging` only when a logging/setLevel
# handler is registered (at 2026-07-28 delivery is opted into per request via
# `_meta["io.modelcontextprotocol/logLevel"]`; setLevel itself is a no-op here).
async def _set_level(ctx: Any, params: SetLevelRequestParams) -> EmptyResult:
    return EmptyResult()


mcp._lowlevel_server.add_request_handler("logging/setLevel", SetLevelRequestParams, _set_level)  # pyright: ignore[reportPrivateUsage]


# --------------------------------------------------------------------------- legacy-rejecting middleware


class ModernOnlyMiddleware:
    """Reject legacy (pre-2026-07-28) traffic before it reaches the SDK app."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "")
        if method in ("GET", "DELETE"):
            await _send_json(send, 405, {"error": "method not allowed"}, extra=[(b"allow", b"POST")])
            return
        if method != "POST":
            await self.app(scope, receive, send)
            return

        # Buffer the whole body so it can be inspected, then replay it.
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)

        version: str | None = None
        for key, value in scope.get("headers", []):
            if key.lower() == b"mcp-protocol-version":
                version = value.decode("latin-1")
                break

        req_id: Any = None
        is_initialize = False
        try:
            decoded = json.loads(body)
        except (ValueError, RecursionError):
            decoded = None
        messages = decoded if isinstance(decoded, list) else [decoded]
        for msg in messages:
            if isinstance(msg, dict):
                if req_id is None and isinstance(msg.get("id"), str | int) and not isinstance(msg.get("id"), bool):
                    req_id = msg["id"]
                if msg.get("method") == "initialize":
                    is_initialize = True

        if is_initialize or version != MODERN_VERSION:
            logger.info("rejecting legacy request (initialize=%s, version=%r)", is_initialize, version)
            await _send_json(
                send,
                400,
                {
                    "jsonrpc": "2.0",
                    "id": req_id,
                    "error": {
                        "code": -32022,
                        "message": "Unsupported protocol version",
                        "data": {"supported": [MODERN_VERSION], "requested": version},
                    },
                },
            )
            return

        replayed = False

        async def replay_receive() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay_receive, send)


async def _send_json(send: Any, status: int, payload: Any, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    data = json.dumps(payload, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    headers.extend(extra or [])
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data, "more_body": False})


def build_app(json_response: bool = False) -> Any:
    sdk_app = mcp.streamable_http_app(
        streamable_http_path=PATH,
        json_response=json_response,
        host=HOST,
        # The peer sits behind the proxy under test; don't second-guess Host/Origin.
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    return ModernOnlyMiddleware(sdk_app)


# --------------------------------------------------------------------------- stdio transport

_LINE_LIMIT = 64 * 1024 * 1024


class _StdinLines:
    """Async iterator over the wire's stdin lines (str, newline kept), as the SDK's stdio server reads them."""

    def __init__(self, reader: asyncio.StreamReader | None, file: Any) -> None:
        self._reader = reader  # None: not pollable (regular file), blocking reads in a thread
        self._file = file

    def __aiter__(self) -> _StdinLines:
        return self

    async def __anext__(self) -> str:
        while True:
            if self._reader is not None:
                try:
                    data = await self._reader.readline()
                except ValueError:
                    logger.warning("dropping a stdin line longer than %d bytes", _LINE_LIMIT)
                    continue
            else:
                data = await anyio.to_thread.run_sync(self._file.readline)
            if not data:
                raise StopAsyncIteration
            return data.decode("utf-8", errors="replace")


class _StdoutLines:
    """The wire's stdout; each `write` lands whole (no await before the bytes are queued)."""

    def __init__(self, writer: asyncio.StreamWriter | None, file: Any) -> None:
        self._writer = writer  # None: not pollable (regular file), plain blocking writes
        self._file = file
        self._broken = False

    async def write(self, text: str) -> None:
        self.write_nowait(text)

    def write_nowait(self, text: str) -> None:
        if self._broken:
            return
        data = text.encode("utf-8")
        if self._writer is not None:
            if self._writer.transport.is_closing():
                self._broken = True
                return
            self._writer.write(data)
            return
        try:
            self._file.write(data)
        except OSError:
            self._broken = True

    async def flush(self) -> None:
        if self._broken:
            return
        try:
            if self._writer is not None:
                await self._writer.drain()
            else:
                self._file.flush()
        except (ConnectionError, OSError):
            self._broken = True  # the client stopped reading; keep serving until stdin EOF


@asynccontextmanager
async def _stdio_pipes() -> AsyncIterator[tuple[_StdinLines, _StdoutLines]]:
    """Take over stdin/stdout for the wire; fd 0 -> /dev/null and fd 1 -> stderr meanwhile."""
    loop = asyncio.get_running_loop()
    sys.stdout.flush()
    wire_in, wire_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)  # stray prints must never reach the wire
    was_blocking = (os.get_blocking(wire_in), os.get_blocking(wire_out))
    in_file = os.fdopen(wire_in, "rb")
    out_file = os.fdopen(wire_out, "wb")
    reader: asyncio.StreamReader | None = asyncio.StreamReader(limit=_LINE_LIMIT)
    writer: asyncio.StreamWriter | None = None
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), in_file)  # type: ignore[arg-type]
    except (ValueError, OSError):
        reader = None
    try:
        transport, protocol = await loop.connect_write_pipe(
            lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), out_file
        )
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
    except (ValueError, OSError):
        writer = None
    try:
        yield _StdinLines(reader, in_file), _StdoutLines(writer, out_file)
    finally:
        if writer is not None:
            writer.close()  # flushes what is still queued, then closes the wire
            with suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1)
        else:
            with suppress(OSError):
                out_file.close()
        with suppress(OSError, ValueError):
            in_file.close()
        for fd, blocking in zip((wire_in, wire_out), was_blocking, strict=True):
            with suppress(OSError):
                os.set_blocking(fd, blocking)  # shared with the parent (e.g. a tty)


def _legacy_rejection(line: str) -> str | None:
    """The -32022 error line for a legacy request, or None to let the line through to the SDK."""
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(msg, dict) or not isinstance(msg.get("method"), str):
        return None
    req_id = msg.get("id")
    if not isinstance(req_id, str | int) or isinstance(req_id, bool):
        return None  # a notification: nothing to answer
    params = msg.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    meta_version = meta.get(PROTOCOL_VERSION_META_KEY, None) if isinstance(meta, dict) else None
    has_envelope = isinstance(meta, dict) and PROTOCOL_VERSION_META_KEY in meta
    if msg["method"] != "initialize" and has_envelope:
        return None
    requested = params.get("protocolVersion") if isinstance(params, dict) else None
    if not isinstance(requested, str):
        requested = meta_version if isinstance(meta_version, str) else None
    logger.info("rejecting legacy stdio request %r (requested=%r)", msg["method"], requested)
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": req_id,
            "error": {
                "code": -32022,
                "message": "Unsupported protocol version",
                "data": {"supported": [MODERN_VERSION], "requested": requested},
            },
        },
        separators=(",", ":"),
    )


class _ModernOnlyLines:
    """Line filter in front of the SDK's stdio server: answers legacy requests itself."""

    def __init__(self, lines: _StdinLines, stdout: _StdoutLines) -> None:
        self._lines = lines
        self._stdout = stdout

    def __aiter__(self) -> _ModernOnlyLines:
        return self

    async def __anext__(self) -> str:
        while True:
            line = await self._lines.__anext__()
            if not line.strip():
                continue
            rejection = _legacy_rejection(line)
            if rejection is None:
                return line
            self._stdout.write_nowait(rejection + "\n")
            await self._stdout.flush()


def _close_listen_streams() -> None:
    entry = mcp._lowlevel_server.get_request_handler("subscriptions/listen")  # pyright: ignore[reportPrivateUsage]
    close = getattr(entry.handler, "close", None) if entry is not None else None
    if close is not None:
        close()


async def _serve_stdio() -> None:
    lowlevel = mcp._lowlevel_server  # pyright: ignore[reportPrivateUsage]
    loop = asyncio.get_running_loop()
    async with _stdio_pipes() as (stdin, stdout):
        with anyio.CancelScope() as scope:

            def on_signal() -> None:
                # Let open listen streams send their final result frame, then stop.
                _close_listen_streams()
                loop.call_later(0.2, scope.cancel)

            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, on_signal)
            try:
                async with stdio_server(_ModernOnlyLines(stdin, stdout), stdout) as (read_stream, write_stream):  # type: ignore[arg-type]
                    await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
            finally:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)


# --------------------------------------------------------------------------- main


class _GracefulServer(uvicorn.Server):
    """uvicorn server that also ends open `subscriptions/listen` streams on SIGINT/SIGTERM.

    Without this an open listen stream keeps its connection busy until uvicorn's
    graceful-shutdown timeout cancels it. `ListenHandler.close()` makes each stream
    send its final `SubscriptionsListenResult` frame and end normally.
    """

    def __init__(self, config: uvicorn.Config, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(config)
        self._loop = loop

    def handle_exit(self, sig: int, frame: Any) -> None:
        entry = mcp._lowlevel_server.get_request_handler("subscriptions/listen")  # pyright: ignore[reportPrivateUsage]
        close = getattr(entry.handler, "close", None) if entry is not None else None
        if close is not None:
            self._loop.call_soon_threadsafe(close)
        super().handle_exit(sig, frame)
        # uvicorn re-raises captured signals after shutdown (exit status 128+sig);
        # a test peer should exit 0 after a requested shutdown instead.
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()


async def _serve(port: int, json_response: bool) -> None:
    config = uvicorn.Config(
        build_app(json_response),
        host=HOST,
        port=port,
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=1,
    )
    server = _GracefulServer(config, asyncio.get_running_loop())

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.01)
        actual = port
        for srv in server.servers:
            for sock in srv.sockets:
                actual = sock.getsockname()[1]
                break
        print(f"READY http://{HOST}:{actual}{PATH}", flush=True)

    announcer = asyncio.create_task(announce())
    try:
        await server.serve()  # installs SIGINT/SIGTERM handlers, returns on shutdown
    finally:
        announcer.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Modern-only (2026-07-28) MCP e2e test server")
    transport = parser.add_mutually_exclusive_group(required=True)
    transport.add_argument("--port", type=int, help="TCP port on 127.0.0.1 (0 = pick a free one)")
    transport.add_argument(
        "--stdio",
        action="store_true",
        help="serve over the MCP stdio transport (newline-delimited JSON-RPC on stdin/stdout) instead of HTTP",
    )
    parser.add_argument(
        "--json-response",
        action="store_true",
        help="answer non-listen requests with plain application/json (the SDK then DROPS "
        "progress and log notifications; subscriptions/listen stays SSE)",
    )
    args = parser.parse_args(argv)
    if args.stdio and args.json_response:
        parser.error("--json-response applies to HTTP only")
    try:
        asyncio.run(_serve_stdio() if args.stdio else _serve(args.port, args.json_response))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
