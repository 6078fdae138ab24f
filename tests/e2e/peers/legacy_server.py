"""Legacy-only (MCP 2025-11-25 and older) e2e test peer built on the `mcp==1.30.0` SDK.

Mirrors ``modern_server.py`` (same tool / prompt / resource names and result
texts) so the same scenarios can run against a legacy upstream. Classic
stateful Streamable HTTP at http://127.0.0.1:PORT/mcp: ``initialize`` +
``Mcp-Session-Id``, server->client requests (elicitation, sampling, roots)
sent in-band while a ``tools/call`` is running, standalone GET stream for
unrelated notifications, DELETE to end a session.

Run with the mcp 1.30.0 virtualenv::

    ~/.cache/mcp-era-proxy/venvs/mcp1/bin/python tests/e2e/peers/legacy_server.py --port 0

Prints ``READY http://127.0.0.1:PORT/mcp`` (flushed) on stdout once listening
(``--port 0`` picks a free port and prints the real one). Logs go to stderr.
Exits cleanly (status 0) on SIGTERM / SIGINT.

Wire behaviour (SSE mode, the default):

* progress, log messages and the elicitation / sampling / roots requests of a
  ``tools/call`` go on that POST's SSE response stream (``related_request_id``).
  Server requests carry no ``_meta.progressToken``.
* ``notifications/tools/list_changed`` (broadcast to every known session) and
  ``notifications/resources/updated`` (only to sessions subscribed to the URI)
  go on the standalone GET stream; they are silently dropped for a session that
  has no GET stream open.
* ``notifications/cancelled`` for a running request cancels the handler and the
  SDK then still answers the request with a JSON-RPC error
  ``{"code": 0, "message": "Request cancelled"}``.

With ``--json-response`` every POST is answered with a single JSON body; the
SDK then DROPS notifications related to a request (progress, log messages).
So that elicitation / sampling / roots don't deadlock in that mode, this server
sends those requests on the standalone GET stream instead (without a GET
stream open they are lost and the tool call hangs).

Cancellation is observable: every cancelled ``slow`` call writes a stderr line
``CANCELLED slow id=<request id> reason=<notifications/cancelled|transport>``
and increments the counter returned by the ``cancelled_count`` tool.

``--stdio`` (instead of ``--port``) serves the same server over the MCP stdio
transport: newline-delimited JSON-RPC on stdin/stdout, nothing else on stdout
(no READY line; fd 1 is pointed at stderr while serving, the wire uses a private
duplicate), logs on stderr. One session per process: everything (responses,
server->client requests, progress, logs, list_changed, resources/updated) is
interleaved on stdout. Exits 0 when stdin reaches EOF (in-flight requests are
cancelled, ``slow`` then reports ``reason=transport``) and on SIGTERM / SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

# Logging must be configured before FastMCP calls basicConfig (it would install
# a rich handler otherwise), so that everything goes to stderr through a plain handler.
logging.basicConfig(
    stream=sys.stderr,
    level=logging.WARNING,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
)

import anyio  # noqa: E402
import uvicorn  # noqa: E402
from mcp import types  # noqa: E402
from mcp.server.fastmcp import Context, FastMCP  # noqa: E402
from mcp.server.lowlevel.server import NotificationOptions  # noqa: E402
from mcp.server.models import InitializationOptions  # noqa: E402
from mcp.server.session import ServerSession  # noqa: E402
from mcp.server.stdio import stdio_server  # noqa: E402
from mcp.shared.message import ServerMessageMetadata  # noqa: E402
from pydantic import AnyUrl  # noqa: E402

logger = logging.getLogger("legacy-server")


class _QuietStandaloneClose(logging.Filter):
    """Drop the SDK's traceback when a session with an open GET stream is DELETEd (harmless)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (
            record.getMessage() == "Error in standalone SSE writer" and isinstance(exc, anyio.ClosedResourceError)
        )


logging.getLogger("mcp.server.streamable_http").addFilter(_QuietStandaloneClose())

HOST = "127.0.0.1"
PATH = "/mcp"

SERVER_NAME = "legacy-e2e-server"
SERVER_VERSION = "1.0.0"
INSTRUCTIONS = "legacy e2e test server"
LOGGER_NAME = "legacy-server"

ELICIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string", "description": "Your name"}},
    "required": ["name"],
}

LOG_LEVELS: list[str] = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]

mcp: FastMCP = FastMCP(
    SERVER_NAME,
    instructions=INSTRUCTIONS,
    host=HOST,
    streamable_http_path=PATH,
    log_level="WARNING",
)
_server = mcp._mcp_server  # low-level mcp.server.lowlevel.Server
_server.version = SERVER_VERSION  # FastMCP 1.x has no version argument

_state: dict[str, Any] = {
    "dynamic": 0,
    "watched": 1,
    "json_response": False,
    "cancelled": 0,
}
# Module-level record of cancelled `slow` calls: (request id, reason).
CANCELLED: list[tuple[str, str]] = []

# Every session that has sent a request (for list_changed broadcasts).
_sessions: weakref.WeakSet[ServerSession] = weakref.WeakSet()
# uri -> sessions subscribed to it.
_subscriptions: dict[str, weakref.WeakSet[ServerSession]] = {}
# session -> minimum log level set via logging/setLevel (default: everything).
_log_levels: weakref.WeakKeyDictionary[ServerSession, str] = weakref.WeakKeyDictionary()


# --------------------------------------------------------------------------- helpers


def _text(result: Any) -> str:
    """Concatenate the text blocks of a sampling result's content."""
    content = getattr(result, "content", None)
    blocks = content if isinstance(content, list) else [content]
    return "".join(getattr(b, "text", "") or "" for b in blocks if b is not None)


def _related(ctx: Context) -> Any:
    """Request id that server->client requests are tied to (None in JSON mode: GET stream)."""
    return None if _state["json_response"] else ctx.request_context.request_id


async def _elicit(ctx: Context, message: str) -> tuple[str, str]:
    result = await ctx.session.elicit_form(message, ELICIT_SCHEMA, related_request_id=_related(ctx))
    name = (result.content or {}).get("name", "") if result.action == "accept" else ""
    return result.action, str(name)


async def _sample(ctx: Context, prompt: str) -> str:
    result = await ctx.session.create_message(
        messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))],
        max_tokens=50,
        related_request_id=_related(ctx),
    )
    return _text(result)


async def _list_roots(ctx: Context) -> types.ListRootsResult:
    # ServerSession.list_roots() takes no related_request_id (it would always use
    # the GET stream); send it ourselves so it is tied to the tools/call like
    # elicitation and sampling.
    return await ctx.session.send_request(
        types.ServerRequest(types.ListRootsRequest()),
        types.ListRootsResult,
        metadata=ServerMessageMetadata(related_request_id=_related(ctx)),
    )


async def _log(ctx: Context, level: str, message: str) -> None:
    minimum = _log_levels.get(ctx.session, "debug")
    if LOG_LEVELS.index(level) < LOG_LEVELS.index(minimum):
        return
    await ctx.session.send_log_message(
        level=level,  # type: ignore[arg-type]
        data=message,
        logger=LOGGER_NAME,
        related_request_id=ctx.request_id,
    )


def _is_cancelled_by_client(ctx: Context) -> bool:
    """True when the running request was cancelled by notifications/cancelled."""
    responder = ctx.session._in_flight.get(ctx.request_context.request_id)
    return bool(responder is not None and responder.cancelled)


# --------------------------------------------------------------------------- tools


@mcp.tool(description="Echo the given text back.", structured_output=False)
def echo(text: str) -> str:
    return f"echo: {text}"


@mcp.tool(description="Send three progress notifications, then finish.", structured_output=False)
async def progress(ctx: Context) -> str:
    for i in (1, 2, 3):
        await ctx.report_progress(i, 3, f"step {i} of 3")
        await anyio.sleep(0.02)
    return "progress done"


@mcp.tool(description="Emit log messages at debug, info, warning and error.", structured_output=False)
async def log(ctx: Context) -> str:
    for level in ("debug", "info", "warning", "error"):
        await _log(ctx, level, f"{level} message")
    return "logged"


@mcp.tool(description="Ask the client for a name via elicitation (form mode).", structured_output=False)
async def elicit(message: str, ctx: Context) -> str:
    action, name = await _elicit(ctx, message)
    return f"elicited: action={action} name={name}"


@mcp.tool(description="Ask the client's LLM via sampling/createMessage.", structured_output=False)
async def sample(prompt: str, ctx: Context) -> str:
    return f"sampled: {await _sample(ctx, prompt)}"


@mcp.tool(description="Ask the client for its roots.", structured_output=False)
async def roots(ctx: Context) -> str:
    result = await _list_roots(ctx)
    return "roots: " + ",".join(str(r.uri) for r in result.roots)


@mcp.tool(description="Two rounds: elicitation, then sampling.", structured_output=False)
async def multi(ctx: Context) -> str:
    _, name = await _elicit(ctx, "multi: what is your name?")
    text = await _sample(ctx, f"multi: say something to {name}")
    return f"multi: name={name} sample={text}"


@mcp.tool(description="Register a new tool dynamic_<n> and announce tools/list_changed.", structured_output=False)
async def add_tool(ctx: Context) -> str:
    _state["dynamic"] += 1
    name = f"dynamic_{_state['dynamic']}"

    def dynamic() -> str:
        return f"{name} called"

    mcp.add_tool(dynamic, name=name, description=f"Dynamically added tool {name}.", structured_output=False)
    _sessions.add(ctx.session)
    for session in list(_sessions):
        try:
            await session.send_tool_list_changed()  # unrelated -> standalone GET stream
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            _sessions.discard(session)
    return f"added {name}"


@mcp.tool(description="Announce notifications/resources/updated for a URI.", structured_output=False)
async def touch(uri: str, ctx: Context) -> str:
    if uri == "test://watched":
        _state["watched"] += 1
    subscribers = _subscriptions.get(uri)
    for session in list(subscribers or ()):
        try:
            await session.send_resource_updated(AnyUrl(uri))  # unrelated -> standalone GET stream
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            subscribers.discard(session)  # type: ignore[union-attr]
    return f"touched {uri}"


@mcp.tool(description="Sleep `seconds` in small steps, reporting progress each step.", structured_output=False)
async def slow(seconds: float, ctx: Context) -> str:
    step = 0.1
    steps = max(1, round(seconds / step))
    print(f"STARTED slow id={ctx.request_id}", file=sys.stderr, flush=True)  # a test can see it run
    try:
        for i in range(1, steps + 1):
            await anyio.sleep(seconds / steps)
            await ctx.report_progress(i, steps, f"slow step {i} of {steps}")
    except anyio.get_cancelled_exc_class():
        reason = "notifications/cancelled" if _is_cancelled_by_client(ctx) else "transport"
        _state["cancelled"] += 1
        CANCELLED.append((ctx.request_id, reason))
        print(f"CANCELLED slow id={ctx.request_id} reason={reason}", file=sys.stderr, flush=True)
        raise
    return "slow done"


@mcp.tool(description="Number of cancelled `slow` calls seen so far.", structured_output=False)
def cancelled_count() -> str:
    return str(_state["cancelled"])


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


@_server.subscribe_resource()
async def _subscribe(uri: AnyUrl) -> None:
    session = _server.request_context.session
    _subscriptions.setdefault(str(uri), weakref.WeakSet()).add(session)
    logger.info("subscribe %s", uri)


@_server.unsubscribe_resource()
async def _unsubscribe(uri: AnyUrl) -> None:
    session = _server.request_context.session
    subscribers = _subscriptions.get(str(uri))
    if subscribers is not None:
        subscribers.discard(session)
    logger.info("unsubscribe %s", uri)


# --------------------------------------------------------------------------- prompts / completions

GREET_NAMES = ["alice", "alan", "bob"]


@mcp.prompt(description="Greet someone by name.")
def greet(name: str) -> str:
    return f"Hello, {name}!"


@mcp.completion()
async def complete(
    ref: types.PromptReference | types.ResourceTemplateReference,
    argument: types.CompletionArgument,
    context: types.CompletionContext | None,
) -> types.Completion | None:
    if isinstance(ref, types.PromptReference) and ref.name == "greet" and argument.name == "name":
        values = [v for v in GREET_NAMES if v.startswith(argument.value or "")]
        return types.Completion(values=values, total=len(values), hasMore=False)
    return types.Completion(values=[], total=0, hasMore=False)


# --------------------------------------------------------------------------- logging/setLevel


@_server.set_logging_level()
async def _set_level(level: types.LoggingLevel) -> None:
    _log_levels[_server.request_context.session] = level


# --------------------------------------------------------------------------- capabilities / session tracking

_orig_create_initialization_options = _server.create_initialization_options


def _create_initialization_options(
    notification_options: NotificationOptions | None = None,
    experimental_capabilities: dict[str, dict[str, Any]] | None = None,
) -> InitializationOptions:
    # FastMCP 1.x passes no NotificationOptions (listChanged: false everywhere) and the
    # low-level server hard-codes resources.subscribe=False even with a subscribe handler.
    options = _orig_create_initialization_options(NotificationOptions(tools_changed=True), experimental_capabilities)
    if options.capabilities.resources is not None:
        options.capabilities.resources.subscribe = True
    return options


_server.create_initialization_options = _create_initialization_options  # type: ignore[method-assign]

_orig_handle_request = _server._handle_request


async def _handle_request(message: Any, req: Any, session: ServerSession, *args: Any, **kwargs: Any) -> Any:
    _sessions.add(session)
    return await _orig_handle_request(message, req, session, *args, **kwargs)


_server._handle_request = _handle_request  # type: ignore[method-assign]


def build_app(json_response: bool = False, sse: bool = False) -> Any:
    _state["json_response"] = json_response
    mcp.settings.json_response = json_response
    # DNS-rebinding protection stays on (FastMCP default for host 127.0.0.1):
    # Host must be 127.0.0.1:*, localhost:* or [::1]:*; an Origin, if sent, likewise.
    if sse:  # the 2024-11-05 HTTP+SSE transport: GET /sse, POST /messages/?session_id=...
        return mcp.sse_app()
    return mcp.streamable_http_app()


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
            if not data.strip():
                continue
            return data.decode("utf-8", errors="replace")


class _StdoutLines:
    """The wire's stdout; each `write` lands whole (no await before the bytes are queued)."""

    def __init__(self, writer: asyncio.StreamWriter | None, file: Any) -> None:
        self._writer = writer  # None: not pollable (regular file), plain blocking writes
        self._file = file
        self._broken = False

    async def write(self, text: str) -> None:
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


async def _serve_stdio() -> None:
    _state["json_response"] = False  # server->client requests ride the one stdio stream
    loop = asyncio.get_running_loop()
    async with _stdio_pipes() as (stdin, stdout):
        with anyio.CancelScope() as scope:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, scope.cancel)
            try:
                async with stdio_server(stdin, stdout) as (read_stream, write_stream):  # type: ignore[arg-type]
                    await _server.run(read_stream, write_stream, _server.create_initialization_options())
            finally:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)


# --------------------------------------------------------------------------- main


class _GracefulServer(uvicorn.Server):
    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        # uvicorn re-raises captured signals after shutdown (exit status 128+sig);
        # a test peer should exit 0 after a requested shutdown instead.
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()


async def _serve(port: int, json_response: bool, sse: bool = False) -> None:
    config = uvicorn.Config(
        build_app(json_response, sse),
        host=HOST,
        port=port,
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=1,
    )
    server = _GracefulServer(config)

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
        print(f"READY http://{HOST}:{actual}{'/sse' if sse else PATH}", flush=True)

    announcer = asyncio.create_task(announce())
    try:
        await server.serve()  # installs SIGINT/SIGTERM handlers, returns on shutdown
    finally:
        announcer.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Legacy-only (<= 2025-11-25) MCP e2e test server")
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
        help="answer POSTs with plain application/json (the SDK then DROPS progress and log "
        "notifications; elicitation/sampling/roots requests go on the GET stream)",
    )
    parser.add_argument(
        "--sse",
        action="store_true",
        help="serve the deprecated 2024-11-05 HTTP+SSE transport (GET /sse) instead of Streamable HTTP",
    )
    args = parser.parse_args(argv)
    if args.stdio and (args.json_response or args.sse):
        parser.error("--json-response and --sse apply to HTTP only")
    try:
        asyncio.run(_serve_stdio() if args.stdio else _serve(args.port, args.json_response, args.sse))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
