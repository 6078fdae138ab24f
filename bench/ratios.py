"""The CPU targets' ratios in one run, every row interleaved: each proxy row's CPU µs per request over
the bare hop's (b), taken round by round.

    python -m bench.ratios [--rows c,d,d-store,e] [--rounds 5] [--duration 4] [--connections 32]

All the rows' servers run at once: the bare hop (b) and one proxy per row, in front of the same
upstreams (bench/upstream.py; a redis-server of our own for d-store), each checked with one real
call and warmed up. Then every round runs wrk once on each row, in an order that turns by one every
round, so a change in the machine's speed falls on all rows alike. A row's ratio in a round is its
CPU µs per request (the process's utime + stime over the requests wrk completed, as in
bench/run.py) over (b)'s in the same round. The table gives, per row, the median of its rounds'
ratios with their range, and its median CPU.

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


def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    """CPU µs per request of each row (b first) in each round."""
    _, procs, _, _ = begin(args.out, machine)
    rows = ["b", *args.rows]
    cpu: dict[str, list[float]] = {row: [] for row in rows}
    try:
        with ExitStack() as stack:
            upstreams = {
                era: stack.enter_context(servers.upstream(procs, era))[0]
                for era in {SCENARIOS[row].upstream for row in rows}
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
            for index in range(args.rounds):
                order = rows[index % len(rows) :] + rows[: index % len(rows)]
                for row in order:
                    url, pid, script, wrk_env = targets[row]
                    load = wrk(url, script, args.connections, threads, args.duration, wrk_env, pid)
                    if load.cpu_us is None or load.errors:
                        raise RuntimeError(f"({row}) round {index + 1}: {load}")
                    cpu[row].append(load.cpu_us)
                say(f"round {index + 1}/{args.rounds}: " + ", ".join(f"{r} {cpu[r][-1]:.0f}" for r in rows))
    finally:
        procs.stop_all()
    return cpu


def render(args: argparse.Namespace, cpu: dict[str, list[float]], started: float, loads: tuple[str, str]) -> str:
    lines = [
        "# The CPU targets' ratios, rows interleaved (bench/ratios.py)",
        "",
        f"`python -m bench.ratios --rows {','.join(args.rows)} --rounds {args.rounds} --duration {args.duration}"
        f" --connections {args.connections}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}; "
        f"{this_checkout()}; load average at start {loads[0]}, at end {loads[1]}.",
        "",
        "| row | CPU µs/req, median (min..max) | over (b), median of the rounds (min..max) | target |",
        "|---|---|---|---|",
    ]
    for row in ["b", *args.rows]:
        values = sorted(cpu[row])
        cell = f"{middle(values):.0f} ({values[0]:.0f}..{values[-1]:.0f})"
        if row == "b":
            lines.append(f"| (b) bare aiohttp hop | {cell} | 1 | — |")
            continue
        over = "d" if row == "d-store" and "d" in cpu else "b"
        ratios = sorted(mine / theirs for mine, theirs in zip(cpu[row], cpu[over], strict=True))
        bound = 1.1 if over == "d" else TARGET
        median = middle(ratios)
        assert median is not None
        verdict = "met" if median <= bound else "not met"
        text = f"{median:.3f} ({ratios[0]:.2f}..{ratios[-1]:.2f})" + (" over (d)" if over == "d" else "")
        lines.append(f"| {SCENARIOS[row].title} | {cell} | {text} | ≤ {bound} over ({over}): **{verdict}** |")
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
    cpu = measure(args)
    text = render(args, cpu, started, (load_start, load_text(os.getloadavg())))
    (args.out / "ratios.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
