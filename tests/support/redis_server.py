"""A real redis-server on a loopback port, for the tests of the shared store.

No config file, no persistence (`--save ''`, no AOF): a restart starts empty, which is what the
tests of a Redis that lost its data need. Started and stopped by PID, every wait bounded.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

from tests.support.procs import PortTaken, Process, reserved_port


class RedisServer:
    def __init__(self, log_dir: Path, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: scripts/setup-services.sh installs it")
        self._binary = binary
        self.port = port or reserved_port()  # redis-server cannot be told port 0 (that turns TCP off)
        self._log_dir = log_dir
        self._starts = 0
        self._process: Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it on its port; the first time, on another port if that one was taken meanwhile
        (later starts are restarts where clients expect it)."""
        assert self._process is None or self._process.proc.poll() is not None
        for attempt in range(5):
            self._starts += 1
            argv = [self._binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            argv += ["--dir", str(self._log_dir)]
            self._process = Process(argv, self._log_dir / f"redis-{self.port}-{self._starts}.log")
            try:
                self._process.wait_listening(10.0, port=self.port)
                return
            except PortTaken:
                self._process.stop()
                if self._starts > 1 or attempt == 4:
                    raise
                self.port = reserved_port()
                self._starts = 0

    def kill(self) -> None:
        """SIGKILL, as a crash: the data is gone with it."""
        if self._process is not None and self._process.proc.poll() is None:
            self._process.proc.send_signal(signal.SIGKILL)
            self._process.proc.wait(10)
        if self._process is not None:
            self._process.stop()  # reaped already: closes its log

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()


@contextlib.contextmanager
def redis_server(log_dir: Path) -> Iterator[RedisServer]:
    server = RedisServer(log_dir)
    server.start()
    try:
        yield server
    finally:
        server.stop()
