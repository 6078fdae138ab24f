"""Start and stop the real processes the end-to-end tests talk to (peers, the proxy, the tap).

Every process gets its own session (process group) so it is killed with all its children, and
every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}:\n{_tail(log)}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout}s:\n{_tail(log)}")


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Process:
    def __init__(
        self, argv: Sequence[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        self.argv = list(argv)
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = log.open("wb")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        self._log_file.close()
        return self.proc.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def listening(
    argv: Sequence[str],
    port: int,
    log: Path,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
    cwd: Path | None = None,
) -> Iterator[Process]:
    """Run `argv` until the block ends; enter once it accepts connections on `port`."""
    process = Process(argv, log, env, cwd)
    try:
        wait_for_port(port, process.proc, timeout, log)
        yield process
    finally:
        process.stop()
