"""The cached upstream era and when it is probed again (proxy/relay/detect.py EraDetector; docs/translation.md §1.5)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import structlog

from proxy.protocol.detection import Detected, era_from_reply
from proxy.protocol.versions import LATEST_MODERN, Era
from proxy.relay.detect import EraDetector
from proxy.upstream.errors import UpstreamHTTPError, UpstreamUnavailable

WAIT = 5.0
MODERN = Detected(Era.MODERN, LATEST_MODERN)
LEGACY = Detected(Era.LEGACY, None)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeProbe:
    """Answers with the queued outcomes in order (an exception is raised); counts its calls.

    With `hold=True` every call waits for `release` so that callers can pile up behind it.
    """

    def __init__(self, *outcomes: Detected | BaseException, hold: bool = False) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0
        self.credentials: list[dict[str, str]] = []
        self.hellos: list[object] = []
        self.hold = hold
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, credentials=None, hello=None) -> Detected:
        self.calls += 1
        self.credentials.append(dict(credentials or {}))
        self.started.set()
        if self.hold:
            await self.release.wait()
        # What the first caller that needed the era brought (a stdio probe writes it), if anyone did.
        self.hellos.append(hello.result() if hello is not None and hello.done() else "nothing")
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def detector_with(
    probe: FakeProbe,
    configured: str = "auto",
    clock: FakeClock | None = None,
    on_change: Callable[[Era], None] = lambda era: None,
) -> EraDetector:
    return EraDetector(configured, probe, clock=clock or FakeClock(), on_change=on_change)


@pytest.mark.parametrize("configured", [Era.MODERN.value, Era.LEGACY.value])
async def test_a_configured_era_is_used_without_ever_probing(configured):
    probe = FakeProbe()
    changes: list[Era] = []
    detector = detector_with(probe, configured, on_change=changes.append)
    assert detector.era is Era(configured)
    async with asyncio.timeout(WAIT):
        assert await detector.current() is Era(configured)
        assert await detector.current() is Era(configured)
    assert probe.calls == 0
    assert changes == []


@pytest.mark.parametrize("configured", [Era.MODERN.value, Era.LEGACY.value])
async def test_suspecting_a_configured_era_changes_nothing(configured):
    probe = FakeProbe()
    detector = detector_with(probe, configured)
    detector.suspect("an answer that did not fit")
    assert detector.era is Era(configured)
    async with asyncio.timeout(WAIT):
        assert await detector.current() is Era(configured)
    assert probe.calls == 0


async def test_auto_knows_no_era_until_the_first_call_probes_once_and_caches_it():
    clock = FakeClock(1234.5)
    probe = FakeProbe(MODERN)
    detector = detector_with(probe, clock=clock)
    assert detector.era is None and detector.probed_at is None
    assert probe.calls == 0
    async with asyncio.timeout(WAIT):
        assert await detector.current() is Era.MODERN
        clock.now += 60
        assert await detector.current() is Era.MODERN
    assert probe.calls == 1
    assert detector.era is Era.MODERN
    assert detector.probed_at == 1234.5


async def test_concurrent_first_calls_share_a_single_probe():
    probe = FakeProbe(LEGACY, MODERN, hold=True)
    detector = detector_with(probe)
    async with asyncio.timeout(WAIT):
        callers = [asyncio.create_task(detector.current()) for _ in range(5)]
        await probe.started.wait()  # the first caller is probing; the others queued behind it
        assert not any(task.done() for task in callers)
        probe.release.set()
        eras = await asyncio.gather(*callers)
    assert eras == [Era.LEGACY] * 5
    assert probe.calls == 1


async def test_a_suspected_era_is_probed_again_on_the_next_call_only():
    clock = FakeClock(10.0)
    probe = FakeProbe(MODERN, LEGACY)
    detector = detector_with(probe, clock=clock)
    async with asyncio.timeout(WAIT):
        assert await detector.current() is Era.MODERN
        detector.suspect("legacy-looking 4xx")
        assert probe.calls == 1  # suspecting does not probe by itself
        clock.now = 20.0
        assert await detector.current() is Era.LEGACY
        assert await detector.current() is Era.LEGACY
    assert probe.calls == 2
    assert detector.probed_at == 20.0


async def test_suspecting_before_anything_was_detected_is_harmless():
    probe = FakeProbe(MODERN)
    detector = detector_with(probe)
    detector.suspect("too early")
    async with asyncio.timeout(WAIT):
        assert await detector.current() is Era.MODERN
    assert probe.calls == 1


async def test_on_change_fires_with_the_era_first_detected():
    changes: list[Era] = []
    detector = detector_with(FakeProbe(MODERN), on_change=changes.append)
    async with asyncio.timeout(WAIT):
        await detector.current()
        await detector.current()
    assert changes == [Era.MODERN]


async def test_on_change_does_not_fire_when_a_re_probe_finds_the_same_era():
    probe = FakeProbe(MODERN, MODERN)
    changes: list[Era] = []
    detector = detector_with(probe, on_change=changes.append)
    async with asyncio.timeout(WAIT):
        await detector.current()
        changes.clear()  # the first detection's
        detector.suspect("a hiccup")
        assert await detector.current() is Era.MODERN
    assert probe.calls == 2
    assert changes == []


async def test_on_change_fires_when_a_re_probe_finds_another_era():
    changes: list[Era] = []
    detector = detector_with(FakeProbe(MODERN, LEGACY), on_change=changes.append)
    async with asyncio.timeout(WAIT):
        await detector.current()
        changes.clear()  # the first detection's
        detector.suspect("the upstream was replaced")
        await detector.current()
    assert changes == [Era.LEGACY]


async def test_a_failing_probe_propagates_and_the_next_call_probes_again():
    probe = FakeProbe(UpstreamUnavailable("up", "did not answer the era probe in time"), LEGACY)
    changes: list[Era] = []
    detector = detector_with(probe, on_change=changes.append)
    async with asyncio.timeout(WAIT):
        with pytest.raises(UpstreamUnavailable):
            await detector.current()
        assert detector.era is None and detector.probed_at is None
        assert changes == []
        assert await detector.current() is Era.LEGACY
    assert probe.calls == 2
    assert changes == [Era.LEGACY]


async def test_a_caller_queued_behind_a_failing_probe_probes_again_itself():
    probe = FakeProbe(UpstreamUnavailable("up", "down"), MODERN, hold=True)
    detector = detector_with(probe)
    async with asyncio.timeout(WAIT):
        first = asyncio.create_task(detector.current())
        await probe.started.wait()
        second = asyncio.create_task(detector.current())
        probe.release.set()
        with pytest.raises(UpstreamUnavailable):
            await first
        assert await second is Era.MODERN
    assert probe.calls == 2


async def test_an_upstream_refusing_an_anonymous_probe_is_probed_again_with_the_callers_token():
    # An OAuth-protected server of either era answers 401 before it reads the body: its era is
    # unknown until a caller's token is sent, and the 401 is the caller's to see (its challenge).
    refusal = UpstreamHTTPError("up", 401, b"{}", 'Bearer resource_metadata="http://u/.well-known/x"')
    probe = FakeProbe(refusal, MODERN)
    detector = detector_with(probe)
    with pytest.raises(UpstreamHTTPError) as raised:
        await detector.current()
    assert raised.value.status == 401 and detector.known is None  # nothing cached
    token = {"Authorization": "Bearer t"}
    assert await detector.current(token) is Era.MODERN
    assert await detector.current() is Era.MODERN  # cached: no third probe
    assert probe.credentials == [{}, token]


@pytest.mark.parametrize(
    ("found", "level"),
    [(LEGACY, "info"), (MODERN, "info"), (Detected(Era.LEGACY, None, answered=False), "warning")],
    ids=["legacy", "modern", "no-json-rpc-answer"],
)
async def test_an_upstream_that_answered_no_json_rpc_is_taken_for_legacy_with_a_warning(found, level):
    # A plain web server (an HTML page, a 404) says nothing of an era: legacy is a guess, and the
    # operator is told it may not be an MCP endpoint at all.
    detector = detector_with(FakeProbe(found))
    with structlog.testing.capture_logs() as logs:
        async with asyncio.timeout(WAIT):
            assert await detector.current() is found.era
    [event] = [e for e in logs if e["event"] == "upstream_era_detected"]
    assert event["log_level"] == level
    assert ("MCP endpoint" in event.get("reason", "")) is (level == "warning")


@pytest.mark.parametrize("configured", [Era.MODERN.value, Era.LEGACY.value])
async def test_a_configured_era_the_upstream_contradicts_is_a_mismatch_until_confirmed(configured):
    detector = detector_with(FakeProbe(), configured)
    assert detector.mismatch is None
    with structlog.testing.capture_logs() as logs:
        detector.suspect("initialize refused by a 2026-07-28 server")
        detector.suspect("again")
    assert detector.mismatch is not None and f"upstream.era is {configured}" in detector.mismatch
    assert [e["event"] for e in logs] == ["upstream_era_mismatch"]  # once, not at every answer
    detector.confirm()
    assert detector.mismatch is None


def test_only_a_json_rpc_answer_counts_as_an_answer():
    assert era_from_reply(None).answered is False
    assert era_from_reply({"jsonrpc": "2.0", "id": 1, "error": {"code": -32600, "message": "no session"}}).answered


async def test_a_caller_that_stops_waiting_leaves_the_probe_running_for_the_next_one():
    """A readiness poll gives up after its own timeout: the probe (a stdio server that takes long
    to start) goes on, and the next caller gets its answer without starting another."""
    probe = FakeProbe(LEGACY, hold=True)
    detector = detector_with(probe)
    impatient = asyncio.ensure_future(detector.current())
    async with asyncio.timeout(WAIT):
        await probe.started.wait()
    impatient.cancel()
    await asyncio.gather(impatient, return_exceptions=True)
    probe.release.set()
    async with asyncio.timeout(WAIT):
        assert await detector.current() is Era.LEGACY
    assert probe.calls == 1


async def test_closing_the_detector_stops_a_probe_still_running():
    probe = FakeProbe(LEGACY, hold=True)
    detector = detector_with(probe)
    waiting = asyncio.ensure_future(detector.current())
    async with asyncio.timeout(WAIT):
        await probe.started.wait()
        await detector.close()
        with pytest.raises(asyncio.CancelledError):
            await waiting


HELLO = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"capabilities": {"roots": {}}}}


async def test_the_first_caller_that_needs_the_era_brings_its_message_to_the_probe_a_watcher_nothing():
    probe = FakeProbe(LEGACY, LEGACY, LEGACY, hold=True)
    detector = detector_with(probe)
    async with asyncio.timeout(WAIT):
        early = asyncio.create_task(detector.current(needs=False))  # at start: nobody needs it yet
        await probe.started.wait()
        client = asyncio.create_task(detector.current({}, HELLO))  # a legacy client's initialize, meanwhile
        ready = asyncio.create_task(detector.current())  # readiness, after it: the first one's stays
        await asyncio.sleep(0)
        probe.release.set()
        assert await asyncio.gather(early, client, ready) == [Era.LEGACY] * 3
        detector.suspect("a refusal")
        probe.started.clear()
        watcher = asyncio.create_task(detector.current(needs=False))
        await probe.started.wait()
        assert await watcher is Era.LEGACY
        detector.suspect("a refusal")
        assert await detector.current() is Era.LEGACY  # needs it, brings nothing of its own: None
    assert probe.hellos == [HELLO, "nothing", None]
