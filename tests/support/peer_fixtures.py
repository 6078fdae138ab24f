"""The real upstream peers, started once per test session and shared by tests/e2e and tests/replicas
(registered in tests/conftest.py): the conformance fixture in modern-only and legacy-only mode, the
mcp==2.3.0 modern-only server, the mcp==1.30.0 legacy server and the 2025-11-25 task-tools fixture
(tests/peers/fixtures/legacy-tasks-fixture.mjs). Each listens on 127.0.0.1 only and is stopped at
the end of the session."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support import peers
from tests.support.procs import serving


@pytest.fixture(scope="session")
def logs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e-logs")


@pytest.fixture(scope="session")
def fixture_modern(logs_dir: Path) -> Iterator[str]:
    """The conformance fixture server in modern-only mode (2026-07-28)."""
    with serving(["bash", str(peers.peer_sh()), "fixture-modern", "0"], logs_dir / "fixture-modern.log") as peer:
        yield f"http://127.0.0.1:{peer.port}/mcp"


@pytest.fixture(scope="session")
def modern_server(logs_dir: Path) -> Iterator[str]:
    """A modern-only server built on mcp==2.3.0 (legacy requests rejected in front of it)."""
    argv = [str(peers.mcp2_python()), str(peers.PEER_SCRIPTS / "modern_server.py"), "--port", "0"]
    with serving(argv, logs_dir / "modern-server.log") as peer:
        yield f"http://127.0.0.1:{peer.port}/mcp"


@pytest.fixture(scope="session")
def fixture_legacy(logs_dir: Path) -> Iterator[str]:
    """The conformance fixture server in legacy-only mode (2025-11-25, sessions)."""
    with serving(["bash", str(peers.peer_sh()), "fixture-legacy", "0"], logs_dir / "fixture-legacy.log") as peer:
        yield f"http://127.0.0.1:{peer.port}/mcp"


@pytest.fixture(scope="session")
def legacy_server(logs_dir: Path) -> Iterator[str]:
    """A legacy-only server built on mcp==1.30.0."""
    argv = [str(peers.mcp1_python()), str(peers.PEER_SCRIPTS / "legacy_server.py"), "--port", "0"]
    with serving(argv, logs_dir / "legacy-server.log") as peer:
        yield f"http://127.0.0.1:{peer.port}/mcp"


@contextmanager
def legacy_tasks_server(log: Path, **env: str) -> Iterator[str]:
    """The 2025-11-25 task-tools fixture (SDK v1) until the block ends: its URL. `env` reaches it
    as environment, e.g. FAILING_JOB_TASK_SUPPORT="optional"."""
    with serving(["bash", str(peers.peer_sh()), "legacy-tasks", "0"], log, env=env) as peer:
        yield f"http://127.0.0.1:{peer.port}/mcp"


@pytest.fixture(scope="session")
def legacy_tasks(logs_dir: Path) -> Iterator[str]:
    """The 2025-11-25 task-tools fixture: the tools the runner's tasks-* scenarios call, as legacy tasks."""
    with legacy_tasks_server(logs_dir / "legacy-tasks.log") as url:
        yield url


def legacy_tasks_counts(url: str) -> dict[str, Any]:
    """The task-tools fixture's counters (tasks created, cancelled by tasks/cancel, calls cancelled)."""
    with urllib.request.urlopen(url.removesuffix("/mcp") + "/counts", timeout=5) as response:
        counts: dict[str, Any] = json.load(response)
    return counts
