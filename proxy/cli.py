"""Command line: `mcp-era-proxy --upstream URL [--listen 127.0.0.1:8080] [--config FILE] [--workers N]`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import signal
import sys
from collections.abc import Callable, Sequence

import structlog
from aiohttp import web

from . import __version__, tracing
from .app import ADMIN, INTERNAL, create_app, detect_sse_upstream
from .config import ENV_PREFIX, ConfigError, Settings, load_settings, parse_listen
from .downstream.server import runner as make_runner
from .logs import configure_logging
from .workers import WORKER_FLAG, Supervisor, SupervisorLink, parse_control, worker_settings

log = structlog.get_logger(__name__)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mcp-era-proxy",
        description="Reverse proxy that lets MCP clients and servers of either protocol era "
        "(2024-11-05..2025-11-25 and 2026-07-28) talk to each other.",
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
    parser.add_argument("--listen", metavar="HOST:PORT", help="address of the MCP endpoint (default 127.0.0.1:8080)")
    parser.add_argument("--admin-listen", metavar="HOST:PORT", help="separate address for /metrics, /healthz, /readyz")
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="processes sharing the listening port (default 1; more needs store.url and security.secret)",
    )
    # Set by the supervisor of --workers on the workers it starts (proxy/workers.py).
    parser.add_argument(WORKER_FLAG, dest="worker_control", metavar="INDEX:FD", help=argparse.SUPPRESS)
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", choices=["json", "console"])
    parser.add_argument("--check-config", action="store_true", help="validate, print the effective config, exit")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> Settings:
    return load_settings(
        args.config,
        **{
            "upstream.url": args.upstream,
            "upstream.command": args.upstream_command,
            "upstream.sse_url": args.upstream_sse,
            "upstream.era": args.upstream_era,
            "listen": args.listen,
            "admin_listen": args.admin_listen,
            "logging.level": args.log_level,
            "logging.format": args.log_format,
            "workers": args.workers,
        },
    )


async def serve(
    settings: Settings, stop: asyncio.Event | None = None, on_started: Callable[[], None] | None = None
) -> None:
    """Run until SIGINT/SIGTERM (or `stop` is set); `on_started` is called once every listener is up."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    settings = await detect_sse_upstream(settings)  # a 2024-11-05 HTTP+SSE server behind upstream.url
    app, admin_app = create_app(settings)
    internal_app = app.get(INTERNAL)
    runners: list[web.AppRunner] = []
    listeners = (
        (app, settings.listen),
        (internal_app, settings.replicas.internal_listen),  # replays from other replicas only
        (admin_app, settings.admin_listen),
    )
    try:
        for application, address in listeners:
            if application is None or address is None:
                continue
            runner = make_runner(application, settings)  # with deadlines on reading requests
            await runner.setup()
            runners.append(runner)
            host, port = parse_listen(address)
            # Workers share the MCP port: the kernel spreads connections over them (SO_REUSEPORT).
            # Each has an admin port of its own (proxy/workers.py).
            shared = settings.workers > 1 and application is app
            await web.TCPSite(runner, host, port, reuse_address=True, reuse_port=shared or None).start()
            path = settings.path if application is app else ""
            log.info("listening", address=f"http://{address}{path}", internal=application is internal_app)
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
        log.info("stopped")


# Young objects allowed before the collector runs (the default is 700). Every request allocates a
# few hundred short-lived containers (dicts, coroutines, aiohttp's request objects) that plain
# reference counting frees; collecting every 700 of them costs more than the requests themselves.
_GC_YOUNG_THRESHOLD = 10_000


def _tune_gc() -> None:
    """Once started: what exists now lives as long as the process, so the collector never walks
    it again (gc.freeze), and young collections run less often."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(_GC_YOUNG_THRESHOLD, older, oldest)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = settings_from_args(args)
        tracing.require(settings.tracing)
    except ConfigError as exc:
        print(f"mcp-era-proxy: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        print(settings.model_dump_json(indent=2, exclude={"security": {"secret", "previous_secrets"}}))
        return 0
    if args.worker_control is None and settings.workers > 1:
        configure_logging(settings.logging.level, settings.logging.format)
        # The supervisor serves nothing: the workers run these same arguments.
        return asyncio.run(Supervisor(settings, sys.argv[1:] if argv is None else list(argv)).run())
    link: SupervisorLink | None = None
    if args.worker_control is not None:
        try:
            index, fd = parse_control(args.worker_control)
            link = SupervisorLink(fd)
        except (ValueError, OSError):
            print(f"mcp-era-proxy: {WORKER_FLAG} is set by the supervisor of --workers only", file=sys.stderr)
            return 2
        configure_logging(settings.logging.level, settings.logging.format, worker=index)
        settings = worker_settings(settings, index)
    else:
        configure_logging(settings.logging.level, settings.logging.format)
    try:
        import uvloop  # optional speed-up of the event loop where available
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(serve(settings) if link is None else _serve_worker(settings, link))
    except OSError as exc:
        log.error("cannot_start", error=str(exc))
        return 1
    finally:
        if link is not None:
            link.close()
    return 0


async def _serve_worker(settings: Settings, link: SupervisorLink) -> None:
    """A worker under --workers: tells the supervisor once it listens, drains if the supervisor goes."""
    stop = asyncio.Event()
    link.watch(stop.set)
    await serve(settings, stop, on_started=link.ready)
