"""Run the official conformance runner against every pairing the proxy serves, and against the
peers (and two peer bridges) directly, in one run; print a markdown table of required scenarios
passed. Not a test: a measurement to quote (README, release notes).

    .venv/bin/python -m bench.conformance_matrix [--out bench/results/conformance-matrix.md]
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.support import peers
from tests.support.procs import serving

REQUIREMENTS = ("2025-11-25", "2026-07-28")
EXPECTED_FAILURES = peers.REPO / "tests" / "conformance-expected-failures-2026-07-28.yml"


def required(requirements: str) -> set[str]:
    listing = subprocess.run(
        [str(peers.conformance_bin()), "list", "--server", "--requirements", requirements],
        capture_output=True,
        text=True,
        env=peers.node_env(),
        check=True,
        timeout=60,
    ).stdout
    part = listing.split("Server scenarios", 1)[1].split("Client scenarios", 1)[0]
    return set(re.findall(r"^\s+- (\S+)", part, re.MULTILINE))


def run(url: str, requirements: str, scored: set[str]) -> str:
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(
            [str(peers.conformance_bin()), "server", "--url", url, "--requirements", requirements, "-o", out],
            capture_output=True,
            text=True,
            env=peers.node_env(),
            timeout=900,
            check=False,
        )
    results = {
        m[1]: int(m[3]) == 0 for m in re.finditer(r"^[✓✗] (\S+): (\d+) passed, (\d+) failed", done.stdout, re.MULTILINE)
    }
    passed = sum(1 for name in scored if results.get(name))
    return f"{passed}/{len(scored)}"


@contextlib.contextmanager
def peer(name: str, logs: Path, *args: str, label: str | None = None) -> Iterator[str]:
    argv = ["bash", str(peers.peer_sh()), name, "0", *args]
    with serving(argv, logs / f"{label or name}.log", timeout=60) as process:
        yield f"http://127.0.0.1:{process.port}/mcp"


@contextlib.contextmanager
def proxy(
    logs: Path, label: str, *, url: str | None = None, command: str | None = None, sse: str | None = None
) -> Iterator[str]:
    if sse:
        target = ["--upstream-sse", sse]
    else:
        target = ["--upstream", url] if url else ["--upstream-command", str(command)]
    argv = [sys.executable, "-m", "proxy", *target, "--listen", "127.0.0.1:0", "--log-level", "warning"]
    with serving(argv, logs / f"proxy-{label}.log", timeout=60) as process:  # its one listener
        yield f"http://127.0.0.1:{process.port}/mcp"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=peers.REPO / "bench" / "results" / "conformance-matrix.md")
    args = parser.parse_args()
    scored = {r: required(r) for r in REQUIREMENTS}
    rows: list[tuple[str, ...]] = []
    peer_sh = str(peers.peer_sh())
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)

        def measure(label: str, url: str) -> None:
            rows.append((label, *(run(url, r, scored[r]) for r in REQUIREMENTS)))
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)

        for name in ("fixture-modern", "fixture-legacy", "fixture-dual", "everything-http"):
            with peer(name, logs) as url:
                measure(f"{name} (direct)", url)
                with proxy(logs, name, url=url) as proxied:
                    measure(f"mcp-era-proxy → {name} (era detected)", proxied)
        with proxy(logs, "fixture-stdio", command=shlex.join(["bash", peer_sh, "fixture-stdio"])) as proxied:
            measure("mcp-era-proxy → fixture over stdio (started by the proxy)", proxied)
        with proxy(logs, "everything-stdio", command=shlex.join(["bash", peer_sh, "everything-stdio"])) as proxied:
            measure("mcp-era-proxy → server-everything over stdio (started by the proxy)", proxied)
        with (
            peer("everything-sse", logs) as url,
            proxy(logs, "everything-sse", sse=url[: -len("/mcp")] + "/sse") as proxied,
        ):
            measure("mcp-era-proxy → server-everything over HTTP+SSE (2024-11-05, --upstream-sse)", proxied)
        for bridge in ("mcp-proxy-fixture", "supergateway-fixture"):
            with peer(bridge, logs) as url:
                measure(f"{bridge} (peer bridge: fixture over stdio)", url)
        # The stdio bridge behind a real stdio-to-HTTP gateway (the runner drives HTTP only).
        bridge = [str(Path(sys.executable).with_name("mcp-era-proxy")), "stdio", "--log-level", "warning"]
        for name in ("fixture-modern", "fixture-legacy"):
            with peer(name, logs) as url:
                command = shlex.join([*bridge, "--upstream", url])
                with peer("supergateway-command", logs, command, label=f"supergateway-bridge-{name}") as gateway:
                    measure(f"supergateway-command → mcp-era-proxy stdio → {name}", gateway)
    table = ["| target | 2025-11-25 required | 2026-07-28 required |", "|---|---|---|"]
    table += [f"| {' | '.join(row)} |" for row in rows]
    text = "\n".join(table) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
