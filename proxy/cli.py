"""Command line: `mcp-era-proxy --upstream URL [--listen 127.0.0.1:8080] [--config FILE] [--workers N]`,
or `mcp-era-proxy stdio --upstream URL` (the proxy as a host's stdio server process).

A desktop host starts `mcp-era-proxy stdio` each time it launches, and waits for its answer: this
module imports only the standard library when it is loaded, and each path imports what it uses
(`--check-config` no server, one process no supervisor; the application, app.py, what the
settings configure). The collector is off while the start-up builds what lives as long as the
process, and is turned on as it starts serving (_tune_gc).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import gc
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from . import __version__

if TYPE_CHECKING:
    from aiohttp import web

    from .cluster.workers import SupervisorLink
    from .config import Settings


STDIO_COMMAND = "stdio"
# In stdio mode the host that started the proxy is gone when it stops: calls in flight are not
# waited for longer than this, whatever shutdown.grace_s says.
STDIO_GRACE_S = 2.0
# The host's session and its server process are not expired for idling (ten years).
STDIO_SESSION_S = 10 * 365 * 86400.0


def build_parser(stdio: bool = False) -> argparse.ArgumentParser:
    """The command line of `mcp-era-proxy`, or of `mcp-era-proxy stdio` (docs/reference/cli.md
    prints their help)."""
    from .config import ENV_PREFIX

    parser = argparse.ArgumentParser(
        prog="mcp-era-proxy stdio" if stdio else "mcp-era-proxy",
        description=(
            "Serve one MCP host over stdio (newline-delimited JSON-RPC on stdin/stdout, logs on stderr), "
            "either protocol era, translated to the upstream's."
            if stdio
            else "Reverse proxy that lets MCP clients and servers of either protocol era "
            "(2024-11-05..2025-11-25 and 2026-07-28) talk to each other. "
            f"`mcp-era-proxy {STDIO_COMMAND} --help`: the proxy as a host's stdio server."
        ),
        epilog=f"Every option can also be set in the YAML config file or through {ENV_PREFIX}* "
        f"environment variables (nested keys joined by '__', e.g. {ENV_PREFIX}UPSTREAM__URL). "
        "Precedence: flags, then environment, then the file, then defaults.",
    )
    parser.add_argument("--config", metavar="FILE", help="YAML configuration file")
    parser.add_argument("--upstream", metavar="URL", help="upstream MCP endpoint (Streamable HTTP)")
    parser.add_argument(
        "--upstream-command", metavar="'CMD ARGS'", help="or: start this MCP server and speak to it over stdio"
    )
    parser.add_argument(
        "--upstream-sse",
        metavar="URL",
        help="or: the SSE URL of a 2024-11-05 HTTP+SSE server (GET /sse, POST to the endpoint it announces)",
    )
    parser.add_argument(
        "--upstream-era",
        choices=["auto", "legacy", "modern"],
        help="protocol era of the upstream (default: auto-detect)",
    )
    if not stdio:
        parser.add_argument(
            "--listen", metavar="HOST:PORT", help="address of the MCP endpoint (default 127.0.0.1:8080)"
        )
    parser.add_argument("--admin-listen", metavar="HOST:PORT", help="separate address for /metrics, /healthz, /readyz")
    if not stdio:
        from .cluster.workers import WORKER_FLAG

        parser.add_argument(
            "--workers",
            type=int,
            metavar="N",
            help="processes sharing the listening port (default 1; more needs store.url and security.secret)",
        )
        # Set by the supervisor of --workers on the workers it starts (proxy/cluster/workers.py).
        parser.add_argument(WORKER_FLAG, dest="worker_control", metavar="INDEX:FD", help=argparse.SUPPRESS)
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", choices=["json", "console"])
    parser.add_argument("--log-file", metavar="FILE", help="write logs to FILE (appended) instead of stderr")
    parser.add_argument("--check-config", action="store_true", help="validate, print the effective config, exit")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def parse_args(argv: Sequence[str] | None = None, stdio: bool = False) -> argparse.Namespace:
    return build_parser(stdio).parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> Settings:
    from .config import load_settings

    return load_settings(
        args.config,
        **{
            "upstream.url": args.upstream,
            "upstream.command": args.upstream_command,
            "upstream.sse_url": args.upstream_sse,
            "upstream.era": args.upstream_era,
            "listen": getattr(args, "listen", None),
            "admin_listen": args.admin_listen,
            "logging.level": args.log_level,
            "logging.format": args.log_format,
            "logging.file": args.log_file,
            "workers": getattr(args, "workers", None),
        },
    )


async def serve(
    settings: Settings, stop: asyncio.Event | None = None, on_started: Callable[[], None] | None = None
) -> None:
    """Run until SIGINT/SIGTERM (or `stop` is set); `on_started` is called once every listener is up."""
    import structlog
    from aiohttp import web

    from .app import ADMIN, INTERNAL, create_app, detect_sse_upstream
    from .config import exposed_without_authorization, parse_listen
    from .downstream.server import runner as make_runner

    log = structlog.get_logger(__name__)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    _check_bindable(settings)  # a port in use is said before anything reaches the upstream
    settings = await detect_sse_upstream(settings)  # a 2024-11-05 HTTP+SSE server behind upstream.url
    app, admin_app = create_app(settings)
    internal_app = app.get(INTERNAL)
    runners: list[web.AppRunner] = []
    listening = False
    applications = {"listen": app, "replicas.internal_listen": internal_app, "admin_listen": admin_app}
    try:
        for setting, address in _addresses(settings):
            application = applications[setting]  # the internal one: replays from other replicas only
            if application is None:
                continue
            runner = make_runner(application, settings)  # with deadlines on reading requests
            await runner.setup()
            runners.append(runner)
            host, port = parse_listen(address)
            # Workers share the MCP port: the kernel spreads connections over them (SO_REUSEPORT).
            # Each has an admin port of its own (proxy/cluster/workers.py).
            shared = settings.workers > 1 and application is app
            with _listening_on(setting, address):
                await web.TCPSite(runner, host, port, reuse_address=True, reuse_port=shared or None).start()
            path = settings.path if application is app else ""
            name = "mcp" if application is app else "internal" if application is internal_app else "admin"
            log.info("listening", address=f"http://{bound_address(runner)}{path}", listener=name)
            if application is app and exposed_without_authorization(settings):
                log.warning(
                    "listening_without_authorization",
                    address=bound_address(runner),
                    hint="set auth.mode: resource_server with auth.issuers, or keep the upstream's own OAuth",
                )
        listening = True
        _tune_gc()
        if on_started is not None:
            on_started()
        log.info(
            "started",
            version=__version__,
            upstream=settings.upstream.name,
            upstream_transport=settings.upstream.transport,
            upstream_era=settings.upstream.era,
        )
        await stop.wait()
        log.info("stopping", grace_s=settings.shutdown.grace_s)
        app[ADMIN].draining = True  # /readyz answers 503 from now on
    finally:
        # The MCP listener first (stop accepting, end streams, let calls finish, close upstreams),
        # then the internal one (replays of calls still parked here are served meanwhile), the
        # separate admin listener last, so readiness can be seen failing meanwhile.
        for started in runners:
            await started.cleanup()
        if listening:  # a start that failed says so itself (cannot_start), nothing stopped
            log.info("stopped")


def _addresses(settings: Settings) -> list[tuple[str, str]]:
    """The addresses to listen on, each with the setting that names it, in the order they open:
    the MCP endpoint, the internal listener, the separate admin listener."""
    named = (
        ("listen", settings.listen),
        ("replicas.internal_listen", settings.replicas.internal_listen),
        ("admin_listen", settings.admin_listen),
    )
    return [(setting, address) for setting, address in named if address is not None]


class CannotListen(OSError):
    """An address the proxy cannot listen on, said with where it was set: the setting, its flag
    and its environment variable, so the operator knows what to change."""

    def __init__(self, setting: str, address: str, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.setting = setting
        self.address = address
        self.cause = cause

    def fields(self) -> dict[str, str]:
        """The `cannot_start` line's fields."""
        from .config import ENV_PREFIX

        flag = _LISTEN_FLAGS.get(self.setting)
        where = f"{flag} HOST:PORT, " if flag else ""
        variable = ENV_PREFIX + self.setting.upper().replace(".", "__")
        taken = "another program listens there: stop it, or " if self.errno == errno.EADDRINUSE else ""
        return {
            "error": str(self.cause),
            "address": self.address,
            "setting": self.setting,
            "hint": f"{taken}choose another address with {where}{self.setting} in the config file or {variable}",
        }


# The command line's flag of each address setting (replicas.internal_listen has none).
_LISTEN_FLAGS = {"listen": "--listen", "admin_listen": "--admin-listen"}


@contextlib.contextmanager
def _listening_on(setting: str, address: str) -> Iterator[None]:
    """Binding `address` (set by `setting`): its failure said as CannotListen."""
    try:
        yield
    except OSError as exc:
        raise CannotListen(setting, address, exc) from None


def _check_bindable(settings: Settings) -> None:
    """Each configured address can be bound now (CannotListen, as binding it would fail, if not).
    Asked first, so a port in use is the first thing said, before any upstream probe; the listeners
    bind for real later (a port taken in between still fails there). Port 0 and the port workers
    share (SO_REUSEPORT) are not asked."""
    from .config import parse_listen

    for setting, address in _addresses(settings):
        host, port = parse_listen(address)
        if port == 0 or (settings.workers > 1 and setting == "listen"):
            continue
        with _listening_on(setting, address):
            family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            with socket.socket(family, kind, proto) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(sockaddr)


def bound_address(runner: web.AppRunner) -> str:
    """HOST:PORT the runner's one site listens on: the port the kernel chose where port 0 was asked."""
    host, port = runner.addresses[0][:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# Young objects allowed before the collector runs (the default is 700). Every request allocates a
# few hundred short-lived containers (dicts, coroutines, aiohttp's request objects) that plain
# reference counting frees; collecting every 700 of them costs more than the requests themselves.
_GC_YOUNG_THRESHOLD = 10_000


def _tune_gc() -> None:
    """Once started: what exists now lives as long as the process, so the collector never walks
    it again (gc.freeze), and young collections run less often. The collector was off while it was
    made (main); the start-up's own garbage (class-building leftovers, none with a finalizer, some
    2 000 objects) is frozen with it rather than looked for in a collection of the whole heap,
    which cost as much CPU as the start-up's collections it replaces."""
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(_GC_YOUNG_THRESHOLD, older, oldest)
    gc.enable()


def _checked_settings(args: argparse.Namespace, check_output: TextIO) -> Settings | int:
    """The settings the arguments make, or the exit code: 2 for a configuration error (said on
    stderr), 0 after --check-config printed them (secrets hidden: config.shown) on `check_output`."""
    from . import tracing
    from .config import ConfigError, shown
    from .seams.supported import refusal

    try:
        settings = settings_from_args(args)
        tracing.require(settings.tracing)
    except ConfigError as exc:
        print(f"mcp-era-proxy: {exc}", file=sys.stderr)
        return 2
    refused = refusal()  # a dependency whose private parts are not the shape the proxy relies on
    if refused is not None:
        print(f"mcp-era-proxy: {refused}", file=sys.stderr)
        return 2
    if args.check_config:
        print(json.dumps(shown(settings), indent=2), file=check_output)
        return 0
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    # The collector is off until the proxy serves (_tune_gc): what the start-up makes (modules,
    # classes, the settings, the application: some 70 000 objects) lives as long as the process,
    # and walking it again and again while it grows cost a tenth of the start-up's CPU.
    gc.disable()
    try:
        arguments = sys.argv[1:] if argv is None else list(argv)
        if arguments[:1] == [STDIO_COMMAND]:
            return stdio_main(arguments[1:])
        return _main(arguments)
    finally:
        gc.enable()


def _main(arguments: list[str]) -> int:
    from .logs import configure_logging

    args = parse_args(arguments)
    settings = _checked_settings(args, sys.stdout)
    if isinstance(settings, int):
        return settings
    if args.worker_control is None and settings.workers > 1:
        from .cluster.workers import Supervisor

        configure_logging(settings.logging.level, settings.logging.format, file=settings.logging.file)
        gc.enable()
        # The supervisor serves nothing: the workers run these same arguments.
        return asyncio.run(Supervisor(settings, arguments).run())
    link: SupervisorLink | None = None
    if args.worker_control is not None:
        from .cluster.workers import WORKER_FLAG, SupervisorLink, parse_control, worker_settings

        try:
            index, fd = parse_control(args.worker_control)
            link = SupervisorLink(fd)
        except (ValueError, OSError):
            print(f"mcp-era-proxy: {WORKER_FLAG} is set by the supervisor of --workers only", file=sys.stderr)
            return 2
        configure_logging(settings.logging.level, settings.logging.format, worker=index, file=settings.logging.file)
        settings = worker_settings(settings, index)
    else:
        configure_logging(settings.logging.level, settings.logging.format, file=settings.logging.file)
    try:
        event_loop_runner()(serve(settings) if link is None else _serve_worker(settings, link))
    except OSError as exc:
        _cannot_start(exc)
        return 1
    finally:
        if link is not None:
            link.close()
    return 0


def _cannot_start(exc: OSError) -> None:
    """The start failed: said once, with the address and how to change it when a listener failed."""
    import structlog

    log = structlog.get_logger(__name__)
    log.error("cannot_start", **(exc.fields() if isinstance(exc, CannotListen) else {"error": str(exc)}))


def event_loop_runner() -> Callable[[Coroutine[Any, Any, None]], None]:
    """uvloop's run where it is installed (a faster event loop), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


async def _serve_worker(settings: Settings, link: SupervisorLink) -> None:
    """A worker under --workers: tells the supervisor once it listens, drains if the supervisor goes."""
    stop = asyncio.Event()
    link.watch(stop.set)
    await serve(settings, stop, on_started=link.ready)


# ------------------------------------------------------------ stdio


def stdio_main(argv: Sequence[str]) -> int:
    """`mcp-era-proxy stdio ...`: stdout carries JSON-RPC only, so everything else (config errors
    included) goes to stderr or the log file."""
    from .logs import configure_logging

    args = parse_args(argv, stdio=True)
    settings = _checked_settings(args, sys.stderr)
    if isinstance(settings, int):
        return settings
    if settings.workers > 1:
        print("mcp-era-proxy: stdio serves one host: workers must be 1", file=sys.stderr)
        return 2
    configure_logging(settings.logging.level, settings.logging.format, file=settings.logging.file)
    try:
        event_loop_runner()(serve_stdio(settings))
    except OSError as exc:
        _cannot_start(exc)
        return 1
    return 0


def stdio_settings(settings: Settings) -> Settings:
    """What differs when the proxy serves one host over stdio: nothing listens on the network
    (`listen` and `security.allowed_hosts` do not apply); the host's one session lives as
    long as the process (a legacy host over stdio has no way to start another when it expires,
    nor does its server process when it is stopped for idling); calls in flight at the end get at
    most STDIO_GRACE_S, since whoever asked is gone."""
    upstream = settings.upstream
    return settings.model_copy(
        update={
            "shutdown": settings.shutdown.model_copy(update={"grace_s": min(settings.shutdown.grace_s, STDIO_GRACE_S)}),
            "sessions": settings.sessions.model_copy(
                update={"idle_timeout_s": STDIO_SESSION_S, "max_lifetime_s": STDIO_SESSION_S}
            ),
            "upstream": upstream.model_copy(
                update={"stdio": upstream.stdio.model_copy(update={"process_idle_s": STDIO_SESSION_S})}
            ),
            # The private listener's one client is the bridge (Host: localhost): the DNS-rebinding
            # guard a config file may set up for a network listener does not apply to it.
            "listen": "127.0.0.1:8080",
            "security": settings.security.model_copy(update={"allowed_hosts": []}),
            # Its one client is the host on stdin: no HTTP+SSE clients (nor their private listener).
            "downstream": settings.downstream.model_copy(
                update={"sse": settings.downstream.sse.model_copy(update={"enabled": False})}
            ),
        }
    )


async def serve_stdio(
    settings: Settings,
    stop: asyncio.Event | None = None,
    stdin_fd: int = 0,
    stdout_fd: int = 1,
) -> None:
    """Serve one host over stdio until its stdin ends (or SIGTERM/SIGINT, or `stop`).

    The proxy's own HTTP application listens on a unix socket in a fresh 0700 directory nobody
    else can reach; the bridge (downstream/bridge.py) is its one client. Everything started here
    (upstream processes, the listener, the directory) is gone when this returns."""
    import aiohttp
    import structlog
    from aiohttp import web

    from .app import create_app
    from .config import parse_listen
    from .downstream.bridge import EndpointBridge
    from .downstream.server import runner as make_runner
    from .downstream.stdio import StdinReader, StdoutWriter, serve_lines

    log = structlog.get_logger(__name__)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    settings = stdio_settings(settings)
    grace = settings.shutdown.grace_s
    private = tempfile.mkdtemp(prefix="mcp-era-proxy-")  # mode 0700
    socket_path = os.path.join(private, "mcp.sock")
    runners: list[web.AppRunner] = []
    bridge: EndpointBridge | None = None
    client: aiohttp.ClientSession | None = None
    try:
        app, admin_app = create_app(settings)
        runner = make_runner(app, settings)
        await runner.setup()
        runners.append(runner)
        await web.UnixSite(runner, socket_path).start()
        if admin_app is not None and settings.admin_listen is not None:
            admin_runner = make_runner(admin_app, settings)
            await admin_runner.setup()
            runners.append(admin_runner)
            host, port = parse_listen(settings.admin_listen)
            with _listening_on("admin_listen", settings.admin_listen):
                await web.TCPSite(admin_runner, host, port, reuse_address=True).start()
            log.info("listening", address=f"http://{bound_address(admin_runner)}", listener="admin")
        client = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=socket_path, limit=0), auto_decompress=False
        )
        writer = StdoutWriter(stdout_fd)
        bridge = EndpointBridge(
            client,
            f"http://localhost{settings.path}",
            writer,
            settings.security.max_json_depth,
            upstream=settings.upstream.name,
        )
        _tune_gc()
        log.info(
            "started",
            version=__version__,
            downstream="stdio",
            upstream=settings.upstream.name,
            upstream_transport=settings.upstream.transport,
            upstream_era=settings.upstream.era,
        )
        await serve_lines(bridge, StdinReader(loop, settings.security.max_body_bytes, stdin_fd), writer, stop)
    finally:
        if bridge is not None:
            await bridge.close(grace)
        if client is not None:
            await client.close()
        for started in runners:
            await started.cleanup()
        shutil.rmtree(private, ignore_errors=True)
        if bridge is not None:  # a start that failed says so itself (cannot_start), nothing stopped
            log.info("stopped")
