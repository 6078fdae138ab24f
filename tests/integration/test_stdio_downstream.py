"""`python -m proxy stdio` driven as a host drives its server process: JSON-RPC lines on its stdin,
replies on its stdout, against the scripted stdio server it starts itself
(tests/support/stdio_server.py; docs/get-started/desktop-hosts.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.downstream.bridge import EndpointBridge
from proxy.downstream.bridge_messages import encode_line
from proxy.protocol import jsonrpc
from tests.hostile import strategies as hs
from tests.support import answers, tally
from tests.support.fake_modern import FakeModern

from .conftest import Proxy
from .test_legacy_sse_downstream import forget_foreign

SERVER = Path(__file__).resolve().parents[1] / "support" / "stdio_server.py"
WAIT = 15.0
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


async def gone(pid: int, within_s: float = WAIT) -> bool:
    deadline = asyncio.get_running_loop().time() + within_s
    while alive(pid):
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


class Host:
    """A host that started the proxy as its stdio server."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[Any] = []  # everything read from stdout, decoded
        self.raw: list[bytes] = []

    async def send(self, message: Any) -> None:
        data = message if isinstance(message, bytes) else json.dumps(message).encode()
        assert self.process.stdin is not None
        self.process.stdin.write(data + b"\n")
        await self.process.stdin.drain()

    async def next(self, match: Callable[[Any], bool] = lambda m: True) -> Any:
        assert self.process.stdout is not None
        for seen in self.lines:
            if match(seen):
                self.lines.remove(seen)
                return seen
        while True:
            raw = await asyncio.wait_for(self.process.stdout.readline(), WAIT)
            assert raw, "the proxy closed stdout"
            self.raw.append(raw)
            message = json.loads(raw)  # stdout carries JSON-RPC only
            if match(message):
                return message
            self.lines.append(message)

    async def reply(self, request_id: Any) -> Any:
        return await self.next(lambda m: isinstance(m, dict) and m.get("id") == request_id and "method" not in m)

    async def request(self, request_id: Any, method: str, params: dict[str, Any] | None = None) -> Any:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        return await self.reply(request_id)

    async def legacy_start(self) -> Any:
        init = await self.request(
            0,
            "initialize",
            {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "host", "version": "1"}},
        )
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return init

    async def close(self) -> int:
        assert self.process.stdin is not None
        self.process.stdin.close()
        return await asyncio.wait_for(self.process.wait(), WAIT)


async def upstream_pid(host: Host, request_id: Any, params: dict[str, Any] | None = None) -> int:
    reply = await host.request(request_id, "tools/call", {"name": "pid", "arguments": {}, **(params or {})})
    return int(reply["result"]["content"][0]["text"])


def stderr_file(path: Path) -> Any:
    """Where a proxy's stderr (its logs) goes."""
    return open(path, "wb")


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    started: list[asyncio.subprocess.Process] = []
    logs: list[Any] = []

    async def launch(era: str = "legacy", *extra: str) -> Host:
        log = stderr_file(tmp_path / f"proxy-{len(started)}.log")
        logs.append(log)
        env = {**os.environ, "STDIO_SERVER_ERA": era, "MCP_ERA_PROXY_LOGGING__LEVEL": "debug"}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "proxy",
            "stdio",
            "--upstream-command",
            f"{sys.executable} {SERVER}",
            *extra,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            env=env,
        )
        started.append(process)
        return Host(process)

    yield launch
    for process in started:
        if process.returncode is None:
            process.kill()
            await process.wait()
    for log in logs:
        log.close()


async def test_a_legacy_host_to_a_legacy_stdio_server_and_stdin_eof_ends_everything(start: Any) -> None:
    host = await start("legacy")
    init = await host.legacy_start()
    assert init["result"]["protocolVersion"] == "2025-11-25"
    tools = await host.request(1, "tools/list")
    assert [t["name"] for t in tools["result"]["tools"]] == ["pid", "echo", "hold"]
    pid = await upstream_pid(host, 2)
    assert alive(pid)
    assert await host.close() == 0
    assert await gone(pid)


async def test_a_slow_call_blocks_no_other_and_progress_reaches_the_host(start: Any) -> None:
    host = await start("legacy")
    await host.legacy_start()
    await host.send(
        {
            "jsonrpc": "2.0",
            "id": "slow",
            "method": "tools/call",
            "params": {"name": "hold", "arguments": {}, "_meta": {"progressToken": "p1"}},
        }
    )
    progress = await host.next(lambda m: m.get("method") == "notifications/progress")
    assert progress["params"]["progressToken"] == "p1"
    echo = await host.request(3, "tools/call", {"name": "echo", "arguments": {"text": "hi"}})
    assert echo["result"]["content"][0]["text"] == "hi"
    await host.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "slow"}})
    # The server answers the cancelled call anyway; the host must not get that answer (the mcp 1.30
    # client fails on a reply to a request it gave up).
    after = await host.request(4, "tools/call", {"name": "echo", "arguments": {"text": "after"}})
    assert after["result"]["content"][0]["text"] == "after"
    assert await host.close() == 0
    assert not any(m.get("id") == "slow" and "method" not in m for m in host.lines)


async def test_garbage_lines_get_errors_and_the_bridge_keeps_reading(start: Any) -> None:
    host = await start("legacy")
    await host.send(b"this is not json")
    assert (await host.next())["error"]["code"] == -32700
    await host.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})  # before initialize
    assert (await host.reply(1))["error"]["code"] == -32600
    await host.legacy_start()
    for line, code, request_id in [
        (b"\xff\xfe\x00", -32700, None),
        (b"[]", -32600, None),
        (b'{"jsonrpc":"2.0","id":7}', -32600, 7),
        (b'{"jsonrpc":"2.0","id":8,"method":"x","params":' + b"[" * 500 + b"]" * 500 + b"}", None, 8),
    ]:
        await host.send(line)
        reply = await host.next(lambda m, i=request_id: "error" in m and m.get("id") == i)
        if code is not None:
            assert reply["error"]["code"] == code
    await host.send(b"x" * (5 * 1024 * 1024))  # beyond security.max_body_bytes
    too_long = await host.next(lambda m: "error" in m)
    assert "too long" in too_long["error"]["message"]
    assert await upstream_pid(host, 9) > 0  # still serving
    assert await host.close() == 0
    assert all(line.endswith(b"\n") and b"Traceback" not in line for line in host.raw)


async def test_a_modern_host_to_a_modern_stdio_server(start: Any) -> None:
    host = await start("modern")
    discover = await host.request(1, "server/discover", {"_meta": ENVELOPE})
    assert discover["result"]["supportedVersions"] == ["2026-07-28"]
    pid = await upstream_pid(host, 2, {"_meta": ENVELOPE})
    # A call held upstream does not block the next; notifications/cancelled ends it without a reply.
    await host.send(
        {
            "jsonrpc": "2.0",
            "id": "slow",
            "method": "tools/call",
            "params": {"name": "hold", "arguments": {}, "_meta": ENVELOPE},
        }
    )
    echo = await host.request(3, "tools/call", {"name": "echo", "arguments": {"text": "x y"}, "_meta": ENVELOPE})
    assert echo["result"]["content"][0]["text"] == "x y"
    await host.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "slow"}})
    # A request without the envelope gets the endpoint's own refusal.
    refused = await host.request(4, "tools/list", {})
    assert refused["error"]["code"] == -32602
    assert await host.close() == 0
    assert await gone(pid)
    assert not any(m.get("id") == "slow" for m in host.lines)


@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_what_the_http_edge_refuses_the_bridge_refuses_with_the_same_code_and_keeps_serving(
    start: Any, era: str
) -> None:
    """A method holding a control character cannot even become an `Mcp-Method` header: it used to
    leave the request unanswered (the bridge's task died unobserved). Now -32600 with its id."""
    host = await start("legacy")
    params: dict[str, Any] = {"_meta": ENVELOPE} if era == "modern" else {}
    if era == "modern":
        await host.request(1, "server/discover", {"_meta": ENVELOPE})
    else:
        await host.legacy_start()
    # As the host writes them: JSON escapes, so the line parses and the method holds the character.
    for n, method in enumerate([r"tools/\u0000list", r"tools/list\r\nX-Injected: 1", r"tools/\u007flist"], start=10):
        await host.send(f'{{"jsonrpc":"2.0","id":{n},"method":"{method}","params":{json.dumps(params)}}}'.encode())
        reply = await host.reply(n)
        assert reply["error"]["code"] == -32600 and "control character" in reply["error"]["message"], reply
    # A notification gets no reply; a batch holding such a request one error, as over HTTP.
    await host.send(rb'{"jsonrpc":"2.0","method":"notifications/\u0000x"}')
    if era == "legacy":
        await host.send(rb'[{"jsonrpc":"2.0","id":20,"method":"tools/\u0000list"}]')
        assert (await host.next(lambda m: "error" in m and m.get("id") is None))["error"]["code"] == -32600
    echo = await host.request(30, "tools/call", {"name": "echo", "arguments": {"text": "still"}, **params})
    assert echo["result"]["content"][0]["text"] == "still"
    assert await host.close() == 0
    assert all(b"Traceback" not in line and b"never retrieved" not in line for line in host.raw)


async def test_a_modern_host_to_a_legacy_stdio_server(start: Any) -> None:
    host = await start("legacy")
    discover = await host.request(1, "server/discover", {"_meta": ENVELOPE})
    assert "2026-07-28" in discover["result"]["supportedVersions"]
    echo = await host.request(2, "tools/call", {"name": "echo", "arguments": {"text": "t"}, "_meta": ENVELOPE})
    assert echo["result"]["content"][0]["text"] == "t"
    assert echo["result"]["resultType"] == "complete"
    assert await host.close() == 0


async def test_a_legacy_host_to_a_modern_stdio_server(start: Any) -> None:
    host = await start("modern")
    init = await host.legacy_start()
    assert init["result"]["protocolVersion"] in ("2025-11-25", "2025-06-18")
    echo = await host.request(2, "tools/call", {"name": "echo", "arguments": {"text": "legacy"}})
    assert echo["result"]["content"][0]["text"] == "legacy"
    assert await host.close() == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_ends_the_proxy_and_its_upstream_process(start: Any, signum: int) -> None:
    host = await start("legacy")
    await host.legacy_start()
    pid = await upstream_pid(host, 1)
    await host.send(
        {"jsonrpc": "2.0", "id": "slow", "method": "tools/call", "params": {"name": "hold", "arguments": {}}}
    )
    await asyncio.sleep(0.2)
    host.process.send_signal(signum)
    assert await asyncio.wait_for(host.process.wait(), WAIT) == 0
    assert await gone(pid)


async def test_logs_go_to_the_log_file_and_stdout_stays_json(start: Any, tmp_path: Path) -> None:
    log_file = tmp_path / "proxy.log"
    host = await start("legacy", "--log-file", str(log_file))
    await host.legacy_start()
    await upstream_pid(host, 1)
    assert await host.close() == 0
    events = [json.loads(line)["event"] for line in log_file.read_text().splitlines()]
    assert "started" in events and "stopped" in events
    assert (tmp_path / "proxy-0.log").read_text() == ""


async def test_requests_written_before_stdin_closes_are_still_answered(start: Any) -> None:
    host = await start("legacy")
    await host.send(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "h", "version": "1"},
            },
        }
    )
    await host.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    await host.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "pid", "arguments": {}}})
    assert host.process.stdin is not None and host.process.stdout is not None
    host.process.stdin.close()
    out = await asyncio.wait_for(host.process.stdout.read(), WAIT)
    replies = {message["id"]: message for message in map(json.loads, out.splitlines())}
    assert set(replies) == {0, 1} and "result" in replies[1]
    assert await asyncio.wait_for(host.process.wait(), WAIT) == 0


# What a plain `mcp-era-proxy stdio --upstream URL` never loads: each belongs to a feature it was not
# configured for (the verifier of auth.issuers' tokens with PyJWT and cryptography's certificates,
# spans, the Redis store, a config file, the supervisor of --workers, replays between replicas,
# HTTP+SSE clients and servers). A host starts the proxy on every launch and waits for it.
NOT_LOADED = (
    "jwt",
    "cryptography.x509",
    "proxy.auth.tokens",
    "opentelemetry",
    "proxy.tracing.otel",
    "redis",
    "proxy.state.redis_connection",
    "proxy.state.redis_store",
    "proxy.state.redis_tasks",
    "proxy.state.redis_tracking",
    "yaml",
    "proxy.cluster.workers",
    "proxy.cluster.replay",
    "proxy.downstream.legacy_sse",
    "proxy.upstream.sse",
)
# The CLI, run as its entry point runs it, writing the names of the modules loaded as it exits.
WITH_MODULES_LISTED = (
    "import atexit, json, sys\n"
    "listed = sys.argv.pop(1)\n"
    "atexit.register(lambda: open(listed, 'w').write(json.dumps(sorted(sys.modules))))\n"
    "from proxy.cli import main\n"
    "sys.exit(main())\n"
)


async def test_a_plain_start_loads_nothing_of_the_features_it_does_not_use(fake: FakeModern, tmp_path: Path) -> None:
    listed = tmp_path / "modules.json"
    with stderr_file(tmp_path / "proxy.log") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            WITH_MODULES_LISTED,
            str(listed),
            "stdio",
            "--upstream",
            fake.url,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
    host = Host(process)
    try:
        init = await host.legacy_start()
        assert init["result"]["serverInfo"]["name"] == "fake-modern"  # the upstream answered through it
        tools = await host.request(1, "tools/list")
        assert "tools" in tools["result"]
        assert await host.close() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    loaded = set(json.loads(listed.read_text()))
    assert "proxy.app" in loaded and "aiohttp" in loaded  # the listing is of the proxy that served
    found = [name for name in sorted(loaded) if any(name == n or name.startswith(n + ".") for n in NOT_LOADED)]
    assert found == []


def test_the_hosts_session_and_server_process_are_never_expired_for_idling() -> None:
    from proxy.cli import STDIO_GRACE_S, stdio_settings
    from proxy.config import load_settings

    settings = stdio_settings(
        load_settings(
            None,
            **{
                "upstream.url": "http://127.0.0.1:1/mcp",
                "listen": "0.0.0.0:9000",
                "security.allowed_hosts": ["proxy.example.com"],
            },
        )
    )
    assert settings.security.allowed_hosts == [] and settings.listen_address[0] == "127.0.0.1"
    day = 86400.0
    assert settings.sessions.idle_timeout_s > 365 * day and settings.sessions.max_lifetime_s > 365 * day
    assert settings.upstream.stdio.process_idle_s > 365 * day
    assert settings.shutdown.grace_s == STDIO_GRACE_S
    assert settings.downstream.sse.enabled is False  # nothing but the host on stdin is served


# ---------------------------------------------------------------- hostile lines, in-process
#
# The bridge `mcp-era-proxy stdio` runs (proxy/downstream/bridge.py), fed lines as stdin gives
# them to it, in front of the proxy served in-process (tests/integration/conftest.py): every
# member of every JSON type, and generated lines (tests/hostile/strategies.py), before the host's
# era is known and in each era.

HOSTILE_LINES = 100  # generated lines per state


class Lines:
    """Where the bridge writes what the host would read on stdout."""

    def __init__(self) -> None:
        self.broken = asyncio.Event()
        self.written: list[Any] = []
        self._added = asyncio.Event()

    def start(self) -> None:
        pass

    def write(self, message: Any) -> None:
        self.written.append(json.loads(encode_line(message)))  # as the host would read it
        self._added.set()

    def write_raw(self, data: bytes) -> None:
        self.write(json.loads(data))

    async def drain(self, within_s: float) -> None:
        pass

    async def close(self) -> None:
        pass

    async def reply(self, request_id: Any) -> Any:
        """The next line answering `request_id` (taken out of `written`)."""
        async with asyncio.timeout(WAIT):
            while True:
                for message in self.written:
                    if isinstance(message, dict) and message.get("id") == request_id and "method" not in message:
                        self.written.remove(message)
                        return message
                self._added.clear()
                await self._added.wait()

    def problems(self) -> list[str]:
        """Lines that must not be: anything but JSON-RPC, or the proxy's own failure."""
        found = []
        for message in self.written:
            error = message.get("error") if isinstance(message, dict) else None
            if jsonrpc.kind(message) == "invalid" or (
                isinstance(error, dict) and error.get("message") in answers.UNHANDLED
            ):
                found.append(str(message)[:300])
        return found


@contextlib.asynccontextmanager
async def bridged(proxy: Proxy, state: str) -> AsyncIterator[tuple[EndpointBridge, Lines]]:
    """The bridge with its host in `state`: `no-era` (nothing sent yet), `legacy` (initialized),
    `modern` (after server/discover)."""
    lines = Lines()
    url = str(proxy.client.make_url(proxy.settings.path))
    bridge = EndpointBridge(
        proxy.client.session, url, lines, proxy.settings.security.max_json_depth, upstream=proxy.settings.upstream.name
    )
    bridge.start()
    try:
        if state == "legacy":
            bridge.line(
                json.dumps({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": INITIALIZE}).encode()
            )
            assert "result" in await lines.reply("init")
            bridge.line(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')
        elif state == "modern":
            bridge.line(
                json.dumps(
                    {"jsonrpc": "2.0", "id": "discover", "method": "server/discover", "params": {"_meta": ENVELOPE}}
                ).encode()
            )
            assert "result" in await lines.reply("discover")
        yield bridge, lines
    finally:
        await bridge.close(1.0, end_session=True)


async def serves_on(bridge: EndpointBridge, lines: Lines, state: str) -> None:
    if state == "no-era":
        bridge.line(json.dumps({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": INITIALIZE}).encode())
        assert "result" in await lines.reply("init")
    params = {"_meta": ENVELOPE} if state == "modern" else {}
    bridge.line(json.dumps({"jsonrpc": "2.0", "id": "after", "method": "tools/list", "params": params}).encode())
    assert "tools" in (await lines.reply("after"))["result"]


INITIALIZE = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "host", "version": "1"}}
STATES = ["no-era", "legacy", "modern"]


@pytest.mark.parametrize("state", STATES)
async def test_every_member_of_every_json_type_on_stdin_gets_the_documented_answer(
    proxy: Proxy, fake: FakeModern, state: str
) -> None:
    """`jsonrpc`, `id`, `method`, `params`, `result`, `error` of each JSON type: what is no
    JSON-RPC message gets -32600 (with its id when it can be read); a request that is gets its
    answer (before the era is known: -32600, docs/troubleshooting.md), never the proxy's own
    failure; and the bridge serves on."""
    params = {"_meta": ENVELOPE} if state == "modern" else {}
    request = {"jsonrpc": "2.0", "id": "mistyped", "method": "tools/list", "params": params}
    answer = {"jsonrpc": "2.0", "id": "mistyped", "result": {}}
    cases = [*hs.mistyped(request, hs.REQUEST_MEMBERS), *hs.mistyped(answer, hs.ANSWER_MEMBERS)]
    tally.count("hostile.proxy", len(cases))
    tally.count("hostile.proxy.stdio", len(cases))
    async with bridged(proxy, state) as (bridge, lines):
        for name, message in cases:
            bridge.line(json.dumps(message).encode())
            if not answers.well_formed(message):
                refused = await lines.reply(jsonrpc.id_of(message))
                assert refused["error"]["code"] == jsonrpc.INVALID_REQUEST, (name, refused)
            elif "method" in message and "id" in message:
                reply = await lines.reply(message["id"])
                if state == "no-era":
                    assert reply["error"]["code"] == jsonrpc.INVALID_REQUEST, (name, reply)
                assert "result" in reply or reply["error"]["message"] not in answers.UNHANDLED, (name, reply)
        await serves_on(bridge, lines, state)
        assert not lines.problems(), lines.problems()


@pytest.mark.parametrize("state", STATES)
async def test_generated_lines_get_json_rpc_answers_and_the_bridge_serves_on(
    proxy: Proxy, fake: FakeModern, state: str
) -> None:
    bodies = hs.examples(hs.bodies, HOSTILE_LINES)
    tally.count("hostile.proxy", len(bodies))
    tally.count("hostile.proxy.stdio", len(bodies))
    async with bridged(proxy, state) as (bridge, lines):
        for body in bodies:
            bridge.line(hs.encode(body))
        await serves_on(bridge, lines, state)
        assert not lines.problems(), lines.problems()
    forget_foreign(fake, bodies)
