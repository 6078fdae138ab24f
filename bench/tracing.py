"""What tracing costs: CPU µs per request of the proxy before tracing existed, with it off, and on.

    .venv/bin/python -m bench.tracing [--before REV] [--duration 3] [--repeat 3]

Rows (c) modern pass-through and (d) legacy client translated, as in bench/run.py (same wrk
scripts, same upstream, same measurement), for three proxies in turn: REV's code (default `main`,
exported with `git archive` and run from there: "before"), this tree with `tracing.otlp_endpoint`
unset ("off"), and this tree exporting every span (sample_ratio 1) to a local OTLP sink that
answers 200 to each batch ("on"). Output: a table on stdout and bench/results/tracing.md.
Everything listens on 127.0.0.1; each process is stopped by its pid at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiohttp import web

from bench import servers
from bench.calls import expect_echo, legacy_call, legacy_session, modern_call
from bench.harness import BENCH, REPO, Processes, machine, say
from bench.report import Row, cpu_text
from bench.run import Bench
from tests.support.procs import reserved_port


def sink(port: int) -> None:
    """An OTLP/HTTP receiver that accepts and drops every batch (the exporter's cost, not a backend's)."""

    async def accept(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=200, content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", accept)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


@contextlib.contextmanager
def exported(rev: str) -> Iterator[Path]:
    """REV's proxy/ package in a directory of its own (run from there, it shadows this tree's)."""
    with tempfile.TemporaryDirectory(prefix="bench-before-") as work:
        archive = Path(work) / "src.tar"
        subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), rev, "proxy"], check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(work, filter="data")
        yield Path(work)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default="main", help="the revision measured as 'before' (default main)")
    parser.add_argument("--duration", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    parser.add_argument("--sink", type=int, default=None, help=argparse.SUPPRESS)  # the sink's own process
    args = parser.parse_args()
    if args.sink is not None:
        sink(args.sink)
        return 0
    args.only, args.profile = set(), False
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "logs").mkdir(exist_ok=True)
    procs = Processes(args.out / "logs", args.out / ".pids")
    bench = Bench(args, procs)
    results: dict[tuple[str, str], Row] = {}
    try:
        with (
            servers.upstream(procs, "modern") as (modern, _),
            procs.listening("otlp-sink", [sys.executable, "-m", "bench.tracing", "--sink", "0"]) as receiver,
            exported(args.before) as before,
        ):
            variants: list[tuple[str, Path | None, dict[str, str]]] = [
                ("before", before, {}),
                ("off", None, {}),
                ("on", None, {"MCP_ERA_PROXY_TRACING__OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}/v1/traces"}),
            ]
            for variant, cwd, env in variants:
                say(f"tracing {variant}: (c) modern pass-through")
                with servers.proxy(
                    procs, f"c-{variant}", url=modern, era="modern", env=env, tree=cwd, port=reserved_port()
                ) as (url, pid):
                    expect_echo(f"(c {variant})", *modern_call(url))
                    results["c", variant] = bench.measure(
                        Row(f"c-{variant}", f"(c) {variant}"), url, "modern_tools_call.lua", cpu_pid=pid
                    )
                say(f"tracing {variant}: (d) legacy client, translated")
                with servers.proxy(
                    procs, f"d-{variant}", url=modern, era="modern", env=env, tree=cwd, port=reserved_port()
                ) as (url, pid):
                    session = legacy_session(url)
                    expect_echo(f"(d {variant})", *legacy_call(url, session))
                    results["d", variant] = bench.measure(
                        Row(f"d-{variant}", f"(d) {variant}"),
                        url,
                        "legacy_tools_call.lua",
                        {"BENCH_SESSION": session},
                        cpu_pid=pid,
                    )
    finally:
        procs.stop_all()
    text = render(results, args, machine())
    (args.out / "tracing.md").write_text(text + "\n")
    print(text)
    return 0


def render(results: dict[tuple[str, str], Row], args: argparse.Namespace, facts: dict[str, Any]) -> str:
    lines = [
        f"Tracing cost, CPU µs/req of the proxy process (median of {args.repeat} wrk runs of {args.duration} s; "
        f"before = {args.before})",
        "",
        "| row | before @1 | off @1 | on @1 | before @32 | off @32 | on @32 | rps @32 before / off / on |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, title in (("c", "(c) modern pass-through"), ("d", "(d) legacy → modern, translated")):
        rows = [results[key, v] for v in ("before", "off", "on")]
        cpu1 = " | ".join(cpu_text(r.cpu1) for r in rows)
        cpu32 = " | ".join(cpu_text(r.cpu32) for r in rows)
        rps = " / ".join(f"{r.c32.rps:.0f}" if r.c32 else "-" for r in rows)
        lines.append(f"| {title} | {cpu1} | {cpu32} | {rps} |")
    lines += ["", "machine: " + ", ".join(f"{k} {v}" for k, v in facts.items())]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
