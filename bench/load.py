"""Load and what it costs: wrk runs (one Lua script per request shape, bench/wrk/) and the CPU time
of the process under test across each run, from /proc/<pid>/stat."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.harness import BENCH

WRK_DIR = BENCH / "wrk"


CLK_TCK = os.sysconf("SC_CLK_TCK")
WRAPPERS = frozenset({"bash", "sh", "dash", "env", "timeout"})  # a pid that is not the server itself


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(comm, ppid, utime + stime in clock ticks) from /proc/<pid>/stat; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()  # fields[0] is field 3 (state) of proc(5)
    return comm, int(fields[1]), int(fields[11]) + int(fields[12])


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[1], []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cpu_ticks(pid: int, tree: bool = False) -> int:
    """utime + stime of the process under test, in clock ticks (os.sysconf('SC_CLK_TCK') a second).

    The process itself only (the proxy, the bare hop and the upstreams are the python process
    started; peer.sh execs node), not its children: for the stdio rows those are the upstream.
    Only if `pid` is a wrapper (a shell that did not exec), or `tree` asks for them (a supervisor
    and its workers, bench/workers.py), are its live descendants added.
    """
    stat = _stat(pid)
    if stat is None:
        return 0
    ticks = stat[2]
    if tree or stat[0] in WRAPPERS:
        ticks += sum(s[2] for child in _descendants(pid) if (s := _stat(child)) is not None)
    return ticks


def cpu_us_per_request(ticks: int, requests: int) -> float | None:
    return ticks * 1e6 / CLK_TCK / requests if requests else None


def median_value(values: list[float | None]) -> float | None:
    known = sorted(v for v in values if v is not None)
    return known[len(known) // 2] if known else None


# ---------------------------------------------------------------- wrk


@dataclass
class Load:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int  # completed in this wrk run
    errors: int
    cpu_us: float | None = None  # CPU time of the process under test per completed request


def median(loads: list[Load]) -> Load:
    return sorted(loads, key=lambda load: load.rps)[len(loads) // 2]


def spread(loads: list[Load]) -> str:
    values = sorted(load.rps for load in loads)
    return f"{values[0]:.0f}..{values[-1]:.0f}"


def wrk(
    url: str,
    script: str,
    connections: int,
    threads: int,
    duration: int,
    env: dict[str, str],
    cpu_pid: int | None = None,
    cpu_tree: bool = False,
) -> Load:
    """One wrk run; with `cpu_pid`, that process's CPU time (with `cpu_tree`, its descendants' too)
    is sampled right before and after it."""
    argv = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{duration}s",
        "--timeout",
        "10s",
        "-s",
        str(WRK_DIR / script),
        url,
    ]
    before = cpu_ticks(cpu_pid, cpu_tree) if cpu_pid is not None else 0
    done = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, **env}, timeout=duration + 30, check=False
    )
    ticks = cpu_ticks(cpu_pid, cpu_tree) - before if cpu_pid is not None else None
    match = re.search(r"^BENCH_JSON (.*)$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout[-500:]} {done.stderr[-500:]}")
    data = json.loads(match[1])
    errors = sum(v for k, v in data.items() if k.startswith("errors_"))
    return Load(
        rps=data["requests"] / (data["duration_us"] / 1e6),
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        requests=data["requests"],
        errors=errors,
        cpu_us=cpu_us_per_request(ticks, data["requests"]) if ticks is not None else None,
    )
