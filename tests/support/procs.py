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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any


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


# ------------------------------------------------------------ finding processes by PID (Linux /proc)


def children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(") ", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def descendants(pid: int) -> list[int]:
    found = []
    for child in children_of(pid):
        found.append(child)
        found.extend(descendants(child))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def tagged(name: str, value: str) -> list[int]:
    """The live processes whose environment has `name=value`: every process started, directly or
    not, by one that had it in its environment (and did not clear it), whoever its parent is now."""
    marker = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                variables = environ.read().split(b"\0")
        except OSError:
            continue
        if marker in variables and alive(int(entry)):
            found.append(int(entry))
    return found


def reap_tagged(name: str, value: str, timeout: float = 10.0) -> list[str]:
    """Wait up to `timeout` for every process tagged `name=value` to end; kill those still alive
    and return them (PID and command line), for a test to assert there were none."""
    wait_for(lambda: not tagged(name, value), timeout)
    left = tagged(name, value)
    named = [f"{pid}: {cmdline(pid)}" for pid in left]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return named


def wait_for(predicate: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    return predicate()
