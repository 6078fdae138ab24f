"""What a process holds, by where it was allocated: `python bench/traced.py MODULE [ARGS...]` runs
`python -m MODULE` (from the working directory, as -m would) under tracemalloc, and each SIGUSR1
writes a snapshot to $BENCH_TRACE_DIR/snapshot-<n>.bin (n from 0). Run by its path, it imports
nothing of the checkout whose MODULE it runs (bench.streams --tree). `held_beyond` compares two
snapshots, grouped by the innermost frame of the proxy's own code (what the proxy made, or asked a
library for) and the frame that allocated. bench/streams.py --tracemalloc uses both.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import tracemalloc
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

FRAMES = 25  # deep enough to reach the proxy's frames under aiohttp's and asyncio's


def snapshot_path(directory: Path, index: int) -> Path:
    return directory / f"snapshot-{index}.bin"


def main() -> None:
    directory = Path(os.environ["BENCH_TRACE_DIR"])
    taken = 0

    def dump(signum: int, frame: FrameType | None) -> None:
        nonlocal taken
        path = snapshot_path(directory, taken)
        partial = path.with_suffix(".part")
        tracemalloc.take_snapshot().dump(str(partial))
        os.replace(partial, path)  # whole once it appears
        taken += 1

    tracemalloc.start(FRAMES)
    signal.signal(signal.SIGUSR1, dump)
    sys.path[0] = os.getcwd()  # not this script's directory: as `python -m MODULE` would
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _own(frame: tracemalloc.Frame) -> bool:
    return "/proxy/" in frame.filename and "/site-packages/" not in frame.filename


def _where(frame: tracemalloc.Frame) -> str:
    name = frame.filename
    if "/site-packages/" in name:
        name = name.rsplit("/site-packages/", 1)[1]
    elif "/lib/python3" in name:
        name = name.rsplit("/lib/python3", 1)[1].split("/", 1)[-1]
    elif _own(frame):
        name = "proxy/" + name.rsplit("/proxy/", 1)[1]
    return f"{name}:{frame.lineno}"


def held_beyond(before: Path, after: Path, per: int, top: int = 15) -> list[dict[str, Any]]:
    """The `top` sites of what `after` holds beyond `before`, in bytes (and allocations) per unit:
    by the innermost frame in proxy/ and the frame that allocated."""
    sizes: Counter[tuple[str, str]] = Counter()
    counts: Counter[tuple[str, str]] = Counter()
    old = tracemalloc.Snapshot.load(str(before))
    for stat in tracemalloc.Snapshot.load(str(after)).compare_to(old, "traceback"):
        frames = list(stat.traceback)  # the oldest first
        own = [frame for frame in frames if _own(frame)]
        site = (_where(own[-1]) if own else "(outside proxy/)", _where(frames[-1]))
        sizes[site] += stat.size_diff
        counts[site] += stat.count_diff
    rows = [
        {
            "bytes": round(sizes[site] / per),
            "allocations": round(counts[site] / per, 2),
            "proxy": site[0],
            "allocated": site[1],
        }
        for site, _ in sizes.most_common(top)
    ]
    return [{"total_bytes": round(sum(sizes.values()) / per)}, *rows]


if __name__ == "__main__":
    main()
