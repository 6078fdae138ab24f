"""What every bench harness sets up the same way: the results and logs folders, the holder of the
processes it starts, SIGTERM (from bench/run.sh's clean-up) as an orderly exit, and the line that
says what machine the figures come from."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.support import peers
from tests.support.procs import Announcement, Process

REPO = peers.REPO
BENCH = REPO / "bench"


def say(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def begin(out: Path, facts: Callable[[], dict[str, str]]) -> tuple[Path, Processes, float, dict[str, str]]:
    """A harness's start: `out` and `out/logs` made, the process holder (its group ids in
    `out/.pids` for bench/run.sh), SIGTERM exiting through every `finally` that stops them, the
    start time, and the machine's `facts`, said; (logs, processes, start time, facts)."""
    out.mkdir(parents=True, exist_ok=True)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    procs = Processes(logs, out / ".pids")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.time()
    info = facts()
    say("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    return logs, procs, started, info


# ---------------------------------------------------------------- processes


class Processes:
    """Every process the bench starts, each in its own process group; all stopped at the end.

    The group ids are also written to `pidfile`, so bench/run.sh's EXIT trap can kill them by id
    should this harness itself be killed without a chance to clean up.
    """

    def __init__(self, logs: Path, pidfile: Path) -> None:
        self.logs = logs
        self.pidfile = pidfile
        self.live: list[Process] = []

    def _write(self) -> None:
        self.pidfile.write_text("".join(f"{p.proc.pid}\n" for p in self.live))

    @contextlib.contextmanager
    def listening(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        timeout: float = 60.0,
        *,
        port: int = 0,
        announced: Announcement | None = None,
        cwd: Path | None = None,
    ) -> Iterator[Process]:
        """`argv` (started in `cwd`, if given) until the block ends, once it listens: on `port` if it
        was told one, else on the port it chose (`announced`, or its one port: tests.support.procs);
        that is `.port`."""
        process = Process(argv, self.logs / f"{name}.log", env, cwd)
        self.live.append(process)
        self._write()
        try:
            process.wait_listening(timeout, port=port, announced=announced)
            yield process
        finally:
            process.stop()
            self.live.remove(process)
            self._write()

    def stop_all(self) -> None:
        for process in list(self.live):
            process.stop()
        self.live.clear()
        self._write()


# ---------------------------------------------------------------- report


def machine() -> dict[str, str]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    wrk_version = (
        subprocess.run(["wrk", "--version"], capture_output=True, text=True, check=False).stdout.split("\n")[0]
        if shutil.which("wrk")
        else "not installed"
    )
    try:
        import aiohttp

        aiohttp_version = aiohttp.__version__
    except ImportError:  # pragma: no cover
        aiohttp_version = "?"
    try:
        import uvloop

        loop = f"uvloop {uvloop.__version__}"
    except ImportError:
        loop = "asyncio"
    return {
        "CPU": model,
        "cores": str(os.cpu_count()),
        "Python": platform.python_version(),
        "kernel": platform.release(),
        "aiohttp": aiohttp_version,
        "event loop": loop,
        "wrk": " ".join(wrk_version.split()[:2]),
    }
