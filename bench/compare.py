"""Two revisions of the proxy in one run, interleaved on the same upstreams: CPU µs per request before
and after.

    python -m bench.compare --before REV [--after REV|worktree] [--rows c,d,e] [--duration 3] [--repeat 5]
                            [--profile]

Row by row (the rows of bench/run.py: c, d, d-store, e; b as a control), both proxies run at once in
front of the same upstream: one of REV's code, checked out with `git worktree add --detach` into a
temporary directory (removed at the end, on failure and on Ctrl-C too) and started with this
interpreter from there (PYTHONPATH on it: the dependencies are this virtualenv's), and one of the
other revision's (default: this checkout as it is, uncommitted changes included). Each is checked
with one real request and warmed up; then the wrk runs alternate, before, after, after, before...
(the side going first swaps every round), `--repeat` times, so both see the same machine load. CPU
µs/req is the proxy process's utime + stime across each run over the requests it completed (as in
bench/run.py): median, min and max of the runs per side, and after/before. Row (b) runs this
checkout's bare hop on both sides: its ratio is what the machine's noise alone gives. Output: the
table on stdout, bench/results/compare.md (revisions, date, load average at start and end) and
compare-runs.json (every run). With `--profile`, each side's proxy (not the control's hop) is
sampled by py-spy during one extra, unrecorded @32 run after a row's runs, and both summaries (self
time by package, the top 15 frames by self time, the proxy's functions) go into compare.md. The
whole run is bounded (`--timeout`); every process it starts is
stopped by its pid."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from bench import servers
from bench.calls import expect_echo, legacy_call, legacy_session, modern_call
from bench.harness import BENCH, REPO, Processes, begin, machine, say
from bench.load import Load, wrk
from bench.profile import finish_profile, start_profile
from bench.report import cpu_text
from tests.support.procs import reserved_port

SIDES = ("before", "after")
STORE_SECRET = "bench-compare-" + "s" * 24


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    upstream: str  # the era of bench/upstream.py in front of which the proxy runs
    client: str  # 'modern' (no session) or 'legacy' (one initialized session per proxy)
    store: bool = False  # sessions on a redis-server of our own
    control: bool = False  # this checkout's bare hop on both sides instead of the two proxies


SCENARIOS = {
    s.key: s
    for s in (
        Scenario("b", "(b) bare aiohttp hop, same code both sides (control)", "modern", "modern", control=True),
        Scenario("c", "(c) modern → modern (pass-through)", "modern", "modern"),
        Scenario("d", "(d) legacy client → modern (translated)", "modern", "legacy"),
        Scenario("d-store", "(d-store) the same, sessions on Redis", "modern", "legacy", store=True),
        Scenario("e", "(e) modern client → legacy (translated)", "legacy", "modern"),
    )
}


@dataclass
class Side:
    name: str  # 'before' or 'after'
    label: str  # what it is: the revision asked for, its commit and subject
    tree: Path  # the checkout its proxy is started from


@dataclass
class Measured:
    scenario: Scenario
    connections: int
    runs: dict[str, list[Load]] = field(default_factory=lambda: {side: [] for side in SIDES})


# ---------------------------------------------------------------- revisions


def git(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def commit_line(rev: str) -> str:
    """'abc1234 subject' of a commit, cut to 80 characters."""
    line = git("log", "-1", "--format=%h %s", rev)
    return line if len(line) <= 80 else line[:79] + "…"


def describe(rev: str) -> tuple[str, str]:
    """(full commit id, 'REV = abc1234 subject') of a revision; RuntimeError if it is none."""
    sha = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    return sha, f"`{rev}` = {commit_line(sha)}"


def this_checkout() -> str:
    head = commit_line("HEAD")
    dirty = git("status", "--porcelain", "--", "proxy")
    return f"this checkout, HEAD = {head}" + (" **+ uncommitted changes in proxy/**" if dirty else "")


@contextlib.contextmanager
def checked_out(rev: str) -> Iterator[tuple[Path, str]]:
    """REV in a detached worktree of a temporary directory, removed when the block ends (also on an
    exception, Ctrl-C or SIGTERM); (its path, what it is)."""
    sha, label = describe(rev)
    parent = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    tree = parent / sha[:12]
    try:
        git("worktree", "add", "--detach", str(tree), sha)
        say(f"{rev} checked out in {tree}")
        yield tree, label
    finally:
        signal.alarm(0)  # the run's bound ends here: the clean-up is bounded by its own timeouts
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave it behind
        try:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                git("worktree", "remove", "--force", str(tree), timeout=60)
            shutil.rmtree(parent, ignore_errors=True)
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                git("worktree", "prune", timeout=60)
        finally:
            signal.signal(signal.SIGINT, previous)


def comparing_parser(module: str, doc: str, example: str) -> argparse.ArgumentParser:
    """The command line of a harness that compares two revisions (`python -m MODULE`, the first line
    of its docstring, an example): --before REV and --after REV|worktree, the rest its own."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {module}", description=doc.split("\n")[0], epilog=f"Example: python -m {module} {example}"
    )
    parser.add_argument(
        "--before", required=True, metavar="REV", help="revision measured as 'before' (checked out in a temp dir)"
    )
    parser.add_argument(
        "--after",
        default="worktree",
        metavar="REV|worktree",
        help="revision measured as 'after', or 'worktree' (default): this checkout",
    )
    return parser


def sides_of(stack: ExitStack, before: str, after: str) -> dict[str, Side]:
    """The two sides: `before` checked out, and `after` too, or this checkout for 'worktree'; the
    checkouts are removed when `stack` closes."""
    before_tree, before_label = stack.enter_context(checked_out(before))
    if after == "worktree":
        after_tree, after_label = REPO, this_checkout()
    else:
        after_tree, after_label = stack.enter_context(checked_out(after))
    return {"before": Side("before", before_label, before_tree), "after": Side("after", after_label, after_tree)}


def imports_from(tree: Path) -> Path:
    """Where a process started as the proxy of `tree` is would import `proxy` from (it must be `tree`)."""
    done = subprocess.run(
        [sys.executable, "-c", "import proxy; print(proxy.__file__)"],
        capture_output=True,
        text=True,
        cwd=tree,
        env={**os.environ, **servers.tree_env(tree)},
        timeout=60,
        check=True,
    )
    found = Path(done.stdout.strip()).resolve()
    if not found.is_relative_to(tree.resolve()):
        raise RuntimeError(f"started from {tree}, the proxy would be imported from {found}")
    return found


# ---------------------------------------------------------------- measuring


class Compare:
    def __init__(self, args: argparse.Namespace, procs: Processes, sides: dict[str, Side]) -> None:
        self.args = args
        self.procs = procs
        self.sides = sides
        self.results: list[Measured] = []
        self.profiles: dict[str, list[str]] = {}  # 'row side': py-spy summary (--profile)

    def run(self) -> None:
        with ExitStack() as shared:
            upstreams: dict[str, str] = {}
            store: list[str] = []
            for key in self.args.rows:
                scenario = SCENARIOS[key]
                if scenario.upstream not in upstreams:
                    url, _ = shared.enter_context(servers.upstream(self.procs, scenario.upstream))
                    upstreams[scenario.upstream] = url
                if scenario.store and not store:
                    store.append(shared.enter_context(servers.redis(self.procs)))
                self.row(scenario, upstreams[scenario.upstream], store[0] if store else None)

    def row(self, scenario: Scenario, upstream: str, store: str | None) -> None:
        say(f"{scenario.title}: before and after side by side in front of {upstream}")
        with ExitStack() as stack:
            targets: dict[str, tuple[str, int, dict[str, str]]] = {}  # side: (url, pid, wrk env)
            for name, side in self.sides.items():
                if scenario.control:
                    url, pid = stack.enter_context(servers.bare_hop(self.procs, upstream, f"bare-hop-{name}"))
                else:
                    env = None
                    if scenario.store and store is not None:
                        env = {"MCP_ERA_PROXY_STORE__URL": store, "MCP_ERA_PROXY_SECURITY__SECRET": STORE_SECRET}
                    url, pid = stack.enter_context(
                        servers.proxy(
                            self.procs,
                            f"{scenario.key}-{name}",
                            url=upstream,
                            era=scenario.upstream,
                            env=env,
                            tree=side.tree,
                            port=reserved_port(),  # an older tree may not take port 0
                        )
                    )
                wrk_env: dict[str, str] = {}
                if scenario.client == "legacy":
                    session = legacy_session(url)
                    expect_echo(f"({scenario.key} {name})", *legacy_call(url, session))
                    wrk_env["BENCH_SESSION"] = session
                else:
                    expect_echo(f"({scenario.key} {name})", *modern_call(url))
                targets[name] = (url, pid, wrk_env)
            script = "legacy_tools_call.lua" if scenario.client == "legacy" else "modern_tools_call.lua"
            for name in SIDES:  # warm-up, unrecorded
                url, _, wrk_env = targets[name]
                wrk(url, script, 32, 2, self.args.warmup, wrk_env)
            measured = {c: Measured(scenario, c) for c in self.args.connections}
            for index in range(self.args.repeat):
                for connections in self.args.connections:
                    # ABBA: the side that goes first swaps every round, so a drift of the machine
                    # (or a cost of going second) falls on both sides alike.
                    for name in SIDES if index % 2 == 0 else tuple(reversed(SIDES)):
                        url, pid, wrk_env = targets[name]
                        threads = 1 if connections == 1 else 2
                        load = wrk(url, script, connections, threads, self.args.duration, wrk_env, pid)
                        measured[connections].runs[name].append(load)
                        say(
                            f"  {scenario.key} @{connections} run {index + 1}/{self.args.repeat} {name}: "
                            f"{load.rps:.0f} rps, CPU {cpu_text(load.cpu_us)} µs/req, {load.errors} errors"
                        )
            self.results.extend(measured.values())
            if self.args.profile and not scenario.control:
                for name in SIDES:  # an extra, unrecorded @32 run per side: sampling must not skew the runs
                    url, pid, wrk_env = targets[name]
                    key = f"compare-{scenario.key}-{name}"
                    profiler = start_profile(self.args.out, key, pid, self.args.duration)
                    wrk(url, script, 32, 2, self.args.duration, wrk_env)
                    if (summary := finish_profile(key, profiler)) is not None:
                        self.profiles[f"{scenario.key} {name}"] = summary


# ---------------------------------------------------------------- report


def cpu_values(loads: list[Load]) -> list[float]:
    return sorted(load.cpu_us for load in loads if load.cpu_us is not None)


def middle(values: list[float]) -> float | None:
    """The median (the mean of the middle two for an even count); None for no values."""
    if not values:
        return None
    values = sorted(values)
    half = len(values) // 2
    return values[half] if len(values) % 2 else (values[half - 1] + values[half]) / 2


def ratio(after: float | None, before: float | None) -> str:
    return "—" if after is None or not before else f"{after / before:.3f}"


def cpu_cell(values: list[float]) -> str:
    if not values:
        return "—"
    return f"{cpu_text(middle(values))} ({values[0]:.0f}..{values[-1]:.0f})"


def load_text(load: tuple[float, float, float]) -> str:
    """A load average (1/5/15 min) as the reports write it."""
    return " / ".join(f"{x:.2f}" for x in load)


def report_head(
    title: str, sides: dict[str, Side], facts: dict[str, str], started: float, loads: tuple[Any, Any]
) -> list[str]:
    """A report's title and what it compared: both sides, when, the machine's load and facts."""
    return [
        f"# {title}",
        "",
        f"- **before**: {sides['before'].label}",
        f"- **after**: {sides['after'].label}",
        f"- **date**: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, {time.time() - started:.0f} s",
        f"- **load average** (1/5/15 min): at start {load_text(loads[0])}, at end {load_text(loads[1])}",
        "- **machine**: " + ", ".join(f"{k} {v}" for k, v in facts.items()),
        "",
    ]


def render(
    results: list[Measured],
    sides: dict[str, Side],
    args: argparse.Namespace,
    facts: dict[str, str],
    started: float,
    loads: tuple[tuple[float, float, float], tuple[float, float, float]],
    profiles: dict[str, list[str]],
) -> str:
    lines = [
        *report_head("mcp-era-proxy: before against after", sides, facts, started, loads),
        f"`python -m bench.compare --before {args.before} --after {args.after} --rows {','.join(args.rows)} "
        f"--duration {args.duration} --repeat {args.repeat} --connections "
        f"{','.join(str(c) for c in args.connections)}{' --profile' if args.profile else ''}`: "
        "both proxies up at once in front of the same upstream, "
        f"after a {args.warmup} s warm-up each; {args.repeat} wrk run(s) of {args.duration} s per side, alternating "
        "before, after, after, before... (the first side swaps every round). "
        "CPU µs/req: utime + stime of the proxy process over the requests wrk "
        "completed in each run, median (min..max) of the runs; after/before of the medians and of the minima. "
        "rps: median of the runs."
        + (
            " (b) is the same bare hop on both sides: its ratio is the noise of the machine."
            if "b" in args.rows
            else ""
        ),
        "",
        "| row | conns | CPU µs/req before | CPU µs/req after | after/before (median) | after/before (min) "
        "| rps before | rps after | rps after/before | wrk errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for item in results:
        before, after = item.runs["before"], item.runs["after"]
        cb, ca = cpu_values(before), cpu_values(after)
        rb, ra = middle([x.rps for x in before]), middle([x.rps for x in after])
        errors = sum(x.errors for x in before + after)
        lines.append(
            f"| {item.scenario.title} | {item.connections} | {cpu_cell(cb)} | {cpu_cell(ca)} "
            f"| {ratio(middle(ca), middle(cb))} | {ratio(ca[0] if ca else None, cb[0] if cb else None)} "
            f"| {rb or 0:.0f} | {ra or 0:.0f} | {ratio(ra, rb)} | {errors or ''} |"
        )
    if profiles:
        lines += [
            "",
            f"## Profiles (py-spy, proxy process, one extra unrecorded {args.duration} s run @32 per side)",
            "",
            "Self time by package, the top 15 frames by self time, then the proxy's own functions by "
            "inclusive time; raw stacks in `profile-compare-<row>-<side>.txt`.",
            "",
        ]
        for key, summary in profiles.items():
            row, side = key.split(" ")
            lines += [f"**({row}) {side}**: {sides[side].label}", "```", *summary, "```", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- command line


def rows_of(known: Collection[str]) -> Callable[[str], list[str]]:
    """The --rows parser of a harness whose rows are `known`: a comma-separated list of them."""

    def row_list(text: str) -> list[str]:
        rows = [row.strip() for row in text.split(",") if row.strip()]
        unknown = [row for row in rows if row not in known]
        if unknown or not rows:
            raise argparse.ArgumentTypeError(f"rows are some of {','.join(known)}; not {','.join(unknown) or text!r}")
        return list(dict.fromkeys(rows))

    return row_list


row_list = rows_of(SCENARIOS)


def connection_list(text: str) -> list[int]:
    try:
        values = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"connections are positive integers, e.g. 32 or 1,32; not {text!r}")
    return values


def budget(args: argparse.Namespace) -> int:
    """Seconds the run may take before it is stopped: three times what it should, plus start-up."""
    per_row: int = 2 * (args.warmup + 15) + args.repeat * 2 * len(args.connections) * (args.duration + 2)
    if args.profile:
        per_row += 2 * (args.duration + 30)
    return 180 + 3 * len(args.rows) * per_row


def timed_out(_signum: int, _frame: FrameType | None) -> None:
    raise TimeoutError(f"{sys.argv[0]} ran past its --timeout")


def main() -> int:
    try:
        return compare_main()
    except KeyboardInterrupt:
        say("interrupted: every process it started is stopped, the checkout removed")
        return 130


def compare_main() -> int:
    parser = comparing_parser("bench.compare", __doc__, "--before main --rows c,d,e --repeat 5")
    parser.add_argument(
        "--rows",
        type=row_list,
        default=["c", "d", "e"],
        metavar="ROWS",
        help=f"some of {','.join(SCENARIOS)} (default c,d,e)",
    )
    parser.add_argument("--duration", type=int, default=3, metavar="S", help="seconds per wrk run (default 3)")
    parser.add_argument(
        "--repeat", type=int, default=5, metavar="N", help="wrk runs per side and row, interleaved (default 5)"
    )
    parser.add_argument(
        "--warmup", type=int, default=1, metavar="S", help="seconds of unrecorded load per proxy first (default 1)"
    )
    parser.add_argument(
        "--connections",
        type=connection_list,
        default=[32],
        metavar="LIST",
        help="wrk connections, e.g. 1,32 (default 32)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the runs, py-spy each side's proxy during one extra @32 run; summaries in compare.md",
    )
    parser.add_argument(
        "--timeout", type=int, default=0, metavar="S", help="stop after this many seconds (default: 3x expected)"
    )
    parser.add_argument(
        "--out", type=Path, default=BENCH / "results", metavar="DIR", help="where compare.md goes (bench/results)"
    )
    args = parser.parse_args()
    if args.duration < 1 or args.repeat < 1 or args.warmup < 1:
        parser.error("--duration, --repeat and --warmup are at least 1")
    if shutil.which("wrk") is None:
        parser.error("wrk is not installed (apt-get install wrk, or bash bench/run.sh once)")
    limit = args.timeout or budget(args)
    signal.signal(signal.SIGALRM, timed_out)
    signal.alarm(limit)
    load_start = os.getloadavg()
    logs, procs, started, facts = begin(args.out, machine)
    say(f"load average at start {load_start}; stopping after {limit} s at the latest")
    compare: Compare | None = None
    try:
        with ExitStack() as trees:
            sides = sides_of(trees, args.before, args.after)
            for side in sides.values():
                say(f"{side.name}: {side.label}; proxy imported from {imports_from(side.tree)}")
            compare = Compare(args, procs, sides)
            try:
                compare.run()
            finally:
                procs.stop_all()
    finally:
        signal.alarm(0)
        procs.stop_all()
    load_end = os.getloadavg()
    assert compare is not None
    text = render(compare.results, compare.sides, args, facts, started, (load_start, load_end), compare.profiles)
    (args.out / "compare.md").write_text(text + "\n")
    runs: dict[str, Any] = {
        f"{item.scenario.key}@{item.connections}": {
            side: [
                {
                    "requests": x.requests,
                    "rps": round(x.rps),
                    "cpu_us": x.cpu_us,
                    "p50_ms": x.p50_ms,
                    "errors": x.errors,
                }
                for x in item.runs[side]
            ]
            for side in SIDES
        }
        for item in compare.results
    }
    (args.out / "compare-runs.json").write_text(json.dumps(runs, indent=1) + "\n")
    print(text)
    say(f"done in {time.time() - started:.0f} s: {args.out / 'compare.md'}; logs in {logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
