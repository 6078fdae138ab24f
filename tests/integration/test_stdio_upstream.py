"""stdio upstreams against real child processes: framing, routing, shutdown, restart, era probe
(proxy/upstream/stdio.py, proxy/relay/detect.py probe_stdio; docs/translation.md §1.4).

The children are tiny Python scripts written here and run with this interpreter; no MCP SDK.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from proxy.protocol import jsonrpc, meta
from proxy.protocol.detection import Detected
from proxy.protocol.versions import LATEST_LEGACY, LATEST_MODERN, LEGACY_VERSIONS, MODERN_VERSIONS, Era
from proxy.relay.detect import probe_stdio
from proxy.upstream.errors import UpstreamUnavailable
from proxy.upstream.stdio import (
    ProbeHandover,
    StdioChannel,
    StdioModernUpstream,
    StdioProcess,
    StdioReply,
    process_factory,
)
from tests.support.schema import errors

JSONDict = dict[str, Any]
NAME = "scripted-stdio"
WAIT = 10.0  # bound on every wait; the happy paths take milliseconds
GRACE = 0.3  # shutdown grace used where a child has to be escalated against
PROBE_TIMEOUT = 0.3

# A scriptable server. For every line it reads it records the raw line (and appends it to
# $CHILD_RECORD when set). For every request it first writes `params.emit` (objects as JSON, strings
# verbatim) to stdout and `params.stderr` to stderr, and a progress notification when the request
# has a progressToken; then, by method:
#   echo      answer {"echo": id, "pid": pid}
#   batch     hold until `params.count` batch requests are in, then answer them newest first
#   received  answer {"lines": every raw line read so far}
#   spawn     start a grandchild that sleeps (inheriting stdout), answer {"grandchild": pid}
#   crash     exit with `params.code` (default 3) without answering
#   server/discover  answer with $CHILD_DISCOVER (JSON of the reply minus jsonrpc/id);
#                    "crash": exit; unset: say nothing
#   anything else: no answer
# It exits 0 at end of input.
SERVER = r"""
import json, os, subprocess, sys

discover = os.environ.get("CHILD_DISCOVER")
initialize = os.environ.get("CHILD_INITIALIZE")  # "first": answered before the request(s) read before it; "refuse"
record = os.environ.get("CHILD_RECORD")
lines, held = [], []

def send(message):
    sys.stdout.write((message if isinstance(message, str) else json.dumps(message)) + "\n")
    sys.stdout.flush()

def answer(request, result):
    send({"jsonrpc": "2.0", "id": request["id"], "result": result})

while True:
    line = sys.stdin.readline()
    if not line:
        break
    lines.append(line)
    if record:
        with open(record, "a") as f:
            f.write(line)
    message = json.loads(line)
    method, params = message.get("method"), message.get("params") or {}
    if method is None or "id" not in message:
        continue
    for item in params.get("emit", []):
        send(item)
    for text in params.get("stderr", []):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    token = (params.get("_meta") or {}).get("progressToken")
    if token is not None:
        send({"jsonrpc": "2.0", "method": "notifications/progress",
              "params": {"progressToken": token, "progress": 1}})
    if method == "echo":
        answer(message, {"echo": message["id"], "pid": os.getpid()})
    elif method == "batch":
        held.append(message)
        if len(held) == params["count"]:
            for request in reversed(held):
                answer(request, {"echo": request["id"], "pid": os.getpid()})
            held.clear()
    elif method == "received":
        answer(message, {"lines": lines})
    elif method == "spawn":
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        answer(message, {"grandchild": grandchild.pid})
    elif method == "crash":
        sys.exit(params.get("code", 3))
    elif method == "server/discover":
        if discover == "crash":
            sys.exit(4)
        if discover and initialize == "first":
            held.append(message)  # answered after the initialize behind it
        elif discover:
            send({"jsonrpc": "2.0", "id": message["id"], **json.loads(discover)})
    elif method == "initialize" and initialize == "refuse":  # as a 2026-07-28-only server
        send({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32022, "message": "Unsupported"}})
    elif method == "initialize" and initialize:
        answer(message, {"protocolVersion": params["protocolVersion"], "capabilities": {},
                         "serverInfo": {"name": "child", "version": "1"}})
        for request in held:
            send({"jsonrpc": "2.0", "id": request["id"], **json.loads(discover)})
        held.clear()
"""

# Ignores SIGTERM and never reads stdin (so never sees its end); says "ready" once it is so.
STUBBORN = r"""
import json, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
sys.stdout.write(json.dumps({"jsonrpc": "2.0", "method": "ready"}) + "\n")
sys.stdout.flush()
while True:
    time.sleep(3600)
"""


# ---------------------------------------------------------------- helpers


def argv(script: str = SERVER) -> list[str]:
    return [sys.executable, "-c", script]


def server(env: dict[str, str] | None = None, script: str = SERVER) -> Callable[..., StdioProcess]:
    return process_factory(argv(script), NAME, env, None)


def discover_reply(message: JSONDict) -> dict[str, str]:
    """Environment making the server answer server/discover with `message` (its id is added)."""
    return {"CHILD_DISCOVER": json.dumps({k: v for k, v in message.items() if k not in ("jsonrpc", "id")})}


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def reaped(pid: int) -> bool:
    """The child is no longer ours to wait for (reaped: no zombie left behind)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@contextmanager
def watch(pid: int) -> Iterator[asyncio.Future[None]]:
    """A future done once `pid` (not necessarily our child) has exited, from its pidfd."""
    loop = asyncio.get_running_loop()
    gone: asyncio.Future[None] = loop.create_future()
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        gone.set_result(None)
        yield gone
        return
    loop.add_reader(pidfd, lambda: gone.done() or gone.set_result(None))
    try:
        yield gone
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@asynccontextmanager
async def running(process: StdioProcess | StdioChannel, grace_s: float = WAIT) -> AsyncIterator[None]:
    await process.start()
    try:
        yield
    finally:
        await process.stop(grace_s)


async def next_message(queue: asyncio.Queue[JSONDict], predicate: Callable[[JSONDict], bool]) -> JSONDict:
    """The first queued message that fits, dropping the others."""
    async with asyncio.timeout(WAIT):
        while not predicate(message := await queue.get()):
            pass
    return message


async def collect(route: Any) -> list[JSONDict]:
    async with asyncio.timeout(WAIT):
        return [message async for message in route.messages()]


async def ask(channel: StdioChannel, message: JSONDict) -> Any:
    route = channel.open_route(message)
    await channel.write(message)
    return route


async def final(upstream: StdioModernUpstream, message: JSONDict) -> JSONDict:
    """The reply to `message` through `exchange`, drained to its end."""
    async with asyncio.timeout(WAIT), upstream.exchange(message) as reply:
        received = [incoming async for incoming in reply]
    assert received and "method" not in received[-1], received
    return received[-1]


def progress(token: Any) -> JSONDict:
    return jsonrpc.notification("notifications/progress", {"progressToken": token, "progress": 1})


def log_message(text: str) -> JSONDict:
    return jsonrpc.notification("notifications/message", {"level": "info", "data": text})


def tagged(subscription_id: Any) -> JSONDict:
    return jsonrpc.notification(
        "notifications/resources/updated", {"uri": "file:///watched", "_meta": {meta.SUBSCRIPTION_ID: subscription_id}}
    )


def with_meta(request_id: Any, method: str, request_meta: JSONDict, **params: Any) -> JSONDict:
    return jsonrpc.request(request_id, method, {**params, "_meta": request_meta})


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------- StdioProcess


async def test_messages_written_reach_the_child_one_json_line_each():
    messages: asyncio.Queue[JSONDict] = asyncio.Queue()
    process = StdioProcess(argv(), name=NAME, on_message=messages.put_nowait)
    sent = [
        jsonrpc.request(1, "echo", {"text": "two\nlines and a \u2028 separator", "emoji": "\U0001f600"}),
        jsonrpc.notification("notifications/initialized"),
        jsonrpc.request("dump", "received"),
    ]
    async with running(process):
        async with asyncio.timeout(WAIT):
            await asyncio.gather(*(process.write(message) for message in sent))
        reply = await next_message(messages, lambda m: m.get("id") == "dump")
    lines = reply["result"]["lines"]
    assert [json.loads(line) for line in lines] == sent
    assert all(line.endswith("\n") and line.count("\n") == 1 for line in lines)


async def test_stdout_lines_that_are_not_json_rpc_are_skipped_and_logged_and_later_lines_still_arrive():
    messages: asyncio.Queue[JSONDict] = asyncio.Queue()
    process = StdioProcess(argv(), name=NAME, on_message=messages.put_nowait)
    garbage = ["this is not json", '{"foo": 1}', "[1, 2, 3]", '{"jsonrpc": "2.0", "method": 5}', "", "   "]
    good = jsonrpc.notification("notifications/tools/list_changed")
    with capture_logs() as logs:
        async with running(process):
            await process.write(jsonrpc.request(1, "echo", {"emit": [*garbage, good]}))
            first = await next_message(messages, lambda m: True)
            second = await next_message(messages, lambda m: True)
            await process.write(jsonrpc.request(2, "echo"))
            third = await next_message(messages, lambda m: True)
    assert first == good
    assert second["id"] == 1 and third["id"] == 2
    warnings = [e for e in logs if e["log_level"] == "warning" and e.get("upstream") == NAME]
    assert [e["event"] for e in warnings] == [
        "upstream_invalid_line",
        "upstream_invalid_message",
        "upstream_invalid_message",
        "upstream_invalid_message",
    ]
    assert "this is not json" in warnings[0]["line"]


async def test_stderr_lines_go_to_the_structured_logs_as_upstream_stderr():
    messages: asyncio.Queue[JSONDict] = asyncio.Queue()
    process = StdioProcess(argv(), name=NAME, on_message=messages.put_nowait)
    with capture_logs() as logs:
        async with running(process):
            await process.write(jsonrpc.request(1, "echo", {"stderr": ["warming up", "", "ready \u00e9"]}))
            await next_message(messages, lambda m: m.get("id") == 1)
            pid = process.pid
        # stop() waited for the stderr reader: every line written before exit is logged by now
    stderr = [e for e in logs if e["event"] == "upstream_stderr"]
    assert [e["line"] for e in stderr] == ["warming up", "ready \u00e9"]
    assert all(e["upstream"] == NAME and e["pid"] == pid for e in stderr)


async def test_stop_closes_stdin_and_a_child_that_exits_at_end_of_input_ends_without_a_signal():
    exits: list[int | None] = []
    messages: asyncio.Queue[JSONDict] = asyncio.Queue()
    process = StdioProcess(argv(), name=NAME, on_message=messages.put_nowait, on_exit=exits.append)
    await process.start()
    try:
        await process.write(jsonrpc.request(1, "echo"))
        await next_message(messages, lambda m: m.get("id") == 1)
        assert process.running
    finally:
        async with asyncio.timeout(WAIT):
            code = await process.stop(WAIT)  # a SIGTERM would only come after WAIT seconds
    assert code == 0
    assert exits == [0]
    assert not process.running and process.exited.is_set()
    with pytest.raises(ConnectionError):
        await process.write(jsonrpc.request(2, "echo"))


async def test_a_child_ignoring_end_of_input_and_sigterm_is_killed_reaped_and_its_pipes_closed():
    before = open_fds()
    exits: list[int | None] = []
    messages: asyncio.Queue[JSONDict] = asyncio.Queue()
    process = StdioProcess(argv(STUBBORN), name=NAME, on_message=messages.put_nowait, on_exit=exits.append)
    await process.start()
    try:
        await next_message(messages, lambda m: m.get("method") == "ready")  # SIGTERM is ignored from here
    finally:
        started = time.monotonic()
        try:
            async with asyncio.timeout(WAIT):
                code = await process.stop(GRACE)
        finally:
            elapsed = time.monotonic() - started
            if process.pid is not None and alive(process.pid):  # failed: do not leak it
                os.killpg(process.pid, signal.SIGKILL)
                await process.stop(GRACE)
    assert code == -signal.SIGKILL
    assert exits == [-signal.SIGKILL]
    # stdin closed, GRACE; SIGTERM, GRACE; SIGKILL: it took the escalation, and no longer.
    assert 2 * GRACE * 0.9 <= elapsed < 3 * GRACE + 2.0
    assert process.pid is not None
    assert reaped(process.pid)
    assert not alive(process.pid)
    assert open_fds() == before


async def test_stop_ends_the_childs_own_children_too():
    messages: asyncio.Queue[JSONDict] = asyncio.Queue()
    process = StdioProcess(argv(), name=NAME, on_message=messages.put_nowait)
    await process.start()
    grandchild: int | None = None
    try:
        await process.write(jsonrpc.request(1, "spawn"))
        grandchild = (await next_message(messages, lambda m: m.get("id") == 1))["result"]["grandchild"]
        with watch(grandchild) as grandchild_gone:
            # The child exits at end of input; its own child still holds stdout and stderr open.
            async with asyncio.timeout(WAIT):
                code = await process.stop(GRACE)
            assert code == 0
            # Its pipes reached end of file as it died: it is on its way out, not still running.
            async with asyncio.timeout(GRACE):
                await grandchild_gone
        assert not alive(grandchild)
    finally:
        if grandchild is not None and alive(grandchild):  # failed: do not leak it or the pipes
            os.kill(grandchild, signal.SIGKILL)
            await process.stop(GRACE)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_program_that_cannot_be_started_is_unavailable_naming_it_with_the_os_reason(tmp_path: Path, loop: str):
    # The proxy runs on uvloop where it is installed, whose OSError carries no file name.
    missing = tmp_path / "no-such-server"
    process = StdioProcess([str(missing), "--stdio"], name=NAME, on_message=lambda message: None)

    async def start() -> None:
        async with asyncio.timeout(WAIT):
            await process.start()

    run = asyncio.run if loop == "asyncio" else pytest.importorskip("uvloop").run
    with pytest.raises(UpstreamUnavailable) as failed:
        run(start())
    assert (
        failed.value.failure.message == f"upstream {NAME!r} could not start {str(missing)!r}: No such file or directory"
    )
    assert not process.running


# ---------------------------------------------------------------- StdioChannel routing


async def test_concurrent_replies_are_routed_by_id_even_out_of_order():
    channel = StdioChannel(server(), NAME)
    ids = ["a", 1, "1", 2]  # 1 and "1" are different ids
    async with running(channel):
        routes = [await ask(channel, jsonrpc.request(i, "batch", {"count": len(ids)})) for i in ids]
        replies = [await collect(route) for route in routes]
    for request_id, messages in zip(ids, replies, strict=True):
        assert len(messages) == 1
        assert messages[0]["id"] == request_id and type(messages[0]["id"]) is type(request_id)
        assert messages[0]["result"]["echo"] == request_id


async def test_progress_is_routed_by_the_requests_progress_token():
    channel = StdioChannel(server(), NAME)
    async with running(channel):
        first = await ask(channel, with_meta(1, "batch", {"progressToken": "tok-1"}, count=3))
        second = await ask(channel, with_meta(2, "batch", {"progressToken": 77}, count=3))
        third = await ask(channel, jsonrpc.request(3, "batch", {"count": 3}))
        first_messages, second_messages, third_messages = [await collect(r) for r in (first, second, third)]
    assert first_messages[0] == progress("tok-1") and first_messages[-1]["id"] == 1
    assert second_messages[0] == progress(77) and second_messages[-1]["id"] == 2
    assert [m.get("id") for m in third_messages] == [3]
    assert len(first_messages) == len(second_messages) == 2


async def test_subscription_tagged_notifications_go_to_the_route_whose_id_they_name():
    unsolicited: list[JSONDict] = []
    channel = StdioChannel(server(), NAME, on_unsolicited=unsolicited.append)
    async with running(channel):
        one = await ask(channel, jsonrpc.request("listen-1", "subscriptions/listen"))
        two = await ask(channel, jsonrpc.request(2, "subscriptions/listen"))
        done = await ask(
            channel, jsonrpc.request("go", "echo", {"emit": [tagged(2), tagged("listen-1"), tagged(2), tagged("gone")]})
        )
        assert [m.get("id") for m in await collect(done)] == ["go"]
        async with asyncio.timeout(WAIT):
            one_messages = [await anext(one.messages())]
            stream = two.messages()
            two_messages = [await anext(stream), await anext(stream)]
        channel.close_route(one)
        channel.close_route(two)
    assert one_messages == [tagged("listen-1")]
    assert two_messages == [tagged(2), tagged(2)]
    assert unsolicited == [tagged("gone")]


async def test_a_log_goes_to_the_one_request_that_asked_for_logs():
    unsolicited: list[JSONDict] = []
    channel = StdioChannel(server(), NAME, on_unsolicited=unsolicited.append)
    async with running(channel):
        quiet = await ask(channel, jsonrpc.request("quiet", "batch", {"count": 2}))
        asking = await ask(
            channel, with_meta("asking", "batch", {meta.LOG_LEVEL: "debug"}, count=2, emit=[log_message("hello")])
        )
        quiet_messages, asking_messages = await collect(quiet), await collect(asking)
    assert asking_messages[0] == log_message("hello") and asking_messages[-1]["id"] == "asking"
    assert [m.get("id") for m in quiet_messages] == ["quiet"]
    assert unsolicited == []


async def test_a_log_goes_to_the_request_that_asked_for_logs_while_a_listen_with_a_log_level_is_open():
    # A legacy session with a log level and a GET stream listens with that level in `_meta`.
    unsolicited: list[JSONDict] = []
    channel = StdioChannel(server(), NAME, on_unsolicited=unsolicited.append)
    async with running(channel):
        listen = await ask(channel, with_meta("listen-1", "subscriptions/listen", {meta.LOG_LEVEL: "debug"}))
        asking = await ask(channel, with_meta("asking", "echo", {meta.LOG_LEVEL: "debug"}, emit=[log_message("mine")]))
        asking_messages = await collect(asking)
        channel.close_route(listen)
    assert asking_messages[0] == log_message("mine") and asking_messages[-1]["id"] == "asking"
    assert unsolicited == []


async def test_a_log_is_attributed_to_nobody_when_two_requests_asked_for_logs():
    unsolicited: list[JSONDict] = []
    channel = StdioChannel(server(), NAME, on_unsolicited=unsolicited.append)
    async with running(channel):
        one = await ask(channel, with_meta(1, "batch", {meta.LOG_LEVEL: "info"}, count=2))
        two = await ask(channel, with_meta(2, "batch", {meta.LOG_LEVEL: "info"}, count=2, emit=[log_message("whose?")]))
        one_messages, two_messages = await collect(one), await collect(two)
    assert [m.get("id") for m in one_messages] == [1]
    assert [m.get("id") for m in two_messages] == [2]
    assert unsolicited == [log_message("whose?")]


async def test_messages_no_route_claims_go_to_on_unsolicited_and_a_late_reply_is_dropped():
    unsolicited: list[JSONDict] = []
    channel = StdioChannel(server(), NAME, on_unsolicited=unsolicited.append)
    unclaimed = [
        jsonrpc.notification("notifications/tools/list_changed"),
        progress("nobody's token"),
        tagged("no-such-listen"),
        log_message("nobody asked"),
        jsonrpc.request("server-1", "sampling/createMessage", {"messages": [], "maxTokens": 1}),
        jsonrpc.request(1, "roots/list"),  # a server request whose id matches ours is still a request
    ]
    late_reply = jsonrpc.result_response("long-gone", {})
    async with running(channel):
        route = await ask(channel, jsonrpc.request(1, "echo", {"emit": [*unclaimed, late_reply]}))
        messages = await collect(route)
    assert [m.get("id") for m in messages] == [1] and "result" in messages[0]
    assert unsolicited == unclaimed


async def test_when_the_child_exits_every_open_route_fails_at_once():
    exited: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
    channel = StdioChannel(server(), NAME, on_exit=exited.set_result)
    async with running(channel):
        routes = [
            await ask(channel, jsonrpc.request("never", "tools/call", {"name": "slow"})),
            await ask(channel, with_meta("held", "batch", {"progressToken": "p"}, count=99)),
            await ask(channel, jsonrpc.request("crash", "crash", {"code": 7})),
        ]
        for route in routes:
            with pytest.raises(UpstreamUnavailable):
                await collect(route)
        async with asyncio.timeout(WAIT):
            assert await exited == 7
        assert not channel.running
        with pytest.raises(ConnectionError):
            await channel.write(jsonrpc.request("after", "echo"))


# ---------------------------------------------------------------- StdioModernUpstream


def modern_upstream(clock: FakeClock | None = None, backoff_max_s: float = 1.0) -> StdioModernUpstream:
    return StdioModernUpstream(NAME, server(), grace_s=GRACE, backoff_max_s=backoff_max_s, clock=clock or FakeClock())


async def test_exchange_yields_the_requests_messages_then_its_reply_like_the_http_upstream():
    clock = FakeClock(42.0)
    upstream = modern_upstream(clock)
    try:
        async with asyncio.timeout(WAIT), upstream.exchange(with_meta(9, "echo", {"progressToken": "t9"})) as reply:
            assert isinstance(reply, StdioReply)
            assert reply.status == 200 and dict(reply.headers) == {}
            messages = [message async for message in reply]
        assert upstream.healthy
    finally:
        await upstream.close()
    assert messages[0] == progress("t9")
    assert messages[1]["id"] == 9 and messages[1]["result"]["echo"] == 9
    assert not upstream.healthy


async def test_concurrent_exchanges_share_one_process():
    upstream = modern_upstream()
    try:
        async with asyncio.timeout(WAIT):
            one, two = await asyncio.gather(
                final(upstream, jsonrpc.request(1, "batch", {"count": 2})),
                final(upstream, jsonrpc.request(2, "batch", {"count": 2})),
            )
    finally:
        await upstream.close()
    assert one["id"] == 1 and two["id"] == 2
    assert one["result"]["pid"] == two["result"]["pid"]


def cancellations(lines: list[str]) -> list[Any]:
    return [
        message["params"]["requestId"]
        for message in map(json.loads, lines)
        if message.get("method") == "notifications/cancelled"
    ]


async def test_leaving_an_exchange_before_its_reply_cancels_the_request_upstream():
    upstream = modern_upstream()
    try:
        async with asyncio.timeout(WAIT):
            async with upstream.exchange(jsonrpc.request("left", "tools/call", {"name": "slow"})):
                pass  # the caller goes away without a reply
            async with upstream.exchange(with_meta("midway", "tools/call", {"progressToken": "m"})) as reply:
                async for message in reply:
                    assert message == progress("m")
                    break  # gone after the first progress notification
        lines = (await final(upstream, jsonrpc.request("dump", "received")))["result"]["lines"]
    finally:
        await upstream.close()
    assert cancellations(lines) == ["left", "midway"]


async def test_leaving_an_exchange_once_its_reply_arrived_cancels_nothing():
    upstream = modern_upstream()
    try:
        await final(upstream, jsonrpc.request("drained", "echo"))
        async with asyncio.timeout(WAIT), upstream.exchange(jsonrpc.request("answered", "echo")) as reply:
            async for message in reply:
                if "method" not in message:
                    break  # left right at the reply, without reading on
        lines = (await final(upstream, jsonrpc.request("dump", "received")))["result"]["lines"]
    finally:
        await upstream.close()
    assert cancellations(lines) == []


async def test_a_crashed_child_fails_its_exchange_and_a_new_child_serves_the_next_one():
    clock = FakeClock()
    upstream = modern_upstream(clock)
    try:
        first = (await final(upstream, jsonrpc.request(1, "echo")))["result"]["pid"]
        with pytest.raises(UpstreamUnavailable):
            await final(upstream, jsonrpc.request(2, "crash"))
        assert not upstream.healthy
        assert not alive(first)
        clock.now += 60  # past any backoff
        second = (await final(upstream, jsonrpc.request(3, "echo")))["result"]["pid"]
        assert upstream.healthy
    finally:
        await upstream.close()
    assert second != first
    assert upstream.restarts == 1
    assert reaped(first) and reaped(second)


async def timed_crash(upstream: StdioModernUpstream) -> float:
    """Seconds an exchange that crashes the (restarted) child takes to fail."""
    started = time.monotonic()
    with pytest.raises(UpstreamUnavailable):
        await final(upstream, jsonrpc.request("boom", "crash"))
    return time.monotonic() - started


# The fake clock stands still unless moved: moving it by (expected delay - LEFT) right after a
# crash leaves a real wait of LEFT if the computed delay is the expected one, none if it is shorter.
LEFT = 0.2


async def test_a_crash_loop_is_delayed_by_a_backoff_that_doubles_with_each_crash():
    clock = FakeClock()
    upstream = modern_upstream(clock, backoff_max_s=10.0)
    try:
        await final(upstream, jsonrpc.request(1, "echo"))
        await timed_crash(upstream)  # crash 1: the first child was healthy, no wait
        for expected in (0.25, 0.5, 1.0):  # before restarts 1, 2, 3
            clock.now += expected - LEFT
            assert await timed_crash(upstream) >= LEFT * 0.9
    finally:
        await upstream.close()
    assert upstream.restarts == 3


async def test_the_crash_backoff_never_exceeds_its_maximum():
    clock = FakeClock()
    upstream = modern_upstream(clock, backoff_max_s=0.25)
    try:
        await final(upstream, jsonrpc.request(1, "echo"))
        await timed_crash(upstream)
        waited = 0.0
        for _ in range(4):  # uncapped, the real waits would be 0.25 + 0.75 + 1.75 + 3.75 s
            clock.now += 0.25
            waited += await timed_crash(upstream)
        assert waited < 3.0
    finally:
        await upstream.close()


async def test_a_reply_resets_the_crash_backoff():
    clock = FakeClock()
    upstream = modern_upstream(clock, backoff_max_s=10.0)
    try:
        await timed_crash(upstream)
        for expected in (0.25, 0.5, 1.0):
            clock.now += expected
            await timed_crash(upstream)
        clock.now += 2.0
        await final(upstream, jsonrpc.request(1, "echo"))  # answered: the child is healthy again
        await timed_crash(upstream)
        clock.now += 0.25  # the first step again; without the reset the real wait would be 7.75 s
        assert await timed_crash(upstream) < 3.0
    finally:
        await upstream.close()


async def test_a_program_that_cannot_be_started_fails_at_once_until_its_backoff_ends_then_is_tried_again(
    tmp_path: Path,
):
    # Waiting out the backoff in each request held it (and those queued behind it) up to
    # restart_backoff_max_s, for the same answer.
    program = tmp_path / "mcp-server"
    starts: list[StdioProcess] = []

    def make(**callbacks: Any) -> StdioProcess:
        starts.append(StdioProcess([str(program)], name=NAME, **callbacks))
        return starts[-1]

    clock = FakeClock()
    upstream = StdioModernUpstream(NAME, make, grace_s=GRACE, backoff_max_s=10.0, clock=clock)
    try:
        for _ in range(3):  # the clock stands still: within the backoff, however long each took
            with pytest.raises(UpstreamUnavailable) as failed:
                await final(upstream, jsonrpc.request(1, "echo"))
            assert "No such file or directory" in str(failed.value)
        assert len(starts) == 1  # tried once; the others were answered without waiting or trying
        program.write_text(f"#!{sys.executable}\n{SERVER}")
        program.chmod(0o755)
        clock.now += 0.25  # the first backoff step
        assert (await final(upstream, jsonrpc.request(2, "echo")))["result"]["echo"] == 2
        assert len(starts) == 2
    finally:
        await upstream.close()


async def test_a_closed_upstream_refuses_new_exchanges():
    upstream = modern_upstream()
    await final(upstream, jsonrpc.request(1, "echo"))
    await upstream.close()
    with pytest.raises(UpstreamUnavailable):
        await final(upstream, jsonrpc.request(2, "echo"))


# ---------------------------------------------------------------- probe_stdio

# The initialize the probe writes unless a client's set it off (relay/assemble.py's: a pooled
# session's of no capabilities).
DEFAULT_HELLO = jsonrpc.request(
    "x",
    "initialize",
    {"protocolVersion": LATEST_LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
)


async def probe(
    env: dict[str, str],
    *,
    script: str = SERVER,
    wait_for_exit: bool = False,
    probe_s: float | None = None,
    brought: Any = None,
    keep: Any = None,
) -> tuple[Detected, StdioChannel]:
    """probe_stdio over a fresh server child; returns the verdict and the channel it used. The
    caller that needs the era brings `brought` (a client's initialize, or None), at once;
    `keep`: the handover's hold (none: the process is stopped)."""
    channels: list[StdioChannel] = []
    hello: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    hello.set_result(brought)

    async def start() -> StdioChannel:
        channel = StdioChannel(server(env, script), NAME)
        channels.append(channel)
        await channel.start()
        if wait_for_exit:
            await channel.process.exited.wait()
        return channel

    try:
        async with asyncio.timeout(WAIT):
            detected = await probe_stdio(
                start,
                PROBE_TIMEOUT if probe_s is None else probe_s,
                {},
                hello,
                default_hello=DEFAULT_HELLO,
                **({"keep": keep} if keep is not None else {}),
            )
    finally:
        for channel in channels:
            await channel.stop(GRACE)
    assert len(channels) == 1
    return detected, channels[0]


def assert_stopped(channel: StdioChannel) -> None:
    pid = channel.process.pid
    assert pid is not None
    assert not channel.running and channel.process.exited.is_set()
    assert not alive(pid) and reaped(pid)


async def test_a_child_answering_the_probe_with_a_discover_result_is_modern(tmp_path: Path):
    record = tmp_path / "received.jsonl"
    result = {"resultType": "complete", "supportedVersions": [*LEGACY_VERSIONS, *MODERN_VERSIONS], "capabilities": {}}
    env = {**discover_reply(jsonrpc.result_response(0, result)), "CHILD_RECORD": str(record)}
    detected, channel = await probe(env)
    assert detected == Detected(Era.MODERN, LATEST_MODERN)
    first_line = json.loads(record.read_text().splitlines()[0])
    assert first_line["method"] == "server/discover"
    assert first_line["params"]["_meta"][meta.PROTOCOL_VERSION] == LATEST_MODERN
    assert_stopped(channel)


async def test_a_child_refusing_the_version_with_a_modern_error_is_modern():
    error = jsonrpc.error_response(0, jsonrpc.UNSUPPORTED_PROTOCOL_VERSION, "no", {"supported": [LATEST_MODERN]})
    detected, channel = await probe(discover_reply(error))
    assert detected.era is Era.MODERN
    assert_stopped(channel)


async def test_a_child_answering_the_probe_with_method_not_found_is_legacy():
    detected, channel = await probe(discover_reply(jsonrpc.error_response(0, jsonrpc.METHOD_NOT_FOUND, "no")))
    assert detected == Detected(Era.LEGACY, None)
    assert_stopped(channel)


async def test_the_probe_writes_a_legacy_initialize_after_server_discover(tmp_path: Path):
    record = tmp_path / "received.jsonl"
    await probe({"CHILD_INITIALIZE": "yes", "CHILD_RECORD": str(record)})
    first, second = (json.loads(line) for line in record.read_text().splitlines()[:2])
    assert (first["method"], second["method"]) == ("server/discover", "initialize")
    assert second["params"]["protocolVersion"] == LATEST_LEGACY
    assert errors(LATEST_LEGACY, "InitializeRequest", second) == []


async def test_a_child_silent_on_server_discover_that_answers_initialize_is_legacy_at_once():
    # Many legacy servers ignore requests before their session (mcp 1.x does): the initialize
    # answer tells without waiting out the start-up bound (300 s here: WAIT fails the test first).
    detected, channel = await probe({"CHILD_INITIALIZE": "yes"}, probe_s=300)
    assert detected == Detected(Era.LEGACY, None)
    assert_stopped(channel)


async def test_a_dual_era_child_answering_both_is_modern_whichever_answer_comes_first():
    result = {"resultType": "complete", "supportedVersions": [*LEGACY_VERSIONS, *MODERN_VERSIONS], "capabilities": {}}
    for order in ("yes", "first"):  # discover answered in order, or after the initialize
        env = {**discover_reply(jsonrpc.result_response(0, result)), "CHILD_INITIALIZE": order}
        detected, channel = await probe(env, probe_s=300)
        assert detected == Detected(Era.MODERN, LATEST_MODERN), order
        assert_stopped(channel)


async def test_a_child_that_never_answers_the_probe_is_legacy_after_the_timeout():
    started = time.monotonic()
    detected, channel = await probe({})
    assert detected == Detected(Era.LEGACY, None, answered=False)  # silence: a guess, warned
    assert time.monotonic() - started >= PROBE_TIMEOUT * 0.9
    assert_stopped(channel)


async def test_a_child_that_dies_on_the_probe_is_legacy():
    detected, channel = await probe({"CHILD_DISCOVER": "crash"})
    assert detected == Detected(Era.LEGACY, None, answered=False)
    assert_stopped(channel)


async def test_a_child_already_gone_when_the_probe_is_written_is_legacy():
    # docs/translation.md §1.4: a process that died on the probe is restarted and spoken to with initialize.
    detected, channel = await probe({}, script="raise SystemExit(2)", wait_for_exit=True)
    assert detected == Detected(Era.LEGACY, None, answered=False)
    assert_stopped(channel)


CLIENT_HELLO = jsonrpc.request(
    0,
    "initialize",
    {
        "protocolVersion": LATEST_LEGACY,
        "capabilities": {"sampling": {}},
        "clientInfo": {"name": "host", "version": "2"},
    },
)


async def test_the_probe_writes_the_initialize_a_legacy_client_brought(tmp_path: Path):
    record = tmp_path / "received.jsonl"
    await probe({"CHILD_INITIALIZE": "yes", "CHILD_RECORD": str(record)}, brought=CLIENT_HELLO)
    first, second = (json.loads(line) for line in record.read_text().splitlines()[:2])
    assert (first["method"], second["method"]) == ("server/discover", "initialize")
    assert second["params"] == CLIENT_HELLO["params"]


async def test_a_probe_nobody_brought_anything_to_writes_no_initialize_to_a_server_answering_discover(
    tmp_path: Path,
):
    """At start nobody needs the era yet: a server that answers server/discover before its session
    is legacy without an initialize, and kept so (any first session may take it)."""
    record = tmp_path / "received.jsonl"
    env = {**discover_reply(jsonrpc.error_response(0, jsonrpc.METHOD_NOT_FOUND, "no")), "CHILD_RECORD": str(record)}
    kept: list[dict[str, Any]] = []

    async def start() -> StdioChannel:
        channel = StdioChannel(server(env), NAME)
        await channel.start()
        return channel

    nobody: asyncio.Future[Any] = asyncio.get_running_loop().create_future()  # never resolved
    async with asyncio.timeout(WAIT):
        detected = await probe_stdio(
            start, 300, {}, nobody, default_hello=DEFAULT_HELLO, keep=lambda channel, **held: kept.append(held) or False
        )
    assert detected == Detected(Era.LEGACY, None)
    assert [json.loads(line)["method"] for line in record.read_text().splitlines()] == ["server/discover"]
    assert kept == [{"modern": False, "hello": None, "answer": None}]


async def test_the_probe_s_process_goes_to_the_first_user_it_fits_and_an_unclaimed_one_is_stopped():
    handover = ProbeHandover(NAME, GRACE, keep_s=0.2)
    channels: list[StdioChannel] = []

    async def start(env: dict[str, str]) -> StdioChannel:
        channel = StdioChannel(server(env), NAME)
        channels.append(channel)
        await channel.start()
        return channel

    legacy = {"CHILD_INITIALIZE": "yes"}
    modern = {
        **discover_reply(jsonrpc.result_response(0, {"resultType": "complete", "supportedVersions": [LATEST_MODERN]})),
        "CHILD_INITIALIZE": "refuse",
    }
    try:
        async with asyncio.timeout(WAIT):
            # A legacy server initialized with a client's initialize: that client's, with the answer.
            brought: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            brought.set_result(CLIENT_HELLO)
            await probe_stdio(lambda: start(legacy), 0.3, {}, brought, default_hello=DEFAULT_HELLO, keep=handover.hold)
            assert handover.take_modern() is None
            assert handover.take_legacy(DEFAULT_HELLO) is None  # another session's initialize
            taken = handover.take_legacy(CLIENT_HELLO)
            assert taken is not None and taken[0] is channels[0] and taken[0].running
            assert taken[1] is not None and taken[1]["result"]["protocolVersion"] == LATEST_LEGACY
            assert taken[1]["id"] == CLIENT_HELLO["id"]  # the answer to the client's own request
            assert handover.take_legacy(CLIENT_HELLO) is None  # taken once
            # A 2026-07-28 server: the shared process's.
            await probe_stdio(lambda: start(modern), 0.3, {}, brought, default_hello=DEFAULT_HELLO, keep=handover.hold)
            assert handover.take_legacy(CLIENT_HELLO) is None
            assert handover.take_modern() is channels[1]
            # Unclaimed: stopped after keep_s.
            await probe_stdio(lambda: start(modern), 0.3, {}, brought, default_hello=DEFAULT_HELLO, keep=handover.hold)
            await channels[2].process.exited.wait()
            assert handover.take_modern() is None
            assert channels[0].running and channels[1].running  # the taken ones live on
            await handover.close()
    finally:
        for channel in channels:
            await channel.stop(GRACE)


async def test_a_dual_era_server_that_took_the_probe_s_initialize_is_not_given_to_the_shared_process():
    """Its process is a legacy session now (a 2026-07-28 request on it is refused): stopped, and
    the shared process starts afresh; a 2026-07-28-only server's, which refused it, is given."""
    handover = ProbeHandover(NAME, GRACE)
    result = {"resultType": "complete", "supportedVersions": [*LEGACY_VERSIONS, *MODERN_VERSIONS], "capabilities": {}}
    channels: list[StdioChannel] = []

    async def start() -> StdioChannel:
        channel = StdioChannel(
            server({**discover_reply(jsonrpc.result_response(0, result)), "CHILD_INITIALIZE": "yes"}), NAME
        )
        channels.append(channel)
        await channel.start()
        return channel

    brought: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    brought.set_result(None)
    try:
        async with asyncio.timeout(WAIT):
            detected = await probe_stdio(start, 300, {}, brought, default_hello=DEFAULT_HELLO, keep=handover.hold)
        assert detected.era is Era.MODERN
        assert handover.take_modern() is None
        assert_stopped(channels[0])
    finally:
        await handover.close()
        for channel in channels:
            await channel.stop(GRACE)


async def test_a_process_replaced_in_the_handover_does_not_take_its_successor_with_it_as_it_exits():
    handover = ProbeHandover(NAME, GRACE)
    channels = [StdioChannel(server({}), NAME) for _ in range(2)]
    try:
        async with asyncio.timeout(WAIT):
            for channel in channels:
                await channel.start()
            assert handover.hold(channels[0], modern=True, hello=None, answer=None)
            assert handover.hold(channels[1], modern=True, hello=None, answer=None)  # the first is stopped
            await channels[0].process.exited.wait()
            assert handover.take_modern() is channels[1]
    finally:
        await handover.close()
        for channel in channels:
            await channel.stop(GRACE)
