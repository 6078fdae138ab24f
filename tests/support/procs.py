"""Start and stop the real processes the end-to-end tests talk to (peers, the proxy, the tap).

Every process gets its own session (process group) so it is killed with all its children, every
wait is bounded, and no port is picked for a child that can pick its own (see "ports" below).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

# ------------------------------------------------------------ ports
#
# A port picked here and handed to a child is free only until someone binds it: another test's
# child, another xdist worker's, or the kernel choosing it as the source port of an outgoing
# connection. So children bind port 0 and the port is read back from what they listen on
# (`serving`). Children that must be told a port, or that are restarted on the one they had (Redis,
# HAProxy, replicas killed and started again), get one of `reserved_port`: below the kernel's
# ephemeral range (no outgoing connection takes it), in a slice of its own for each xdist worker,
# never handed out twice in one process; and a child that finds it taken anyway is started again
# on another (`on_reserved_port`).


def _reserved_slice() -> range:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    span = range(max(1024, low - 12_000), low)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    size = len(span) // workers
    return range(span.start + index * size, span.start + (index + 1) * size)


_HANDED_OUT: set[int] = set()


def reserved_port() -> int:
    """A port nothing listens on now, for a child that must be told its port; see above."""
    ports = _reserved_slice()
    rng = random.Random()
    for _ in range(500):
        port = rng.choice(ports)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free port in {ports}")


def reserved_ports(count: int) -> int:
    """The first of `count` consecutive ports, each as `reserved_port` gives (worker i of the
    proxy's --workers listens on a base port + i)."""
    for _ in range(100):
        base = reserved_port()
        following = range(base + 1, base + count)
        if following and following[-1] not in _reserved_slice():
            continue
        socks = []
        try:
            for port in following:
                if port in _HANDED_OUT:
                    raise OSError(f"{port} handed out already")
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        _HANDED_OUT.update(following)
        return base
    raise RuntimeError(f"no {count} consecutive free ports in {_reserved_slice()}")


def listening_ports(pid: int) -> set[int]:
    """The TCP ports the process `pid` or any of its descendants listens on (Linux /proc)."""
    sockets: set[str] = set()  # the inodes of the sockets the process tree holds
    for owner in (pid, *descendants(pid)):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{owner}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{owner}/fd/{fd}")
                    if target.startswith("socket:["):
                        sockets.add(target[8:-1])
    # The socket tables list every socket of the machine (thousands in TIME_WAIT while the suite
    # runs): read only when the tree holds a socket at all.
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6") if sockets else ():
        with contextlib.suppress(OSError), open(table) as rows:
            next(rows)
            for row in rows:
                fields = row.split(None, 10)
                if fields[3] == "0A" and fields[9] in sockets:  # TCP_LISTEN
                    found.add(int(fields[1].rsplit(":", 1)[1], 16))
    return found


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class PortTaken(RuntimeError):
    """The child could not listen on the port it was given: something else had taken it."""


# How a child's port is read: from its log (a function of the log's text, None until it is there),
# or, without one, the one TCP port its process tree listens on.
Announcement = Callable[[str], int | None]


def log_line(pattern: str) -> Announcement:
    """The port in the first match of `pattern` (a regex with a group named `port`) in the log."""
    compiled = re.compile(pattern)

    def port(text: str) -> int | None:
        match = compiled.search(text)
        return int(match["port"]) if match else None

    return port


def listening_address(line: str | bytes, name: str = "mcp") -> str | None:
    """The address in one log line of the proxy if it is the `listening` event of its listener
    `name` (mcp, admin, internal), else None."""
    if (b'"listening"' if isinstance(line, bytes) else '"listening"') not in line:
        return None
    with contextlib.suppress(ValueError):
        event = json.loads(line)
        if isinstance(event, dict) and event.get("event") == "listening" and event.get("listener") == name:
            return str(event["address"])
    return None


def proxy_listener(name: str = "mcp") -> Announcement:
    """The port of the proxy's listener `name` (mcp, admin, internal): its `listening` log event."""

    def port(text: str) -> int | None:
        for line in text.splitlines():
            address = listening_address(line, name)
            if address is not None:
                return int(address.rsplit(":", 1)[1].split("/", 1)[0])
        return None

    return port


class Process:
    def __init__(
        self, argv: Sequence[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        self.argv = list(argv)
        self.log = log
        self.port = 0  # where it listens, once `wait_listening` found it
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

    def wait_listening(self, timeout: float, *, port: int = 0, announced: Announcement | None = None) -> int:
        """Wait until this process (or a descendant) listens: on `port` when given, else on the port
        `announced` reads from its log, else on its one TCP port; that port. PortTaken if it exited
        before listening on a `port` another process holds. On any failure it is stopped."""
        try:
            return self._wait_listening(timeout, port, announced)
        except BaseException:
            self.stop()
            raise

    def _wait_listening(self, timeout: float, port: int, announced: Announcement | None) -> int:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                if port and _taken(port, self.log):
                    raise PortTaken(f"127.0.0.1:{port} was taken before {self.argv[0]} could listen on it")
                raise RuntimeError(f"process exited with {self.proc.returncode} before listening:\n{_tail(self.log)}")
            want = port or (announced(self.output()) if announced is not None else None)
            # Until its log announces a port, whatever it listens on does not tell (and the scan of
            # its process tree costs far more than reading the log).
            held = listening_ports(self.proc.pid) if want or announced is None else set()
            if want and want in held:
                self.port = want
                return want
            if not port and announced is None and len(held) > 1:
                raise RuntimeError(f"{self.argv} listens on {sorted(held)}: say which port is announced")
            if not port and announced is None and held:
                self.port = held.pop()
                return self.port
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.argv[:3]} not listening within {timeout}s:\n{_tail(self.log)}")
            time.sleep(0.05)

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

    def announced(self, announcement: Announcement, timeout: float = 10.0) -> int:
        """The port `announcement` reads from the log, once the log holds it (the proxy's lines
        reach its log a few milliseconds after they are logged: another listener's line may come
        after the one `wait_listening` read)."""
        port = wait_for(lambda: announcement(self.output()), timeout)
        if port is None:
            raise TimeoutError(f"{self.argv[:3]}: not announced within {timeout}s:\n{_tail(self.log)}")
        return int(port)


def _taken(port: int, log: Path) -> bool:
    """Whether `port` is held by someone (it cannot be bound now) or the log says it was."""
    if re.search(r"(?i)already in use|EADDRINUSE|cannot bind socket", _tail(log)):
        return True
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@contextlib.contextmanager
def serving(
    argv: Sequence[str],
    log: Path,
    *,
    announced: Announcement | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
    cwd: Path | None = None,
) -> Iterator[Process]:
    """Run `argv`, a server told to listen on port 0, until the block ends; enter once it listens,
    with the port it chose as `.port` (see Process.wait_listening)."""
    process = Process(argv, log, env, cwd)
    try:
        process.wait_listening(timeout, announced=announced)
        yield process
    finally:
        process.stop()


def start_on_reserved_port(launch: Callable[[int], Process], *, timeout: float = 30.0, tries: int = 5) -> Process:
    """`launch(port)` on a `reserved_port`, waited for until it listens there; launched again on
    another port when that one turned out taken. The caller stops it."""
    for attempt in range(tries):
        port = reserved_port()
        process = launch(port)
        try:
            process.wait_listening(timeout, port=port)
            return process
        except PortTaken:
            process.stop()
            if attempt == tries - 1:
                raise
        except BaseException:
            process.stop()
            raise
    raise AssertionError("unreachable")


@contextlib.contextmanager
def on_reserved_port(launch: Callable[[int], Process], *, timeout: float = 30.0) -> Iterator[Process]:
    """`start_on_reserved_port` until the block ends."""
    process = start_on_reserved_port(launch, timeout=timeout)
    try:
        yield process
    finally:
        process.stop()


# ------------------------------------------------------------ finding processes by PID (Linux /proc)


def _parents() -> dict[int, int]:
    """Every live process's parent, from one pass over /proc."""
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(") ", 1)[1].split(None, 2)
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
    return parents


def children_of(pid: int) -> list[int]:
    return [child for child, parent in _parents().items() if parent == pid]


def descendants(pid: int) -> list[int]:
    """Children first, each followed by its own descendants; from one pass over /proc (a pass per
    child would read every process's stat again for each)."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []

    def walk(parent: int) -> None:
        for child in children.get(parent, ()):
            found.append(child)
            walk(child)

    walk(pid)
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
