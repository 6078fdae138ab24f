"""Where the proxy's time goes: py-spy sampling a server during an extra, unrecorded wrk run, and the
summary of its collapsed stacks (self time by package, top functions, the proxy's own functions)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from bench.harness import say

Profiler = tuple[subprocess.Popen[bytes], Path]


def start_profile(out_dir: Path, key: str, pid: int, duration: float) -> Profiler:
    """py-spy recording `pid` for `duration` seconds into out_dir/profile-<key>.txt (raw stacks)."""
    out = out_dir / f"profile-{key}.txt"
    argv = ["py-spy", "record", "--pid", str(pid), "--duration", str(int(duration)), "--rate", "250"]
    argv += ["--format", "raw", "--output", str(out), "--nonblocking"]
    py_spy = Path(sys.executable).with_name("py-spy")
    if py_spy.exists():
        argv[0] = str(py_spy)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    return proc, out


def finish_profile(key: str, profiler: Profiler) -> list[str] | None:
    """Waits for py-spy (30 s at most, then kills its group); the summary, or None without a profile."""
    proc, out = profiler
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    if not out.exists():
        say(f"  py-spy gave no profile for {key}: {err.decode(errors='replace')[-300:]}")
        return None
    summary = summarize_profile(out)
    say(f"  profile {key} (self time, top frames):\n    " + "\n    ".join(summary))
    return summary


_FRAME = re.compile(r"^(?P<name>.*) \((?P<file>.*?)(?::\d+)?\)$")
_BUCKETS = (
    ("aiohttp", "aiohttp/"),
    ("proxy", "proxy/"),
    ("asyncio", "asyncio/"),
    ("prometheus_client", "prometheus_client/"),
    ("structlog", "structlog/"),
    ("pydantic", "pydantic"),
    ("multidict/yarl", "multidict/"),
    ("multidict/yarl", "yarl/"),
)


def _frame(raw: str) -> tuple[str, str]:
    """'func (path/file.py:123)' -> ('func (path/file.py)', 'path/file.py')."""
    match = _FRAME.match(raw)
    if match is None:
        return raw or "(native)", ""
    return f"{match['name']} ({match['file']})", match["file"]


def _bucket(name: str, file: str) -> str:
    if name.startswith(("Runner.run", "run (uvloop")) or not file:
        return "event loop + syscalls (uvloop, C)"
    for label, marker in _BUCKETS:
        if marker in file:
            return label
    return "other Python"


def summarize_profile(path: Path, top: int = 15) -> list[str]:
    """py-spy raw (collapsed) stacks: self time by package, top functions by self time, and the
    proxy's own functions by inclusive time (coroutine stacks as py-spy sees them)."""
    by_bucket: dict[str, int] = {}
    self_time: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        samples = int(count)
        total += samples
        frames = [_frame(f) for f in stack.split(";")]
        leaf, leaf_file = frames[-1]
        self_time[leaf] = self_time.get(leaf, 0) + samples
        bucket = _bucket(leaf, leaf_file)
        by_bucket[bucket] = by_bucket.get(bucket, 0) + samples
        for name in {name for name, file in frames if file.startswith("proxy/")}:
            inclusive[name] = inclusive.get(name, 0) + samples
    if not total:
        return ["(no samples)"]

    def pct(n: int) -> str:
        return f"{100 * n / total:5.1f}%"

    out = [
        "self time by package: "
        + ", ".join(f"{k} {pct(v).strip()}" for k, v in sorted(by_bucket.items(), key=lambda kv: -kv[1]))
    ]
    out += [f"self {pct(n)}  {f}" for f, n in sorted(self_time.items(), key=lambda kv: -kv[1])[:top]]
    out += [f"incl {pct(n)}  {f}" for f, n in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]]
    return out
