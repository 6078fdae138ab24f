"""The real OAuth components of the e2e suite: the authorization server, the protected SDK servers of
both eras, the SDK clients running their own OAuth flow, and a proxy started on a port chosen first
(the protected server must know the proxy's public URL to accept tokens issued for it). Each server
names its own URL in its metadata, so each is told its port (a reserved one; see tests.support.procs).

All of it runs on 127.0.0.1; every process is stopped by its PID (tests.support.procs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.support import peers
from tests.support.procs import Process, on_reserved_port, reserved_port

HOST = "127.0.0.1"
SERVER_SCRIPTS = {"legacy": "oauth_legacy_server.py", "modern": "oauth_modern_server.py"}
CLIENT_SCRIPTS = {"legacy": "oauth_legacy_client.py", "modern": "oauth_modern_client.py"}
# The TypeScript SDK client (tests/peers/fixtures/oauth-client.mjs) in either era.
TS_CLIENTS = {"ts-legacy": "legacy", "ts-modern": "modern"}


def python_for(era: str) -> Path:
    return peers.mcp1_python() if era == "legacy" else peers.mcp2_python()


def metadata_url(resource: str) -> str:
    """RFC 9728 §3.1: the well-known path inserted between the origin and the resource's path."""
    origin, _, path = resource.partition("://")[2].partition("/")
    scheme = resource.partition("://")[0]
    return f"{scheme}://{origin}/.well-known/oauth-protected-resource" + (f"/{path}" if path else "")


@dataclass
class AuthServer:
    issuer: str
    port: int

    def mint(self, **spec: Any) -> str:
        """A token signed by this server (or, with forged=True, by another key under its kid)."""
        request = urllib.request.Request(
            f"http://{HOST}:{self.port}/test/mint",
            data=json.dumps(spec).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            token: str = json.load(reply)["access_token"]
        return token

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{HOST}:{self.port}/test/stats", timeout=10) as reply:
            stats: dict[str, Any] = json.load(reply)
        return stats


@contextmanager
def auth_server(logs: Path, *, user: str = "alice", ttl: int = 3600) -> Iterator[AuthServer]:
    def launch(port: int) -> Process:
        script = str(peers.PEER_SCRIPTS / "oauth_server.py")
        argv = [str(peers.mcp1_python()), script, "--port", str(port), "--user", user, "--ttl", str(ttl)]
        return Process(argv, logs / f"oauth-server-{port}.log")

    with on_reserved_port(launch) as server:
        yield AuthServer(f"http://{HOST}:{server.port}/", server.port)


@contextmanager
def protected_server(
    era: str, issuer: AuthServer, logs: Path, *, audiences: Sequence[str] = (), bad_metadata: bool = False
) -> Iterator[str]:
    """An OAuth-protected SDK server of `era`; it accepts tokens for its own URL and `audiences`."""
    env = {"OAUTH_PEER_AUDIENCES": ",".join(audiences), "OAUTH_PEER_BAD_PRM": "1" if bad_metadata else ""}

    def launch(port: int) -> Process:
        script = str(peers.PEER_SCRIPTS / SERVER_SCRIPTS[era])
        argv = [str(python_for(era)), script, "--port", str(port), "--issuer", issuer.issuer]
        return Process(argv, logs / f"oauth-{era}-server-{port}.log", env, peers.PEER_SCRIPTS)

    with on_reserved_port(launch) as server:
        yield f"http://{HOST}:{server.port}/mcp"


def reserve_proxy_url() -> str:
    """Where a proxy will listen (`proxy`), known before it starts; if that port turns out taken
    when it does, `proxy` raises PortTaken and the caller starts over with another."""
    return f"http://{HOST}:{reserved_port()}/mcp"


@contextmanager
def proxy(url: str, upstream: str, logs: Path, **settings: str) -> Iterator[str]:
    """The proxy CLI listening where `url` says, in front of `upstream`; settings as environment."""
    port = urlsplit(url).port
    assert port is not None
    argv = [sys.executable, "-m", "proxy", "--upstream", upstream, "--listen", f"{HOST}:{port}"]
    env = {f"MCP_ERA_PROXY_{k.upper()}": v for k, v in settings.items()}
    process = Process(argv, proxy_log(logs, url), env, peers.REPO)
    try:
        process.wait_listening(30.0, port=port)
        yield url
    finally:
        process.stop()


def proxy_log(logs: Path, url: str) -> Path:
    """The log file of the proxy `proxy` started at `url`."""
    return logs / f"proxy-oauth-{urlsplit(url).port}.log"


def run_client(era: str, url: str, args: dict[str, Any] | None = None, timeout: float = 45.0) -> dict[str, Any]:
    """One run of the SDK client `era` names (its own OAuth flow, then args["steps"]); its JSON summary.

    "legacy" / "modern": the Python SDK's (every arg); "ts-legacy" / "ts-modern": the TypeScript
    SDK's (steps only; no refresh hooks)."""
    args = args or {}
    env: dict[str, str] | None = None
    if era in TS_CLIENTS:
        script = peers.peers_home() / "fixtures" / "oauth-client.mjs"
        if not script.exists():
            raise peers.PeersMissing(f"{script} not found: run `bash scripts/setup-peers.sh` first")
        argv = ["node", str(script), url, TS_CLIENTS[era], json.dumps(args.get("steps", [{"call": "whoami"}]))]
        env = {**os.environ, **peers.node_env()}
    else:
        argv = [
            str(python_for(era)),
            str(peers.PEER_SCRIPTS / CLIENT_SCRIPTS[era]),
            "--url",
            url,
            "--timeout",
            str(timeout),
            "--args",
            json.dumps(args),
        ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 15, check=False, env=env)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if not lines:
        raise AssertionError(f"{era} client printed nothing (exit {done.returncode}):\n{done.stderr[-3000:]}")
    observed: dict[str, Any] = json.loads(lines[-1])
    observed["_exit"] = done.returncode
    observed["_stderr"] = done.stderr[-3000:]
    return observed


def steps_ok(observed: dict[str, Any]) -> list[dict[str, Any]]:
    """The client's step results, asserting the run and every call succeeded."""
    assert observed["_exit"] == 0 and "error" not in observed, json.dumps(observed, indent=1)[:6000]
    calls = [s for s in observed["steps"] if "call" in s]
    for step in calls:
        assert "error" not in step and not step["isError"], step
    return calls
