"""`--workers N`: one supervisor and N worker processes sharing the listening port.

Each worker is a full replica (its own event loop, upstream connections, cache and metrics) of the
shared store, and binds the MCP listener with SO_REUSEPORT, so the kernel spreads connections over
them and one host's cores are used. The supervisor serves no traffic: it starts the workers,
restarts one that dies (with a bounded backoff), passes SIGTERM / SIGINT on to all of them and
exits once they have drained, non-zero if any failed.

A worker is `python -m proxy` run again with the supervisor's own arguments, plus a hidden
`--worker-control INDEX:FD`. Re-executing rather than multiprocessing: the worker goes through
exactly the start a single process does (arguments, environment and config file read the same
way, the same event loop policy), nothing is pickled across, and no module state of the supervisor
(logging, signal handlers, a loaded event loop) leaks into it.

FD is the worker's end of a socket pair with the supervisor. The worker writes one byte on it once
it listens (a worker that exits before that failed to start: the first time, the supervisor gives
up). The supervisor never writes: the worker reads end-of-file when the supervisor is gone,
however it went (SIGKILL included), and then drains and exits as on SIGTERM, so no worker outlives
its supervisor.

Addresses per worker: the MCP listener is shared; worker i serves the separate admin listener on
its port + i (so each scrape of /metrics reads one worker's counters, not whichever worker took
the connection) and the internal listener on `replicas.internal_listen` port + i, advertised as
`replicas.advertise` port + i (each worker owns its live objects, so other replicas must reach
that worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from ..config import ReplicasConfig, Settings, parse_listen

log = structlog.get_logger(__name__)

WORKER_FLAG = "--worker-control"
READY = b"r"
# Restart backoff of a worker that died: doubles from the first delay up to the ceiling, and starts
# again from the first once a worker has lived long enough to count as healthy.
RESTART_FIRST_S = 0.5
RESTART_MAX_S = 30.0
HEALTHY_AFTER_S = 60.0
# Past the workers' own drain (shutdown.grace_s, then a stdio server's stop), what remains is killed.
STOP_MARGIN_S = 10.0


def shifted(address: str, by: int) -> str:
    """HOST:PORT with the port moved up by `by` (IPv6 hosts keep their brackets)."""
    host, port = parse_listen(address)
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port + by}"


def worker_settings(settings: Settings, index: int) -> Settings:
    """The settings worker `index` runs with: its own admin and internal listeners (port + index);
    the MCP listener, shared through SO_REUSEPORT, unchanged."""
    if index == 0:
        return settings
    replicas = settings.replicas
    moved = ReplicasConfig(
        internal_listen=shifted(replicas.internal_listen, index) if replicas.internal_listen else None,
        advertise=shifted(replicas.advertise, index) if replicas.advertise else None,
        forward_connect_timeout_s=replicas.forward_connect_timeout_s,
    )
    admin = shifted(settings.admin_listen, index) if settings.admin_listen else None
    return settings.model_copy(update={"admin_listen": admin, "replicas": moved})


def restart_delay(failures: int) -> float:
    """Seconds before a worker that died is started again, after `failures` deaths in a row."""
    doublings = min(max(failures - 1, 0), 32)  # past the ceiling long before; 2.0 ** n must stay finite
    return min(RESTART_FIRST_S * 2.0**doublings, RESTART_MAX_S)


def parse_control(value: str) -> tuple[int, int]:
    """`INDEX:FD` of the hidden worker flag (ValueError if it is not that)."""
    index, sep, fd = value.partition(":")
    if not sep or int(index) < 0 or int(fd) < 0:
        raise ValueError(f"expected INDEX:FD, got {value!r}")
    return int(index), int(fd)


class SupervisorLink:
    """A worker's side of its socket pair with the supervisor."""

    def __init__(self, fd: int) -> None:
        self._sock = socket.socket(fileno=fd)
        self._sock.setblocking(False)
        self._loop: asyncio.AbstractEventLoop | None = None

    def ready(self) -> None:
        with contextlib.suppress(OSError):  # a supervisor gone meanwhile is seen by watch()
            self._sock.send(READY)

    def watch(self, gone: Callable[[], None]) -> None:
        """Call `gone` once the supervisor's end closes (it never writes: readable means closed)."""
        self._loop = loop = asyncio.get_running_loop()

        def readable() -> None:
            try:
                data = self._sock.recv(1)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(self._sock.fileno())
                log.warning("supervisor_gone")
                gone()

        loop.add_reader(self._sock.fileno(), readable)

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._sock.fileno())
        self._sock.close()


@dataclass
class _Worker:
    index: int
    proc: asyncio.subprocess.Process | None = None
    link: socket.socket | None = None
    started_at: float = 0.0
    failures: int = 0  # consecutive deaths without a healthy run between them
    code: int | None = None  # the last exit status
    was_ready: bool = False  # listened at least once


class Supervisor:
    """Runs `argv` (the proxy's own arguments) as `count` workers until SIGTERM / SIGINT."""

    def __init__(self, settings: Settings, argv: Sequence[str], python: str = sys.executable) -> None:
        self._settings = settings
        self._argv = list(argv)
        self._python = python
        self._workers = [_Worker(i) for i in range(settings.workers)]
        self._stop = asyncio.Event()
        self._failed = False  # a worker that could not start at all: stop everything, exit 1
        self._signalled: set[int] = set()  # workers sent SIGTERM by us

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._on_signal, signum)
        log.info("workers_starting", workers=len(self._workers), pid=os.getpid())
        tasks = [asyncio.create_task(self._keep(worker)) for worker in self._workers]
        await self._stop.wait()
        for worker in self._workers:
            self._terminate(worker)
        upstream = self._settings.upstream
        limit = self._settings.shutdown.grace_s + 2 * upstream.shutdown_grace_s + STOP_MARGIN_S
        try:
            async with asyncio.timeout(limit):
                await asyncio.gather(*tasks)
        except TimeoutError:
            for worker in self._workers:
                if worker.proc is not None and worker.proc.returncode is None:
                    log.error("worker_killed", worker=worker.index, pid=worker.proc.pid, after_s=limit)
                    with contextlib.suppress(ProcessLookupError):
                        worker.proc.kill()
            self._failed = True
            await asyncio.gather(*tasks, return_exceptions=True)
        clean = not self._failed and all(self._clean_exit(w) for w in self._workers)
        log.info("stopped", workers=len(self._workers), ok=clean)
        return 0 if clean else 1

    def _on_signal(self, signum: int) -> None:
        if not self._stop.is_set():
            log.info("stopping", signal=signal.Signals(signum).name, grace_s=self._settings.shutdown.grace_s)
        self._stop.set()

    def _clean_exit(self, worker: _Worker) -> bool:
        if worker.code is None or worker.code == 0:
            return True
        # SIGTERM before the worker had its handler installed: it served nothing, nothing was lost.
        return worker.code == -signal.SIGTERM and worker.index in self._signalled

    def _terminate(self, worker: _Worker) -> None:
        if worker.proc is not None and worker.proc.returncode is None:
            self._signalled.add(worker.index)
            with contextlib.suppress(ProcessLookupError):
                worker.proc.send_signal(signal.SIGTERM)

    async def _keep(self, worker: _Worker) -> None:
        """Run one worker slot: start it, wait for it, restart it after a backoff until stopping."""
        while not self._stop.is_set():
            await self._spawn(worker)
            if self._stop.is_set():  # the stop came while it was being started
                self._terminate(worker)
            code = await self._wait(worker)
            if self._stop.is_set():
                return
            lived = time.monotonic() - worker.started_at
            if not worker.was_ready:  # never listened, not even once: restarting will not help
                log.error("worker_cannot_start", worker=worker.index, code=code)
                self._failed = True
                self._stop.set()
                return
            worker.failures = 1 if lived >= HEALTHY_AFTER_S else worker.failures + 1
            delay = restart_delay(worker.failures)
            log.error("worker_exited", worker=worker.index, code=code, lived_s=round(lived, 1), restart_in_s=delay)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stop.wait()

    async def _spawn(self, worker: _Worker) -> None:
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        try:
            worker.proc = await asyncio.create_subprocess_exec(
                self._python,
                "-m",
                "proxy",
                *self._argv,
                WORKER_FLAG,
                f"{worker.index}:{theirs.fileno()}",
                pass_fds=(theirs.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
            )
        finally:
            theirs.close()  # the worker holds its end now; ours closing is what tells it we are gone
        worker.link = ours
        worker.started_at = time.monotonic()
        worker.code = None

    async def _wait(self, worker: _Worker) -> int:
        assert worker.proc is not None and worker.link is not None
        loop = asyncio.get_running_loop()
        exited = asyncio.create_task(worker.proc.wait())
        ready = asyncio.create_task(loop.sock_recv(worker.link, 1))
        await asyncio.wait({exited, ready}, return_when=asyncio.FIRST_COMPLETED)
        if ready.done() and not ready.cancelled() and ready.exception() is None and ready.result() == READY:
            worker.was_ready = True
            log.info("worker_started", worker=worker.index, pid=worker.proc.pid)
        else:
            ready.cancel()
        code = await exited
        ready.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await ready
        worker.link.close()
        worker.link = None
        worker.code = code
        if self._stop.is_set():
            log.info("worker_stopped", worker=worker.index, pid=worker.proc.pid, code=code)
        return code
