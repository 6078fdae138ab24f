"""The real upstream peers, started once per test session and shared by tests/e2e and tests/replicas
(registered in tests/conftest.py): the conformance fixture in modern-only and legacy-only mode, the
mcp==2.3.0 modern-only server and the mcp==1.30.0 legacy server. Each listens on 127.0.0.1 only and
is stopped at the end of the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import peers
from tests.support.procs import free_port, listening


@pytest.fixture(scope="session")
def logs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e-logs")


@pytest.fixture(scope="session")
def fixture_modern(logs_dir: Path) -> Iterator[str]:
    """The conformance fixture server in modern-only mode (2026-07-28)."""
    port = free_port()
    with listening(["bash", str(peers.peer_sh()), "fixture-modern", str(port)], port, logs_dir / "fixture-modern.log"):
        yield f"http://127.0.0.1:{port}/mcp"


@pytest.fixture(scope="session")
def modern_server(logs_dir: Path) -> Iterator[str]:
    """A modern-only server built on mcp==2.3.0 (legacy requests rejected in front of it)."""
    port = free_port()
    argv = [str(peers.mcp2_python()), str(peers.PEER_SCRIPTS / "modern_server.py"), "--port", str(port)]
    with listening(argv, port, logs_dir / "modern-server.log"):
        yield f"http://127.0.0.1:{port}/mcp"


@pytest.fixture(scope="session")
def fixture_legacy(logs_dir: Path) -> Iterator[str]:
    """The conformance fixture server in legacy-only mode (2025-11-25, sessions)."""
    port = free_port()
    with listening(["bash", str(peers.peer_sh()), "fixture-legacy", str(port)], port, logs_dir / "fixture-legacy.log"):
        yield f"http://127.0.0.1:{port}/mcp"


@pytest.fixture(scope="session")
def legacy_server(logs_dir: Path) -> Iterator[str]:
    """A legacy-only server built on mcp==1.30.0."""
    port = free_port()
    argv = [str(peers.mcp1_python()), str(peers.PEER_SCRIPTS / "legacy_server.py"), "--port", str(port)]
    with listening(argv, port, logs_dir / "legacy-server.log"):
        yield f"http://127.0.0.1:{port}/mcp"
