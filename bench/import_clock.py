"""Run a module as `python -m MODULE ARGS` would, and write at exit, as JSON to OUT, what importing
cost it: the CPU and wall time spent in imports (outermost ones only, so nothing is counted twice),
and the modules loaded.

    python bench/import_clock.py OUT MODULE [ARGS...]      # run by bench/startup.py, in the tree measured

Standard library only, and run by path, not with -m: importing nothing of the bench, it measures
only what MODULE imports. sys.path[0] is the working directory, as under `python -m`. Imports are
counted in the main thread (the proxy imports nothing in its others); CPU is that thread's own.
"""

from __future__ import annotations

import _frozen_importlib  # the import system's own module: its loader step is timed
import atexit
import json
import os
import runpy
import sys
import threading
import time
from typing import Any


def main() -> None:
    out, module, *args = sys.argv[1:]
    main_thread = threading.main_thread()
    spent = {"cpu_s": 0.0, "wall_s": 0.0, "imports": 0}
    depth = [0]
    load = _frozen_importlib._load_unlocked  # type: ignore[attr-defined]

    def timed(spec: Any) -> Any:
        if threading.current_thread() is not main_thread or depth[0]:
            depth[0] += threading.current_thread() is main_thread
            try:
                return load(spec)
            finally:
                depth[0] -= threading.current_thread() is main_thread
        cpu, wall = time.thread_time(), time.perf_counter()
        depth[0] = 1
        try:
            return load(spec)
        finally:
            depth[0] = 0
            spent["cpu_s"] += time.thread_time() - cpu
            spent["wall_s"] += time.perf_counter() - wall
            spent["imports"] += 1

    def report() -> None:
        with open(out, "w") as file:
            json.dump({**spent, "modules": len(sys.modules)}, file)

    _frozen_importlib._load_unlocked = timed  # type: ignore[attr-defined]
    atexit.register(report)
    sys.argv = [module, *args]
    sys.path[0] = os.getcwd()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
