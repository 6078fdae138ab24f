"""The cost of a forwarded retry: a modern client's MRTR retry served by the replica holding the
parked call, against the same retry sent to another replica that forwards it there.

    .venv/bin/python -m bench.forwarding [--rounds 200]

Two proxy CLIs (one secret, each with its internal listener) in front of the mcp==1.30.0 legacy
server (tests/e2e/peers/legacy_server.py, its `elicit` tool; `bash scripts/setup-peers.sh` first).
Each round: `tools/call` on replica A parks the call (input_required), then its retry goes to A
(local) or to B (forwarded), alternately. Only the retry is timed, from sending it to its final
message. Prints the median and p90 of each, and their difference: what the forward adds.
Everything listens on 127.0.0.1; every process started is stopped on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp

from tests.support import peers
from tests.support.modern_client import ModernClient, read_reply
from tests.support.procs import Process, on_reserved_port, reserved_port, serving

SECRET = "bench-forwarding-secret-0123456789"
ANSWER = {"action": "accept", "content": {"name": "Ada"}}


async def _retry_ms(parker: ModernClient, retrier: ModernClient) -> float:
    message, response = await parker.send("tools/call", _call())
    reply = await read_reply(response, message)
    result = reply.result
    assert result["resultType"] == "input_required", result
    [key] = result["inputRequests"]
    params = {**_call(), "inputResponses": {key: ANSWER}, "requestState": result["requestState"]}
    started = time.perf_counter()
    message, response = await retrier.send("tools/call", params)
    final = await read_reply(response, message)
    elapsed = (time.perf_counter() - started) * 1000
    assert final.result["resultType"] == "complete", final.messages
    return elapsed


def _call() -> dict[str, Any]:
    return {"name": "elicit", "arguments": {"message": "who?"}}


async def measure(a_url: str, b_url: str, rounds: int) -> dict[str, list[float]]:
    timings: dict[str, list[float]] = {"local": [], "forwarded": []}
    async with (
        aiohttp.ClientSession(base_url=a_url) as a_http,
        aiohttp.ClientSession(base_url=b_url) as b_http,
    ):
        # ModernClient posts to "/mcp" on its client: a ClientSession with a base URL is one.
        a, b = ModernClient(a_http), ModernClient(b_http)  # type: ignore[arg-type]
        for _ in range(10):  # warm-up: sessions pooled, connections open, code paths hot
            await _retry_ms(a, a)
            await _retry_ms(a, b)
        for _ in range(rounds):
            timings["local"].append(await _retry_ms(a, a))
            timings["forwarded"].append(await _retry_ms(a, b))
    return timings


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="bench-forwarding-"))
    with ExitStack() as stack:
        server = [str(peers.mcp1_python()), str(peers.PEER_SCRIPTS / "legacy_server.py"), "--port", "0"]
        upstream = stack.enter_context(serving(server, logs / "legacy-server.log")).port
        urls = []
        for name in ("a", "b"):

            def launch(public: int, name: str = name) -> Process:
                argv = [sys.executable, "-m", "proxy", "--upstream", f"http://127.0.0.1:{upstream}/mcp"]
                argv += ["--listen", f"127.0.0.1:{public}", "--upstream-era", "legacy", "--log-level", "warning"]
                env = {
                    "MCP_ERA_PROXY_SECURITY__SECRET": SECRET,
                    "MCP_ERA_PROXY_REPLICAS__INTERNAL_LISTEN": f"127.0.0.1:{reserved_port()}",  # told to the other
                }
                return Process(argv, logs / f"proxy-{name}-{public}.log", env, peers.REPO)

            proxy = stack.enter_context(on_reserved_port(launch))
            urls.append(f"http://127.0.0.1:{proxy.port}")
        timings = asyncio.run(measure(urls[0], urls[1], args.rounds))
    local, forwarded = timings["local"], timings["forwarded"]
    print(f"retries: {len(local)} local, {len(forwarded)} forwarded (logs in {logs})")
    for name, values in timings.items():
        print(f"{name:>9}: median {statistics.median(values):7.2f} ms   p90 {_p90(values):7.2f} ms")
    added = statistics.median(forwarded) - statistics.median(local)
    print(f"the forward adds {added:.2f} ms at the median")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
