"""CPU per log line: the `request` line every message logs at the info level, written the way the
proxy writes it (proxy/logs.py LogSink: queued, written by a thread of its own) against a blocking
write per line on the logging thread (structlog's BytesLogger, as the proxy wrote before), stderr
being a pipe that `cat` drains (`mcp-era-proxy ... 2>&1 | tee log`).

    .venv/bin/python -m bench.log_lines [--lines 50000] [--rounds 9]

Per line: process CPU (every thread, until the line is written), minus the same loop without the
line, for the output alone (the rendered line handed to the logger) and for the whole structlog
pipeline (processors, JSON, output); best and median of the rounds, the two ways interleaved. The
loop polls (a zero-timeout select(), as the event loop does between its rounds of callbacks) after
every line (`sparse`) or every 100 (`busy`), and idles 1 ms every 500 lines: a queue that
overflowed would drop lines and flatter the sink (`lost` says it did not). One JSON line per row.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import structlog

from proxy import logs

LINE = (
    b'{"method":"tools/call","downstream_era":"legacy","upstream_era":"modern","outcome":"ok","status":200,'
    b'"latency_ms":1.234,"session":"3f2a9c1b","event":"request","level":"info","ts":"2026-01-01T00:00:00.000000Z"}'
)


def loop(emit: Callable[[], None] | None, lines: int, every: int) -> None:
    for index in range(lines):
        if emit is not None:
            emit()
        if index % every == 0:
            select.select([], [], [], 0)
        if index % 500 == 499:
            time.sleep(0.001)


def cpu_per_line(emit: Callable[[], None], lines: int, every: int) -> float:
    """ns of process CPU per line, the loop's own cost taken out."""

    def run(with_line: bool) -> int:
        logs.flush(30.0)
        started = time.process_time_ns()
        loop(emit if with_line else None, lines, every)
        logs.flush(30.0)  # the writer's share counts too
        return time.process_time_ns() - started

    return (run(True) - run(False)) / lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    reader = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert reader.stdin is not None
    report = os.dup(1)
    os.dup2(reader.stdin.fileno(), 2)
    reader.stdin.close()
    try:
        logs.configure_logging("info", "json")
        sink_logger = structlog.get_config()["logger_factory"]()
        direct_logger = structlog.BytesLogger(sys.stderr.buffer)
        pipeline = structlog.get_logger("bench")
        direct_pipeline = structlog.wrap_logger(
            direct_logger,
            processors=structlog.get_config()["processors"],
            wrapper_class=structlog.get_config()["wrapper_class"],
        )
        fields: dict[str, Any] = {
            "method": "tools/call",
            "downstream_era": "legacy",
            "upstream_era": "modern",
            "outcome": "ok",
            "status": 200,
            "latency_ms": 1.234,
            "session": "3f2a9c1b",
        }
        ways: dict[tuple[str, str], Callable[[], None]] = {
            ("output", "sink"): lambda: sink_logger.msg(LINE),
            ("output", "direct"): lambda: direct_logger.msg(LINE),
            ("pipeline", "sink"): lambda: pipeline.info("request", **fields),
            ("pipeline", "direct"): lambda: direct_pipeline.info("request", **fields),
        }
        for shape, every in (("busy", 100), ("sparse", 1)):
            costs: dict[tuple[str, str], list[float]] = {key: [] for key in ways}
            for _ in range(args.rounds):
                for key, emit in ways.items():
                    costs[key].append(cpu_per_line(emit, args.lines, every))
            for (what, way), values in costs.items():
                values.sort()
                row = {
                    "what": what,
                    "way": way,
                    "shape": shape,
                    "lines": args.lines,
                    "rounds": args.rounds,
                    "cpu_ns_per_line_best": round(values[0]),
                    "cpu_ns_per_line_median": round(values[len(values) // 2]),
                    "lost": logs.lines_lost(),
                }
                os.write(report, (json.dumps(row) + "\n").encode())
    finally:
        logs.stop()
        reader.kill()
        reader.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
