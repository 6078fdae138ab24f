"""The one legacy session host (proxy/relay/legacy_sessions.py): one behaviour whatever the backend.

The backend here is a stand-in recording what the host asks of it; the real backends are tested
through HTTP (tests/integration) and against real servers (tests/e2e).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from structlog.testing import capture_logs

from proxy.config import load_settings
from proxy.errors import ProxyError
from proxy.metrics import Metrics
from proxy.protocol import jsonrpc
from proxy.relay.legacy_sessions import LegacySessionHost, Opened
from proxy.relay.runtime import SessionRuntime
from proxy.state.sealing import Sealer
from proxy.state.sessions import InMemorySessionStore, LegacySession, SessionIds, principal_of

ALICE = principal_of("Bearer alice")
WAIT = 5.0
INITIALIZE = jsonrpc.request(0, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}})


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Backend:
    """Records the host's calls; `durable` as the test needs."""

    def __init__(self, *, durable: bool) -> None:
        self.durable = durable
        self.live_at_open: str | None = "live-part"
        self.calls: list[tuple[str, Any]] = []
        self.lost: dict[str, Any] = {}
        self.block = asyncio.Event()
        self.started_request = asyncio.Event()

    async def open(self, message: dict[str, Any], principal: str, auth_headers: dict[str, str]) -> Opened[str]:
        return Opened(
            {"protocolVersion": "2025-11-25"}, "2025-11-25", self.live_at_open, log_fields={"backend": "test"}
        )

    def started(self, runtime: SessionRuntime[str], lost: Any) -> None:
        self.lost[runtime.session_id] = lost

    def revive(self, session: LegacySession) -> str | None:
        return "revived" if self.durable else None

    async def request(self, session: LegacySession, runtime: Any, message: Any, channel: Any, auth: Any) -> Any:
        self.calls.append(("request", message["id"]))
        self.started_request.set()
        await self.block.wait()
        return jsonrpc.result_response(message["id"], {})

    async def notify(self, session: LegacySession, runtime: Any, message: dict[str, Any]) -> None:
        self.calls.append(("notify", message["method"]))

    async def respond(self, session: LegacySession, runtime: Any, message: dict[str, Any]) -> bool:
        self.calls.append(("respond", message["id"]))
        return True

    def get_stream_opened(self, session: LegacySession, runtime: Any, moved: bool, auth_headers: Any) -> None:
        self.calls.append(("get_stream", session.id))

    async def close(self, runtime: SessionRuntime[str]) -> None:
        self.calls.append(("close", runtime.live))


def make(
    *, durable: bool, max_live: int | None = None, idle_timeout_s: float | None = None, **settings: Any
) -> tuple[LegacySessionHost[str], Backend, Metrics, Clock]:
    backend, metrics, clock = Backend(durable=durable), Metrics(), Clock()
    config = load_settings(None, **{"upstream.url": "http://127.0.0.1:9/mcp", **settings})
    ids = SessionIds(Sealer(b"k" * 32, clock=clock), config.sessions.max_lifetime_s, clock)
    host = LegacySessionHost(
        backend, config, InMemorySessionStore(), ids, metrics, clock, max_live=max_live, idle_timeout_s=idle_timeout_s
    )
    return host, backend, metrics, clock


def value(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(f"mcp_era_proxy_{name}", labels) or 0.0


BOTH = pytest.mark.parametrize("durable", [True, False], ids=["durable", "process"])


@BOTH
async def test_initialize_without_params_is_invalid_params_for_every_backend(durable: bool) -> None:
    host, *_ = make(durable=durable)
    with pytest.raises(ProxyError) as refused:
        await host.initialize({**INITIALIZE, "params": None}, ALICE, {})
    assert refused.value.code == jsonrpc.INVALID_PARAMS


@BOTH
async def test_a_session_idle_too_long_is_gone_on_lookup_and_counted_as_expired(durable: bool) -> None:
    host, _, metrics, clock = make(durable=durable, **{"sessions.idle_timeout_s": 10})
    _, session_id = await host.initialize(INITIALIZE, ALICE, {})
    clock.now += 11
    assert await host.resolve(session_id, ALICE) is None
    assert value(metrics, "sessions_expired_total") == 1
    assert value(metrics, "sessions_open", downstream_era="legacy") == 0


@BOTH
async def test_reaping_closes_sessions_past_their_lifetime_then_idle_ones_but_not_busy_ones(durable: bool) -> None:
    host, backend, metrics, clock = make(
        durable=durable, **{"sessions.idle_timeout_s": 10, "sessions.max_lifetime_s": 100}
    )
    _, old = await host.initialize(INITIALIZE, ALICE, {})
    clock.now += 50
    _, idle = await host.initialize(INITIALIZE, ALICE, {})
    _, busy = await host.initialize(INITIALIZE, ALICE, {})
    session = await host.resolve(busy, ALICE)
    assert session is not None
    await host.open_get_stream(session)
    clock.now += 60  # old: past its lifetime; idle and busy: idle for 60 s
    assert await host.reap() == 2
    assert value(metrics, "sessions_expired_total") == 2
    assert await host.resolve(busy, ALICE) is not None  # seen now: not reaped the moment it goes idle
    assert await host.resolve(old, ALICE) is None and await host.resolve(idle, ALICE) is None
    assert ("get_stream", busy) in backend.calls


async def test_shutdown_keeps_durable_sessions_in_the_store_and_closes_process_sessions() -> None:
    durable_host, durable_backend, _, _ = make(durable=True)
    _, kept = await durable_host.initialize(INITIALIZE, ALICE, {})
    process_host, process_backend, metrics, _ = make(durable=False)
    _, gone = await process_host.initialize(INITIALIZE, ALICE, {})
    with capture_logs() as logs:
        await durable_host.close_all()
        await process_host.close_all()
    assert ("close", "live-part") in durable_backend.calls and ("close", "live-part") in process_backend.calls
    assert await durable_host.resolve(kept, ALICE) is not None  # revived from the store
    assert await process_host.resolve(gone, ALICE) is None
    assert [(e["event"], e["reason"]) for e in logs if e["event"] == "session_closed"] == [
        ("session_closed", "shutdown")
    ]
    assert value(metrics, "sessions_open", downstream_era="legacy") == 0


async def test_a_session_with_nothing_live_at_open_costs_no_runtime_until_its_first_use() -> None:
    host, backend, _, _ = make(durable=True)
    backend.live_at_open = None  # as the translating backend: an idle session is only its record
    _, session_id = await host.initialize(INITIALIZE, ALICE, {})
    assert host._runtimes == {}
    session = await host.resolve(session_id, ALICE)
    assert session is not None and host._runtimes[session_id].live == "revived"


async def test_a_session_whose_runtime_cannot_be_rebuilt_here_is_not_found() -> None:
    host, *_ = make(durable=False)
    _, session_id = await host.initialize(INITIALIZE, ALICE, {})
    host._runtimes.clear()  # as if another process had minted it
    assert await host.resolve(session_id, ALICE) is None


async def test_a_session_its_backend_loses_is_closed() -> None:
    host, backend, metrics, _ = make(durable=False)
    _, session_id = await host.initialize(INITIALIZE, ALICE, {})
    backend.lost[session_id]("exited")
    async with asyncio.timeout(WAIT):
        await host.tasks.drain()
    assert await host.resolve(session_id, ALICE) is None
    assert value(metrics, "sessions_open", downstream_era="legacy") == 0


async def test_a_cancelled_request_ends_without_a_reply_and_the_backend_is_told() -> None:
    host, backend, _, _ = make(durable=False)
    _, session_id = await host.initialize(INITIALIZE, ALICE, {})
    session = await host.resolve(session_id, ALICE)
    assert session is not None
    running = asyncio.create_task(host.handle_request(session, jsonrpc.request(7, "tools/call"), None, {}))  # type: ignore[arg-type]
    async with asyncio.timeout(WAIT):
        await backend.started_request.wait()
        await host.handle_notification(session, jsonrpc.notification("notifications/cancelled", {"requestId": 7}))
        assert await running is None
    assert ("notify", "notifications/cancelled") in backend.calls


async def test_a_request_id_already_in_flight_and_too_many_requests_are_refused() -> None:
    host, backend, _, _ = make(durable=True, **{"sessions.max_inflight_requests": 1})
    _, session_id = await host.initialize(INITIALIZE, ALICE, {})
    session = await host.resolve(session_id, ALICE)
    assert session is not None
    running = asyncio.create_task(host.handle_request(session, jsonrpc.request(1, "tools/call"), None, {}))  # type: ignore[arg-type]
    async with asyncio.timeout(WAIT):
        await backend.started_request.wait()
        with pytest.raises(ProxyError) as refused:
            await host.handle_request(session, jsonrpc.request(2, "tools/call"), None, {})  # type: ignore[arg-type]
        assert refused.value.code == jsonrpc.LIMIT_EXCEEDED
        backend.block.set()
        assert await running == jsonrpc.result_response(1, {})


async def test_initialized_is_remembered_and_responses_go_to_the_backend() -> None:
    host, backend, _, _ = make(durable=True)
    _, session_id = await host.initialize(INITIALIZE, ALICE, {})
    session = await host.resolve(session_id, ALICE)
    assert session is not None
    await host.handle_notification(session, jsonrpc.notification("notifications/initialized"))
    assert session.initialized
    assert await host.handle_response(session, jsonrpc.result_response(3, {}))
    assert ("respond", 3) in backend.calls


# ---------------------------------------------------------------- a bound on live runtimes (processes)


@BOTH
async def test_at_the_live_bound_the_least_recently_used_idle_runtime_makes_room(durable: bool) -> None:
    host, backend, metrics, clock = make(durable=durable, max_live=2)
    _, first = await host.initialize(INITIALIZE, ALICE, {})
    _, second = await host.initialize(INITIALIZE, ALICE, {})
    clock.now += 5
    assert await host.resolve(first, ALICE) is not None  # the first is the most recently used now
    with capture_logs() as logs:
        _, third = await host.initialize(INITIALIZE, ALICE, {})
    assert set(host._runtimes) == {first, third}
    assert backend.calls.count(("close", "live-part")) == 1  # released before the third was opened
    if durable:  # its record stays; its runtime is made again on its next request
        assert await host.resolve(second, ALICE) is not None
        assert not [e for e in logs if e["event"] == "session_closed"]
    else:  # a process: the session ends with it
        assert await host.resolve(second, ALICE) is None
        assert [e["reason"] for e in logs if e["event"] == "session_closed"] == ["evicted"]
        assert value(metrics, "sessions_open", downstream_era="legacy") == 2


@BOTH
async def test_at_the_live_bound_with_every_runtime_busy_a_new_session_gets_503(durable: bool) -> None:
    host, backend, _, _ = make(durable=durable, max_live=1)
    _, first = await host.initialize(INITIALIZE, ALICE, {})
    session = await host.resolve(first, ALICE)
    assert session is not None
    stream = await host.open_get_stream(session)
    with pytest.raises(ProxyError) as refused:
        await host.initialize(INITIALIZE, ALICE, {})
    assert (refused.value.code, refused.value.status) == (jsonrpc.LIMIT_EXCEEDED, 503)
    assert "busy" in refused.value.message
    assert list(host._runtimes) == [first] and ("close", "live-part") not in backend.calls
    host.close_get_stream(first, stream)  # idle again: it makes room for the next one
    _, second = await host.initialize(INITIALIZE, ALICE, {})
    assert list(host._runtimes) == [second]


async def test_sessions_being_opened_count_against_the_live_bound() -> None:
    host, backend, _, _ = make(durable=False, max_live=1)
    opening = asyncio.Event()
    release = asyncio.Event()
    open_session = backend.open

    async def slow_open(*args: Any) -> Opened[str]:
        opening.set()
        await release.wait()
        return await open_session(*args)

    backend.open = slow_open  # type: ignore[method-assign]
    first = asyncio.create_task(host.initialize(INITIALIZE, ALICE, {}))
    async with asyncio.timeout(WAIT):
        await opening.wait()
        with pytest.raises(ProxyError) as refused:  # nothing to evict: the one slot is being filled
            await host.initialize(INITIALIZE, ALICE, {})
        release.set()
        await first
    assert refused.value.status == 503
    assert len(host._runtimes) == 1


async def test_a_shorter_idle_timeout_of_the_host_expires_its_sessions_sooner() -> None:
    host, _, metrics, clock = make(durable=False, idle_timeout_s=60, **{"sessions.idle_timeout_s": 1800})
    assert host.idle_timeout_s == 60
    _, idle = await host.initialize(INITIALIZE, ALICE, {})
    _, used = await host.initialize(INITIALIZE, ALICE, {})
    clock.now += 59
    assert await host.resolve(used, ALICE) is not None
    clock.now += 2
    assert await host.reap() == 1
    assert await host.resolve(idle, ALICE) is None and await host.resolve(used, ALICE) is not None
    assert value(metrics, "sessions_expired_total") == 1
    # never longer than the sessions' own
    assert make(durable=False, idle_timeout_s=3600, **{"sessions.idle_timeout_s": 1800})[0].idle_timeout_s == 1800
