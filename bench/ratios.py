"""The CPU targets' ratios in one run, every row interleaved: each proxy row's CPU µs per request over
the bare hop's (b), taken round by round; and the latency each row adds over the direct call (a).

    python -m bench.ratios [--rows c,d,d-store,e] [--rounds 5] [--duration 4] [--connections 32]

All the rows' servers run at once: the bare hop (b) and one proxy per row, in front of the same
upstreams (bench/upstream.py; a redis-server of our own for d-store), each checked with one real
call and warmed up. Then every round runs wrk once on each row, in an order that turns by one every
round, so a change in the machine's speed falls on all rows alike. A row's ratio in a round is its
CPU µs per request (the process's utime + stime over the requests wrk completed, as in
bench/run.py) over (b)'s in the same round. The table gives, per row, the median of its rounds'
ratios with their range, and its median CPU. Each round also runs wrk straight at the modern
upstream, (a), and a row's added p50 in a round is its p50 minus (a)'s: with `--connections 1`,
the latency target (at most 0.3 ms added) measured the same way.

Why: on a shared machine a row's CPU per request moves 10-20 % between runs taken minutes apart
(the CPU's speed itself changes), so rows measured one after the other, as bench/run.py does, give
ratios off by as much; ratios taken in the same round move much less. Output: the table on stdout
and in bench/results/ratios.md; every process started is stopped by its pid.
"""

from __future__ import annotations

import argparse
import os
import time
from contextlib import ExitStack
from pathlib import Path

from bench import servers
from bench.calls import expect_echo, legacy_call, legacy_session, modern_call
from bench.compare import SCENARIOS, STORE_SECRET, load_text, middle, row_list, this_checkout
from bench.harness import BENCH, begin, machine, say
from bench.load import wrk

TARGET = 1.25  # the bound for c, d and e over (b); d-store's is over (d)
ADDED_P50_MS = 0.3  # the bound on the median latency a row adds over (a), at 1 in flight


def measure(args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """CPU µs per request of each row (b first) in each round, and each row's p50 in ms ((a) too)."""
    _, procs, _, _ = begin(args.out, machine)
    rows = ["b", *args.rows]
    cpu: dict[str, list[float]] = {row: [] for row in rows}
    p50: dict[str, list[float]] = {row: [] for row in ["a", *rows]}
    try:
        with ExitStack() as stack:
            upstreams = {
                era: stack.enter_context(servers.upstream(procs, era))[0]
                for era in {SCENARIOS[row].upstream for row in rows} | {"modern"}
            }
            store = stack.enter_context(servers.redis(procs)) if "d-store" in rows else None
            targets: dict[str, tuple[str, int, str, dict[str, str]]] = {}  # row: url, pid, script, wrk env
            for row in rows:
                scenario = SCENARIOS[row]
                upstream = upstreams[scenario.upstream]
                if scenario.control:
                    url, pid = stack.enter_context(servers.bare_hop(procs, upstream, "ratios-b"))
                else:
                    env = None
                    if scenario.store and store is not None:
                        env = {"MCP_ERA_PROXY_STORE__URL": store, "MCP_ERA_PROXY_SECURITY__SECRET": STORE_SECRET}
                    url, pid = stack.enter_context(
                        servers.proxy(procs, f"ratios-{row}", url=upstream, era=scenario.upstream, env=env)
                    )
                wrk_env: dict[str, str] = {}
                if scenario.client == "legacy":
                    wrk_env["BENCH_SESSION"] = legacy_session(url)
                    expect_echo(f"({row})", *legacy_call(url, wrk_env["BENCH_SESSION"]))
                else:
                    expect_echo(f"({row})", *modern_call(url))
                script = "legacy_tools_call.lua" if scenario.client == "legacy" else "modern_tools_call.lua"
                targets[row] = (url, pid, script, wrk_env)
                wrk(url, script, 32, 2, 1, wrk_env)  # warm-up, unrecorded
            threads = 1 if args.connections == 1 else 2
            direct = upstreams["modern"]
            every = ["a", *rows]
            for index in range(args.rounds):
                order = every[index % len(every) :] + every[: index % len(every)]
                for row in order:
                    if row == "a":  # the reference for the added latency: no CPU of a proxy to take
                        load = wrk(direct, "modern_tools_call.lua", args.connections, threads, args.duration, {})
                        if load.errors:
                            raise RuntimeError(f"(a) round {index + 1}: {load}")
                        p50["a"].append(load.p50_ms)
                        continue
                    url, pid, script, wrk_env = targets[row]
                    load = wrk(url, script, args.connections, threads, args.duration, wrk_env, pid)
                    if load.cpu_us is None or load.errors:
                        raise RuntimeError(f"({row}) round {index + 1}: {load}")
                    cpu[row].append(load.cpu_us)
                    p50[row].append(load.p50_ms)
                say(f"round {index + 1}/{args.rounds}: " + ", ".join(f"{r} {cpu[r][-1]:.0f}" for r in rows))
    finally:
        procs.stop_all()
    return cpu, p50


def render(
    args: argparse.Namespace,
    cpu: dict[str, list[float]],
    p50: dict[str, list[float]],
    started: float,
    loads: tuple[str, str],
) -> str:
    lines = [
        "# The CPU targets' ratios, rows interleaved (bench/ratios.py)",
        "",
        f"`python -m bench.ratios --rows {','.join(args.rows)} --rounds {args.rounds} --duration {args.duration}"
        f" --connections {args.connections}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}; "
        f"{this_checkout()}; load average at start {loads[0]}, at end {loads[1]}.",
        "",
        "| row | CPU µs/req, median (min..max) | over (b), median of the rounds (min..max) | target "
        "| added p50 (ms) over (a), median of the rounds (min..max) |",
        "|---|---|---|---|---|",
    ]
    for row in ["b", *args.rows]:
        values = sorted(cpu[row])
        cell = f"{middle(values):.0f} ({values[0]:.0f}..{values[-1]:.0f})"
        added = sorted(mine - direct for mine, direct in zip(p50[row], p50["a"], strict=True))
        added_median = middle(added)
        assert added_median is not None
        added_cell = f"{added_median:+.3f} ({added[0]:+.3f}..{added[-1]:+.3f})"
        if args.connections == 1 and row != "b":
            verdict = "met" if added_median <= ADDED_P50_MS else "not met"
            added_cell += f" ≤ {ADDED_P50_MS}: **{verdict}**"
        if row == "b":
            lines.append(f"| (b) bare aiohttp hop | {cell} | 1 | — | {added_cell} |")
            continue
        over = "d" if row == "d-store" and "d" in cpu else "b"
        ratios = sorted(mine / theirs for mine, theirs in zip(cpu[row], cpu[over], strict=True))
        bound = 1.1 if over == "d" else TARGET
        median = middle(ratios)
        assert median is not None
        verdict = "met" if median <= bound else "not met"
        text = f"{median:.3f} ({ratios[0]:.2f}..{ratios[-1]:.2f})" + (" over (d)" if over == "d" else "")
        lines.append(
            f"| {SCENARIOS[row].title} | {cell} | {text} | ≤ {bound} over ({over}): **{verdict}** | {added_cell} |"
        )
    a = sorted(p50["a"])
    lines += ["", f"(a), straight at the modern upstream: p50 {a[len(a) // 2]:.3f} ms ({a[0]:.3f}..{a[-1]:.3f})."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ratios", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=row_list, default=["c", "d", "d-store", "e"], metavar="ROWS")
    parser.add_argument("--rounds", type=int, default=5, help="wrk runs per row, one per round (default 5)")
    parser.add_argument("--duration", type=int, default=4, metavar="S", help="seconds per wrk run (default 4)")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections (default 32)")
    parser.add_argument("--out", type=Path, default=BENCH / "results", metavar="DIR")
    args = parser.parse_args()
    args.rows = [row for row in args.rows if row != "b"]
    started, load_start = time.time(), load_text(os.getloadavg())
    cpu, p50 = measure(args)
    text = render(args, cpu, p50, started, (load_start, load_text(os.getloadavg())))
    (args.out / "ratios.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
