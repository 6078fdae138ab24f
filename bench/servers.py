"""The servers a benchmark starts, each a process of its own on 127.0.0.1 held by a `Processes`
(bench/harness.py) and stopped by its pid when its block ends: the bench upstream, the bare hop,
the proxy (this checkout's, or another tree's), redis-server and the npm peer bridges."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench.harness import Processes, say
from tests.support import peers
from tests.support.procs import reserved_port


def tree_env(tree: Path | None, env: dict[str, str] | None = None) -> dict[str, str]:
    """`env`, plus PYTHONPATH pointing at `tree` first when one is given: a process started in that
    directory with this interpreter imports that tree's `proxy` package (the dependencies are this
    virtualenv's)."""
    out = dict(env or {})
    if tree is not None:
        rest = os.environ.get("PYTHONPATH", "")
        out["PYTHONPATH"] = os.pathsep.join([str(tree), *([rest] if rest else [])])
    return out


@contextlib.contextmanager
def upstream(procs: Processes, era: str) -> Iterator[tuple[str, int]]:
    """bench/upstream.py speaking `era` ('modern' or 'legacy'); (its /mcp URL, its pid)."""
    argv = [sys.executable, "-m", "bench.upstream", "--port", "0", "--era", era]
    with procs.listening(f"upstream-{era}", argv) as process:
        yield f"http://127.0.0.1:{process.port}/mcp", process.proc.pid


@contextlib.contextmanager
def proxy(
    procs: Processes,
    name: str,
    *,
    url: str | None = None,
    command: str | None = None,
    era: str,
    level: str = "warning",
    env: dict[str, str] | None = None,
    tree: Path | None = None,
    port: int = 0,
    launcher: Sequence[str] = (sys.executable, "-m"),
    timeout: float = 60.0,
) -> Iterator[tuple[str, int]]:
    """`python -m proxy` in front of `url` (or a stdio `command`); (its /mcp URL, its pid). With
    `tree`, that tree's code (started in it, PYTHONPATH on it); with `port`, told that port (an older
    tree may not take port 0), else it picks one and its one listener is found. `launcher` runs the
    module (bench/instructions.py: under a counter or valgrind)."""
    target = ["--upstream", url] if url else ["--upstream-command", str(command)]
    argv = [*launcher, "proxy", *target, "--upstream-era", era, "--listen", f"127.0.0.1:{port}"]
    argv += ["--log-level", level]
    with procs.listening(f"proxy-{name}", argv, tree_env(tree, env), timeout, port=port, cwd=tree) as process:
        yield f"http://127.0.0.1:{process.port}/mcp", process.proc.pid


@contextlib.contextmanager
def redis(procs: Processes) -> Iterator[str]:
    """A redis-server of our own on loopback, without persistence (installed like wrk)."""
    if shutil.which("redis-server") is None:
        say("[bench] installing redis-server")
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "redis-server"], check=True, capture_output=True, timeout=300
        )
    port = reserved_port()  # redis-server cannot be told port 0 (that turns TCP off)
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    with procs.listening("redis", argv, port=port):
        yield f"redis://127.0.0.1:{port}/0"


@contextlib.contextmanager
def bare_hop(
    procs: Processes,
    upstream: str,
    name: str = "bare-hop",
    launcher: Sequence[str] = (sys.executable, "-m"),
    timeout: float = 60.0,
) -> Iterator[tuple[str, int]]:
    """bench/bare_hop.py in front of `upstream`; (its /mcp URL, its pid)."""
    argv = [*launcher, "bench.bare_hop", "--upstream", upstream, "--port", "0"]
    with procs.listening(name, argv, timeout=timeout) as process:
        yield f"http://127.0.0.1:{process.port}/mcp", process.proc.pid


@contextlib.contextmanager
def peer(procs: Processes, name: str) -> Iterator[tuple[str, int]]:
    """A peer bridge; peer.sh execs node, so the pid is the bridge (cpu_ticks checks anyway)."""
    with procs.listening(name, ["bash", str(peers.peer_sh()), name, "0"]) as process:
        yield f"http://127.0.0.1:{process.port}/mcp", process.proc.pid
