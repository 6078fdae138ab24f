"""Fault injection: upstreams of both eras, over HTTP and stdio, scripted (tests/support/
fault_upstream.py) and real, that die, hang or answer nonsense.

For every fault: the affected caller gets a clear JSON-RPC error (or, for a valid reply the proxy
once refused, the reply) within a bound; a caller beside it is untouched; the proxy serves again
once the upstream does; `upstream_errors_total` and the request log say what happened. Clients of
both eras are tried on each upstream era.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from proxy.protocol import jsonrpc
from tests.e2e.conftest import PROXY_LOGS, ProxyFactory
from tests.support import fault_upstream, legacy_client, modern_client, peers, stdio_server, tally
from tests.support.answers import assert_holds
from tests.support.mcp_client import Endpoint, answer_to, metric
from tests.support.procs import PortTaken, Process, reserved_port, wait_for
from tests.support.raw_http_client import Reply

REPO = Path(__file__).resolve().parents[2]  # fault_upstream runs as a module of the repository
STDIO_SERVER = Path(stdio_server.__file__)
TIMEOUT_S = 4.0  # upstream.request_timeout_s of the proxies here
BOUND_S = TIMEOUT_S + 10.0  # what any faulty call may take, end to end
SETTINGS = {"upstream__request_timeout_s": str(TIMEOUT_S), "upstream__connect_timeout_s": "2"}
ERRORS = "mcp_era_proxy_upstream_errors_total"
REOPENED = "mcp_era_proxy_upstream_sessions_reinitialized_total"

# What each fault must give the caller: an error with one of these codes, or (None) the result.
EXPECTED: dict[str, frozenset[int] | None] = {
    "kill": frozenset({jsonrpc.UPSTREAM_UNAVAILABLE, jsonrpc.UPSTREAM_INVALID}),
    "hang": frozenset({jsonrpc.UPSTREAM_TIMEOUT}),
    "html": frozenset({jsonrpc.UPSTREAM_UNAVAILABLE}),
    "invalid_json": frozenset({jsonrpc.UPSTREAM_INVALID}),
    "not_jsonrpc": frozenset({jsonrpc.UPSTREAM_INVALID}),
    "empty": frozenset({jsonrpc.UPSTREAM_INVALID}),
    "wrong_id": frozenset({jsonrpc.UPSTREAM_INVALID}),
    "truncated_sse": frozenset({jsonrpc.UPSTREAM_UNAVAILABLE, jsonrpc.UPSTREAM_INVALID}),
    "endless_sse": frozenset({jsonrpc.UPSTREAM_TIMEOUT}),
    "truncated_json": frozenset({jsonrpc.UPSTREAM_UNAVAILABLE}),
    "huge": None,
    "split": None,
}
assert set(EXPECTED) == set(fault_upstream.FAULTS)


class Faulty:
    """One scripted upstream process that can be killed and started again on its port (a
    reserved one: tests.support.procs)."""

    START_S = 30.0

    def __init__(self, era: str, logs: Path) -> None:
        self.era = era
        self.port = reserved_port()
        self.logs = logs
        self._runs = 0
        self._process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "tests.support.fault_upstream", "--era", self.era, "--port", str(self.port)]

    def start(self) -> None:
        """Start it on its port; the first time on another if that one turned out taken (later,
        the proxy in front expects it where it was)."""
        for attempt in range(5):
            self._runs += 1
            self._process = Process(
                self.argv(), self.logs / f"{type(self).__name__}-{self.era}-{self.port}-{self._runs}.log", cwd=REPO
            )
            try:
                self._process.wait_listening(self.START_S, port=self.port)
                return
            except PortTaken:
                self._process.stop()
                if self._runs > 1 or attempt == 4:
                    raise
                self.port, self._runs = reserved_port(), 0

    def kill(self) -> None:
        assert self._process is not None
        os.killpg(self._process.proc.pid, signal.SIGKILL)
        self._process.stop()

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()


@pytest.fixture(scope="module", params=["modern", "legacy"])
def upstream_era(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def faulty(upstream_era: str, logs_dir: Path) -> Iterator[Faulty]:
    upstream = Faulty(upstream_era, logs_dir)
    upstream.start()
    try:
        yield upstream
    finally:
        upstream.stop()


@pytest.fixture(scope="module")
def proxy(start_proxy: ProxyFactory, faulty: Faulty) -> Iterator[Endpoint]:
    with start_proxy(faulty.url, upstream__era=faulty.era, **SETTINGS) as url:
        yield Endpoint(url, timeout=BOUND_S)


class Client:
    """A caller of one era: calls a tool and gives back the reply and the response in it."""

    def __init__(self, era: str, endpoint: Endpoint) -> None:
        self.era = era
        self.endpoint = endpoint
        self.session = legacy_client.open_session(endpoint) if era == "legacy" else None
        self._ids = iter(range(1, 1_000_000))

    def call(
        self, tool: str, arguments: dict[str, Any] | None = None, *, progress: bool = False, when: Any = None
    ) -> tuple[Reply, dict[str, Any] | None]:
        request_id = next(self._ids)
        params: dict[str, Any] = {"name": tool, "arguments": arguments or {}}
        if progress:
            params["_meta"] = {"progressToken": f"p{request_id}"}
        if self.session is not None:
            reply = legacy_client.call(self.endpoint, self.session, request_id, "tools/call", params, when=when)
        else:
            reply = modern_client.call(self.endpoint, request_id, "tools/call", params, when=when)
        return reply, answer_to(reply, request_id)


def echo_works(client: Client, text: str = "still here") -> None:
    reply, answer = client.call("echo", {"text": text})
    assert_holds(reply, "echo")
    assert answer is not None and "result" in answer, f"echo failed: HTTP {reply.status} {reply.body[:400]!r}"
    assert answer["result"]["content"][0]["text"].endswith(text)  # real servers say "echo: <text>"


def log_text(endpoint: Endpoint) -> str:
    return PROXY_LOGS[endpoint.url].read_text(errors="replace")


def _expect(mode: str, reply: Reply, answer: dict[str, Any] | None) -> None:
    assert_holds(reply, mode)
    expected = EXPECTED[mode]
    if expected is None:
        assert answer is not None and "result" in answer, f"{mode}: a valid reply was refused: {reply.body[:400]!r}"
        return
    assert answer is not None and "error" in answer, (
        f"{mode}: no error for the call: HTTP {reply.status} {reply.body[:400]!r}"
    )
    error = answer["error"]
    assert error["code"] in expected, f"{mode}: {error}"
    assert len(error["message"]) < 400 and "<html" not in error["message"].lower(), error
    assert reply.closed or reply.content_type == "application/json", f"{mode}: a broken stream left the connection open"


@pytest.mark.parametrize("client_era", ["legacy", "modern"])
@pytest.mark.parametrize("mode", list(fault_upstream.FAULTS))
def test_a_faulty_reply_fails_only_its_call_clearly_and_is_counted(proxy: Endpoint, client_era: str, mode: str) -> None:
    tally.count("faults")
    faulty_client, bystander = Client(client_era, proxy), Client(client_era, proxy)
    before = proxy.metrics()
    log_before = len(log_text(proxy))
    with ThreadPoolExecutor(2) as pool:
        pending = pool.submit(faulty_client.call, f"fault_{mode}")
        echo_works(bystander)  # beside the faulty call, while it is in flight
        reply, answer = pending.result(timeout=BOUND_S + 5)
    _expect(mode, reply, answer)
    echo_works(faulty_client, "after the fault")
    if EXPECTED[mode] is not None:
        after = proxy.metrics()
        assert metric(after, ERRORS) > metric(before, ERRORS), f"{mode}: not counted in {ERRORS}"
        said = wait_for(lambda: '"upstream_error"' in log_text(proxy)[log_before:], 10)  # written a few ms later
        assert said, f"{mode}: the request log does not say it"


@pytest.mark.parametrize("client_era", ["legacy", "modern"])
def test_an_upstream_that_dies_gives_a_prompt_error_and_the_proxy_recovers_when_it_returns(
    proxy: Endpoint, faulty: Faulty, client_era: str, upstream_era: str
) -> None:
    tally.count("faults")
    client = Client(client_era, proxy)
    echo_works(client)
    # The upstream dies while the client's session lives, and comes back on the same port.
    faulty.kill()
    reply, answer = client.call("echo", {"text": "x"})
    assert_holds(reply, "upstream down")
    assert answer is not None and answer.get("error", {}).get("code") == jsonrpc.UPSTREAM_UNAVAILABLE, reply.body[:400]
    faulty.start()
    if client_era == "legacy" and upstream_era == "legacy":
        # The client's session was the upstream's own (byte for byte): it is gone; a new one works.
        reply, answer = client.call("echo", {"text": "x"})
        assert reply.status == 404, reply
        client = Client(client_era, proxy)
    echo_works(client, "back")


def eventually(check: Callable[[], None], bound_s: float = BOUND_S) -> None:
    """`check` passes within `bound_s` (retried: a restarting upstream may refuse for a moment)."""
    deadline = time.monotonic() + bound_s
    while True:
        try:
            check()
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def test_sessions_the_upstream_forgot_are_opened_again(proxy: Endpoint, faulty: Faulty, upstream_era: str) -> None:
    """A legacy upstream that forgets its sessions (404): the proxy's pooled sessions for modern
    clients open again by themselves; a legacy client's own session ends with 404 and a new one
    works. In front of a modern upstream (no sessions to forget) nothing changes for anyone."""
    tally.count("faults")
    modern, legacy = Client("modern", proxy), Client("legacy", proxy)
    echo_works(modern)
    echo_works(legacy)
    before = proxy.metrics()
    forgot = Endpoint(f"http://127.0.0.1:{faulty.port}/control/forget").post({})
    assert forgot.status == 200
    echo_works(modern, "reopened")
    reopened = metric(proxy.metrics(), REOPENED) - metric(before, REOPENED)
    if upstream_era == "modern":
        assert reopened == 0
        echo_works(legacy, "unchanged")
        return
    assert reopened > 0
    reply, _ = legacy.call("echo", {"text": "x"})
    assert reply.status == 404, reply
    echo_works(Client("legacy", proxy), "new session")


# ---------------------------------------------------------------- stdio servers that misbehave


def stdio_command(era: str, fault: str) -> str:
    """The scripted stdio server (tests/support/stdio_server.py) of `era`, misbehaving as `fault` says."""
    settings = [f"STDIO_SERVER_ERA={era}", f"STDIO_SERVER_FAULT={fault}"]
    return shlex.join(["env", *settings, sys.executable, str(STDIO_SERVER)])


STDIO_EXPECTED = {
    "garbage": frozenset({jsonrpc.UPSTREAM_UNAVAILABLE, jsonrpc.UPSTREAM_TIMEOUT, jsonrpc.UPSTREAM_INVALID}),
    "exit": frozenset({jsonrpc.UPSTREAM_UNAVAILABLE}),
    "hang": frozenset({jsonrpc.UPSTREAM_TIMEOUT}),
    "missing": frozenset({jsonrpc.UPSTREAM_UNAVAILABLE}),
}
assert set(STDIO_EXPECTED) - {"missing"} | {"crash_on_call"} == set(stdio_server.FAULTS)


@pytest.mark.parametrize("era", ["explicit", "auto"])
@pytest.mark.parametrize("server_era", ["legacy", "modern"])
@pytest.mark.parametrize("fault", list(STDIO_EXPECTED))
def test_a_stdio_server_that_misbehaves_gives_clear_errors(
    start_proxy: ProxyFactory, fault: str, server_era: str, era: str
) -> None:
    tally.count("faults")
    command = "/nonexistent/mcp-server --stdio" if fault == "missing" else stdio_command(server_era, fault)
    settings = {**SETTINGS, "upstream__probe_timeout_s": "2"}
    if era == "explicit":
        settings["upstream__era"] = server_era
    with start_proxy(command=command, **settings) as url:
        endpoint = Endpoint(url, timeout=BOUND_S)
        for client_era in ("modern", "legacy"):
            if client_era == "legacy":
                reply = legacy_client.initialize(endpoint)
                request_id: Any = 0
            else:
                reply = modern_client.call(endpoint, 1, "tools/call", {"name": "echo", "arguments": {"text": "x"}})
                request_id = 1
            assert_holds(reply, f"{fault}/{client_era}")
            answer = answer_to(reply, request_id)
            assert answer is not None and "error" in answer, (
                f"{fault}/{client_era}: {reply.status} {reply.body[:400]!r}"
            )
            assert answer["error"]["code"] in STDIO_EXPECTED[fault], answer
            if fault == "missing":
                assert "/nonexistent/mcp-server" in answer["error"]["message"], answer
        assert "Traceback" not in PROXY_LOGS[url].read_text(errors="replace")


@pytest.mark.parametrize("server_era", ["legacy", "modern"])
def test_a_stdio_server_that_crashes_mid_call_fails_that_call_and_is_started_again(
    start_proxy: ProxyFactory, server_era: str
) -> None:
    tally.count("faults")
    with start_proxy(command=stdio_command(server_era, "crash_on_call"), upstream__era=server_era, **SETTINGS) as url:
        endpoint = Endpoint(url, timeout=BOUND_S)
        for client_era in ("modern", "legacy"):
            client = Client(client_era, endpoint)
            for attempt in range(2):  # the server crashes on every call: each fails, none hangs
                reply, answer = client.call("echo", {"text": str(attempt)})
                assert_holds(reply, f"crash {client_era}")
                assert answer is not None and "error" in answer, (reply.status, reply.body[:400])
                if reply.status == 404 and client.session is not None:
                    # A legacy session whose server process died is over: the client starts a new one.
                    client = Client(client_era, endpoint)
                else:
                    assert answer["error"]["code"] == jsonrpc.UPSTREAM_UNAVAILABLE, answer

        def lists_tools() -> None:
            listed = modern_client.call(endpoint, 5, "tools/list")
            assert_holds(listed, "tools/list after crashes")
            assert listed.status == 200 and json.loads(listed.body).get("result", {}).get("tools"), listed.body[:300]

        eventually(lists_tools)  # the server is started again: it serves what does not crash it


# ---------------------------------------------------------------- real upstreams killed mid-call


class RealServer(Faulty):
    """A real SDK server (mcp==1.30.0 legacy or mcp==2.3.0 modern) on a port of its own."""

    START_S = 60.0

    def argv(self) -> list[str]:
        python, script = (
            (peers.mcp1_python(), "legacy_server.py")
            if self.era == "legacy"
            else (peers.mcp2_python(), "modern_server.py")
        )
        return [str(python), str(peers.PEER_SCRIPTS / script), "--port", str(self.port)]


@pytest.mark.parametrize("client_era", ["legacy", "modern"])
@pytest.mark.parametrize("server_era", ["legacy", "modern"])
def test_a_real_server_killed_mid_call_fails_that_call_promptly_and_serves_again_once_restarted(
    start_proxy: ProxyFactory, logs_dir: Path, server_era: str, client_era: str
) -> None:
    tally.count("faults")
    server = RealServer(server_era, logs_dir)
    server.start()
    try:
        with start_proxy(server.url, **SETTINGS) as url:
            proxy = Endpoint(url, timeout=BOUND_S)
            client = Client(client_era, proxy)
            echo_works(client)
            # The call reports progress each 0.1 s: the server dies once the first report is relayed.
            reply, answer = client.call(
                "slow", {"seconds": 30}, progress=True, when=(b"notifications/progress", server.kill)
            )
            assert_holds(reply, "killed mid-call")
            assert answer is not None and answer.get("error", {}).get("code") == jsonrpc.UPSTREAM_UNAVAILABLE, (
                reply.status,
                reply.body[:400],
            )
            assert "Traceback" not in log_text(proxy)
            server.start()
            if client_era == "legacy" and server_era == "legacy":
                client = Client(client_era, proxy)  # its session was the server's own: gone with it
            eventually(lambda: echo_works(client, "after the restart"))
    finally:
        server.stop()


def _started_pids(endpoint: Endpoint) -> list[int]:
    """The server processes the proxy says it started, in order (its upstream_process_started lines)."""
    lines = log_text(endpoint).splitlines()
    return [json.loads(line)["pid"] for line in lines if '"upstream_process_started"' in line]


def test_a_legacy_clients_own_stdio_server_killed_mid_call_fails_that_call_and_a_new_session_serves(
    start_proxy: ProxyFactory,
) -> None:
    """A legacy client's session is its own server process: killed mid-call, the call fails at
    once and a new session gets a new process. (The shared and pooled processes of the other
    pairings: tests/e2e/test_stdio_supervision.py.)"""
    tally.count("faults")
    command = shlex.join([str(peers.mcp1_python()), str(peers.PEER_SCRIPTS / "legacy_server.py"), "--stdio"])
    with start_proxy(command=command, upstream__era="legacy", **SETTINGS) as url:
        proxy = Endpoint(url, timeout=BOUND_S)
        client = Client("legacy", proxy)
        echo_works(client)
        victim = _started_pids(proxy)[-1]  # the process of this client's session
        reply, answer = client.call(
            "slow",
            {"seconds": 30},
            progress=True,
            when=(b"notifications/progress", lambda: os.kill(victim, signal.SIGKILL)),
        )
        assert_holds(reply, "stdio server killed mid-call")
        assert answer is not None and answer.get("error", {}).get("code") == jsonrpc.UPSTREAM_UNAVAILABLE, reply.body[
            :400
        ]
        echo_works(Client("legacy", proxy), "a new process")  # the session was that process: a new one
        assert _started_pids(proxy)[-1] != victim
        assert "Traceback" not in log_text(proxy)
