"""The command the conformance runner starts for a client scenario when the client under test is a
legacy host plus the proxy: it starts the proxy in front of the runner's server (the URL the runner
appends as the last argument), runs the legacy host (conformance_client.cjs v1) against the proxy,
stops the proxy and exits with the host's status.

    python conformance_through_proxy.py PROXY_LOG URL

The scenario and its context reach the host through the environment the runner sets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from tests.support import peers  # noqa: E402
from tests.support.procs import proxy_listener, serving  # noqa: E402

HOST = Path(__file__).with_name("conformance_client.cjs")


def main(log: str, upstream: str) -> int:
    argv = [sys.executable, "-m", "proxy", "--upstream", upstream, "--listen", "127.0.0.1:0"]
    with serving(argv, Path(log), announced=proxy_listener(), cwd=ROOT) as proxy:
        host = ["node", str(HOST), "v1", f"http://127.0.0.1:{proxy.port}/mcp"]
        done = subprocess.run(host, timeout=60, check=False, env={**os.environ, **peers.node_env()})
        return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[-1]))
