"""The benchmark's report: a row per scenario, the markdown table with its targets and profiles
(bench/results/latest.md), and the chart (latest.png, matplotlib from the `bench` extra)."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.load import Load


@dataclass
class Row:
    key: str
    label: str
    notes: list[str] = field(default_factory=list)
    c1: Load | None = None
    c32: Load | None = None
    baseline: str | None = None  # the row the "added" latencies are measured against
    total_requests: int = 0
    spread: tuple[str, str] | None = None  # rps range over the repeats, @1 and @32
    cpu1: float | None = None  # CPU µs per request of the process under test, median of the runs @1
    cpu32: float | None = None  # the same @32
    runs: list[dict[str, Any]] = field(default_factory=list)  # every recorded wrk run: requests, rps, CPU


def ms(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}f}"


def cpu_text(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def render(
    measured: list[Row],
    mem: dict[str, Any] | None,
    profiles: dict[str, list[str]],
    args: argparse.Namespace,
    facts: dict[str, str],
    started: float,
    streams: dict[str, Any] | None = None,
    loads: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
) -> tuple[str, list[str]]:
    """latest.md: the table of `measured`, the memory line (`mem`, from bench/sessions_rss.py), the
    GET streams line (`streams`, from bench/streams.py), the targets met or not, and the
    `profiles`; `loads`, the load average at start and end; (the text, the target lines)."""
    rows = {row.key: row for row in measured}
    lines = ["# mcp-era-proxy benchmark", ""]
    lines.append(" · ".join(f"**{k}**: {v}" for k, v in facts.items()))
    lines.append("")
    lines.append(
        f"`bash bench/run.sh` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}; wrk, "
        f"{args.repeat} runs of {args.duration} s per measurement (the run with the median rps is shown; "
        f"rps range in the notes) after a {args.warmup} s warm-up at 32 connections; "
        "@1 = `wrk -t1 -c1`, @32 = `wrk -t2 -c32`; latency in ms. Proxy runs at log level **warning** "
        "unless the row says otherwise. Load generator, proxy, upstream (and bridges) share the "
        f"{facts['cores']} cores above, all on 127.0.0.1. CPU µs/req = utime + stime of the process "
        "under test (the server wrk talks to; for (a) the upstream), sampled from /proc right before "
        "and after each run, over the requests wrk completed in it; median of the runs. Steadier than "
        "rps on a shared machine."
        + (
            f" Load average (1/5/15 min) at start {' / '.join(f'{x:.2f}' for x in loads[0])}, "
            f"at end {' / '.join(f'{x:.2f}' for x in loads[1])}."
            if loads
            else ""
        )
    )
    lines.append("")
    lines.append(
        "| scenario | rps@1 | p50@1 (ms) | p99@1 | rps@32 | p50@32 | p99@32 | CPU µs/req@1 | CPU µs/req@32 "
        "| added p50@1 (ms) | added p99@1 | added p50@32 | added p99@32 | notes |"
    )
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in measured:
        assert row.c1 is not None and row.c32 is not None
        lines.append(
            f"| {row.label} | {row.c1.rps:.0f} | {ms(row.c1.p50_ms)} | {ms(row.c1.p99_ms)} | "
            f"{row.c32.rps:.0f} | {ms(row.c32.p50_ms, 2)} | {ms(row.c32.p99_ms, 2)} | "
            f"{cpu_text(row.cpu1)} | {cpu_text(row.cpu32)} | {' | '.join(added(row, rows.get(row.baseline or '')))} | "
            f"{'; '.join(row.notes + ([f'rps range @1 {row.spread[0]}, @32 {row.spread[1]}'] if row.spread else []))} |"
        )
    lines.append("")
    lines.append(
        "Added = the row's p50 or p99 minus that of (a), at the same concurrency: what the hop adds "
        "(for the peer bridges: over the proxy's (g) row; negative = faster)."
        + (
            " (a) was run as the reference for the added columns, though `--only` did not name it."
            if args.reference_added
            else ""
        )
    )
    lines.append("")
    if mem is not None:
        lines.append(
            f"**Memory**: proxy RSS {mem['before_kb'] / 1024:.1f} MiB → {mem['after_kb'] / 1024:.1f} MiB after "
            f"{mem['opened']} idle legacy sessions (initialize only, modern upstream; {mem['failed']} failed; "
            f"opened in {mem['seconds']} s) = **{mem['kb_per_session']:.2f} KB per session**."
        )
        lines.append("")
    if streams is not None:
        lines.extend(streams_lines(streams))
    targets = judge(rows, mem, streams)
    if targets:
        lines.append("## Targets")
        lines.append("")
        lines.extend(f"- {t}" for t in targets)
        lines.append("")
    if profiles:
        lines.append("## Profiles (py-spy, proxy process, @32)")
        lines.append("")
        for key, summary in profiles.items():
            lines.append(f"**{key}**")
            lines.append("```")
            lines.extend(summary)
            lines.append("```")
        lines.append("")
    return "\n".join(lines), targets


def streams_lines(streams: dict[str, Any]) -> list[str]:
    """The cost of N legacy sessions each holding a GET stream (bench/streams.py's JSON line)."""
    stages = streams["stages"]
    base, opened, held = stages["base"], stages["sessions"], stages["streams"]

    def mib(stage: dict[str, int]) -> str:
        return f"{stage['rss_kb'] / 1024:.1f}"

    count = streams["sessions"]
    return [
        f"**GET streams** (`python -m bench.streams --sessions {count}`: {count} legacy sessions of one "
        "caller, each holding a GET stream, in front of a 2026-07-28 upstream that serves "
        "`subscriptions/listen`; figures of the proxy process, read after each stage):",
        "",
        "| sessions | RSS base → sessions → streams (MiB) | KB per stream | KB per session with its stream "
        "| descriptors (sessions → streams) | upstream connections (upstream listens) "
        "| sessions that got exactly theirs | wrong |",
        "|---:|---|---:|---:|---|---:|---:|---:|",
        f"| {count} | {mib(base)} → {mib(opened)} → {mib(held)} | {streams['kb_per_stream']:.2f} "
        f"| {streams['kb_per_session_with_stream']:.2f} | {opened['fds']} → {held['fds']} "
        f"| {held['upstream_connections']} ({held['upstream_listens_open']}) "
        f"| {streams['received_exactly_what_they_subscribed_to']}/{count} | {streams['wrong']} |",
        "",
        "KB per stream = (streams - sessions) RSS / N; KB per session with its stream = (subscribed - base) "
        "RSS / N, the session, its stream and its subscription. A session got exactly its own when it "
        "received the upstream's list changes and its own resource's update, in order.",
        "",
    ]


def added(row: Row, base: Row | None) -> list[str]:
    """The added p50@1, p99@1, p50@32 and p99@32 of `row` over `base` (its baseline), in ms."""
    if base is None or base.c1 is None or base.c32 is None or row.c1 is None or row.c32 is None:
        return ["—"] * 4
    suffix = "" if row.baseline == "a" else f" vs ({row.baseline})"
    pairs = (
        (row.c1.p50_ms, base.c1.p50_ms, 3),
        (row.c1.p99_ms, base.c1.p99_ms, 3),
        (row.c32.p50_ms, base.c32.p50_ms, 2),
        (row.c32.p99_ms, base.c32.p99_ms, 2),
    )
    return [f"{mine - theirs:+.{digits}f}{suffix}" for mine, theirs, digits in pairs]


def judge(rows: dict[str, Row], mem: dict[str, Any] | None, streams: dict[str, Any] | None = None) -> list[str]:
    out: list[str] = []

    def verdict(ok: bool) -> str:
        return "**met**" if ok else "**not met**"

    b = rows.get("b")
    a = rows.get("a")
    for key in ("c", "d", "e"):
        row = rows.get(key)
        if row is None:
            continue
        if b is not None and b.c32 and row.c32:
            ratio = row.c32.rps / b.c32.rps
            out.append(
                f"({key}) rps@32 ≥ 80% of (b): {row.c32.rps:.0f} vs {b.c32.rps:.0f} = {100 * ratio:.0f}% "
                f"→ {verdict(ratio >= 0.8)}"
            )
        if a is not None and a.c1 and row.c1:
            added = row.c1.p50_ms - a.c1.p50_ms
            out.append(f"({key}) added p50@1 < 0.3 ms: {added:.3f} ms → {verdict(added < 0.3)}")
        if b is not None and b.cpu32 and row.cpu32 is not None:
            ratio = row.cpu32 / b.cpu32
            at1 = f"{row.cpu1 / b.cpu1:.2f}x" if b.cpu1 and row.cpu1 is not None else "—"
            out.append(
                f"({key}) CPU/req@32 ≤ 1.25x (b): {row.cpu32:.0f} vs {b.cpu32:.0f} µs = {ratio:.2f}x "
                f"(@1: {cpu_text(row.cpu1)} vs {cpu_text(b.cpu1)} µs = {at1}) → {verdict(ratio <= 1.25)}"
            )
    f = rows.get("f")
    if f is not None and a is not None and f.c1 and f.c32 and a.c1 and a.c32:
        ok = f.c32.rps > a.c32.rps and f.c32.p50_ms < a.c32.p50_ms and f.c1.p50_ms < a.c1.p50_ms
        out.append(
            f"(f) faster than (a): rps@32 {f.c32.rps:.0f} vs {a.c32.rps:.0f}, p50@32 {f.c32.p50_ms:.2f} vs "
            f"{a.c32.p50_ms:.2f} ms, p50@1 {f.c1.p50_ms:.3f} vs {a.c1.p50_ms:.3f} ms → {verdict(ok)}"
        )
    g = rows.get("g")
    bridges = [(name, rows[k]) for k, name in (("g-mcp", "mcp-proxy"), ("g-supergateway", "supergateway")) if k in rows]
    if g is not None and g.c32 and bridges:
        ok = all(g.c32.rps > r.c32.rps for _, r in bridges if r.c32)
        versus = ", ".join(f"{name} {r.c32.rps:.0f}" for name, r in bridges if r.c32)
        out.append(f"(g) proxy ahead of both peer bridges at rps@32: {g.c32.rps:.0f} vs {versus} → {verdict(ok)}")
    if mem is not None and mem.get("kb_per_session") is not None:
        per = mem["kb_per_session"]
        out.append(f"RSS per idle legacy session < 4 KB: {per:.2f} KB → {verdict(per < 4)}")
    if streams is not None:
        per, count = streams["kb_per_session_with_stream"], streams["sessions"]
        exact = streams["received_exactly_what_they_subscribed_to"]
        out.append(
            f"RSS per legacy session with its GET stream ≤ 20 KB, every notification delivered exactly once: "
            f"{per:.2f} KB, {exact}/{count} → {verdict(per <= 20 and exact == count)}"
        )
    return out


def chart(measured: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in measured if r.c1 and r.c32]
    labels = [r.label.replace(" → ", "\n→ ", 1) for r in rows]
    fig, (left, right, cpu) = plt.subplots(1, 3, figsize=(20, 0.65 * len(rows) + 2), sharey=True)
    positions = range(len(rows))
    height = 0.38
    left.barh([p - height / 2 for p in positions], [r.c1.rps for r in rows], height, label="concurrency 1")
    left.barh([p + height / 2 for p in positions], [r.c32.rps for r in rows], height, label="concurrency 32")
    left.set_xlabel("requests per second")
    left.set_yticks(list(positions), labels, fontsize=8)
    left.invert_yaxis()
    left.legend(loc="lower right")
    left.grid(axis="x", alpha=0.3)
    right.barh([p - height / 2 for p in positions], [r.c1.p50_ms for r in rows], height, label="p50 @1")
    right.barh([p + height / 2 for p in positions], [r.c1.p99_ms for r in rows], height, label="p99 @1")
    right.set_xscale("log")
    right.set_xlabel("latency at concurrency 1 (ms, log scale)")
    right.legend(loc="lower right")
    right.grid(axis="x", alpha=0.3)
    cpu.barh([p - height / 2 for p in positions], [r.cpu1 or 0 for r in rows], height, label="concurrency 1")
    cpu.barh([p + height / 2 for p in positions], [r.cpu32 or 0 for r in rows], height, label="concurrency 32")
    cpu.set_xlabel("CPU µs per request, process under test")
    cpu.legend(loc="lower right")
    cpu.grid(axis="x", alpha=0.3)
    fig.suptitle("mcp-era-proxy benchmark (wrk, 127.0.0.1)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
