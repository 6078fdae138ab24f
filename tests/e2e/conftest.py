"""Real peers for end-to-end tests: npm fixtures, Python SDK servers and clients, the proxy CLI.

Peers are started once per test session; proxies with special settings per test. Nothing
listens anywhere but 127.0.0.1, and every process is stopped at teardown.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

from tests.support import peers
from tests.support.procs import proxy_listener, serving

pytestmark = pytest.mark.e2e


ProxyFactory = Callable[..., AbstractContextManager[str]]
# The log file of each proxy started by `start_proxy`, by its URL (read by tests that check logs).
PROXY_LOGS: dict[str, Path] = {}


@pytest.fixture(scope="session")
def start_proxy(logs_dir: Path) -> ProxyFactory:
    """Start the proxy CLI in front of an upstream; extra settings come as environment."""
    counter = iter(range(1_000_000))

    @contextmanager
    def start(
        upstream: str | None = None, *, command: str | None = None, sse: str | None = None, **env: str
    ) -> Iterator[str]:
        if sse is not None:
            target = ["--upstream-sse", sse]
        elif upstream is not None:
            target = ["--upstream", upstream]
        else:
            target = ["--upstream-command", str(command)]
        argv = [sys.executable, "-m", "proxy", *target, "--listen", "127.0.0.1:0"]
        environment = {f"MCP_ERA_PROXY_{k.upper()}": v for k, v in env.items()}
        log = logs_dir / f"proxy-{next(counter)}.log"
        with serving(argv, log, env=environment, announced=proxy_listener()) as proxy:
            url = f"http://127.0.0.1:{proxy.port}/mcp"
            PROXY_LOGS[url] = log
            yield url

    return start


@pytest.fixture(scope="session")
def proxy_to_modern_server(start_proxy: ProxyFactory, modern_server: str) -> Iterator[str]:
    with start_proxy(modern_server) as url:
        yield url


@pytest.fixture(scope="session")
def proxy_to_fixture_modern(start_proxy: ProxyFactory, fixture_modern: str) -> Iterator[str]:
    with start_proxy(fixture_modern) as url:
        yield url


@pytest.fixture(scope="session")
def proxy_to_legacy_server(start_proxy: ProxyFactory, legacy_server: str) -> Iterator[str]:
    with start_proxy(legacy_server) as url:  # era detected (auto)
        yield url


@pytest.fixture(scope="session")
def proxy_to_fixture_legacy(start_proxy: ProxyFactory, fixture_legacy: str) -> Iterator[str]:
    with start_proxy(fixture_legacy) as url:  # era detected (auto)
        yield url


def stdio_command(python: Path, script: str) -> str:
    return shlex.join([str(python), str(peers.PEER_SCRIPTS / script), "--stdio"])


@pytest.fixture(scope="session")
def proxy_to_modern_server_stdio(start_proxy: ProxyFactory) -> Iterator[str]:
    """The proxy starting the mcp==2.3.0 modern-only server itself, over stdio."""
    with start_proxy(command=stdio_command(peers.mcp2_python(), "modern_server.py")) as url:
        yield url


@pytest.fixture(scope="session")
def proxy_to_legacy_server_stdio(start_proxy: ProxyFactory) -> Iterator[str]:
    """The proxy starting mcp==1.30.0 legacy servers itself, over stdio (one process per session)."""
    with start_proxy(command=stdio_command(peers.mcp1_python(), "legacy_server.py")) as url:
        yield url


@pytest.fixture(scope="session")
def fixture_dual(logs_dir: Path) -> Iterator[str]:
    """The conformance fixture serving both eras on one endpoint."""
    with serving(["bash", str(peers.peer_sh()), "fixture-dual", "0"], logs_dir / "fixture-dual.log") as peer:
        yield f"http://127.0.0.1:{peer.port}/mcp"


@pytest.fixture(scope="session")
def everything_http(logs_dir: Path) -> Iterator[str]:
    """@modelcontextprotocol/server-everything over Streamable HTTP (legacy), for a direct baseline."""
    with serving(["bash", str(peers.peer_sh()), "everything-http", "0"], logs_dir / "everything-http.log") as peer:
        yield f"http://127.0.0.1:{peer.port}/mcp"


@pytest.fixture(scope="session")
def proxy_to_everything_http(start_proxy: ProxyFactory, everything_http: str) -> Iterator[str]:
    with start_proxy(everything_http) as url:  # era detected (auto)
        yield url


@pytest.fixture(scope="session")
def proxy_to_fixture_dual(start_proxy: ProxyFactory, fixture_dual: str) -> Iterator[str]:
    with start_proxy(fixture_dual) as url:
        yield url


@pytest.fixture(scope="session")
def proxy_to_fixture_stdio(start_proxy: ProxyFactory) -> Iterator[str]:
    """The proxy starting the conformance fixture over stdio (dual-era; the first message decides)."""
    with start_proxy(command=shlex.join(["bash", str(peers.peer_sh()), "fixture-stdio"])) as url:
        yield url


@pytest.fixture(scope="session")
def proxy_to_everything_stdio(start_proxy: ProxyFactory) -> Iterator[str]:
    """The proxy starting server-everything over stdio (legacy)."""
    with start_proxy(command=shlex.join(["bash", str(peers.peer_sh()), "everything-stdio"])) as url:
        yield url


@pytest.fixture(scope="session")
def everything_sse(logs_dir: Path) -> Iterator[str]:
    """@modelcontextprotocol/server-everything over the 2024-11-05 HTTP+SSE transport: its SSE URL."""
    with serving(["bash", str(peers.peer_sh()), "everything-sse", "0"], logs_dir / "everything-sse.log") as peer:
        yield f"http://127.0.0.1:{peer.port}/sse"


@pytest.fixture(scope="session")
def legacy_server_sse(logs_dir: Path) -> Iterator[str]:
    """The mcp==1.30.0 legacy server on the 2024-11-05 HTTP+SSE transport: its SSE URL."""
    argv = [str(peers.mcp1_python()), str(peers.PEER_SCRIPTS / "legacy_server.py"), "--port", "0", "--sse"]
    with serving(argv, logs_dir / "legacy-server-sse.log") as peer:
        yield f"http://127.0.0.1:{peer.port}/sse"


@pytest.fixture(scope="session")
def proxy_to_legacy_server_sse(start_proxy: ProxyFactory, legacy_server_sse: str) -> Iterator[str]:
    """The proxy in front of the mcp 1.30 server over HTTP+SSE (upstream.sse_url)."""
    with start_proxy(sse=legacy_server_sse) as url:
        yield url


@pytest.fixture(scope="session")
def proxy_to_everything_sse(start_proxy: ProxyFactory, everything_sse: str) -> Iterator[str]:
    """The proxy in front of server-everything over HTTP+SSE (upstream.sse_url)."""
    with start_proxy(sse=everything_sse) as url:
        yield url


@pytest.fixture(scope="session")
def tap_factory(logs_dir: Path) -> Callable[..., AbstractContextManager[tuple[str, Path]]]:
    """A recording tap in front of a URL (or of several, in turn): (tap url, record file)."""
    counter = iter(range(1_000_000))

    @contextmanager
    def start(*targets: str) -> Iterator[tuple[str, Path]]:
        n = next(counter)
        record = logs_dir / f"tap-{n}.jsonl"
        argv = [
            sys.executable,
            "-m",
            "tests.support.tap",
            "--port",
            "0",
            *(arg for target in targets for arg in ("--target", target)),
            "--record",
            str(record),
        ]
        with serving(argv, logs_dir / f"tap-{n}.log", cwd=peers.REPO) as tap:
            yield f"http://127.0.0.1:{tap.port}/mcp", record

    return start
