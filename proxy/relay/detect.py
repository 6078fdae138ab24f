"""Upstream era detection, cached per upstream and repeated when the assumption stops holding."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from ..protocol.detection import Detected, era_from_reply, probe_request
from ..protocol.legacy_to_modern import upstream_headers
from ..protocol.versions import LATEST_MODERN, Era
from ..upstream.base import Upstream
from ..upstream.errors import UpstreamError, UpstreamHTTPError, UpstreamProtocolError
from .scopes import SharedRun

JSONDict = dict[str, Any]
log = structlog.get_logger(__name__)
# A probe gets the credentials of the request that needs the era (none at start): a protected
# upstream answers an anonymous probe with 401, which says nothing of its era. And a future the
# first caller that needs the era resolves with its message, when that is a legacy client's
# `initialize` (None otherwise): a stdio probe writes it after its server/discover, and the server
# it started may then serve that client (upstream/stdio.py ProbeHandover).
Probe = Callable[[Mapping[str, str], "asyncio.Future[JSONDict | None]"], Awaitable[Detected]]
_NO_CREDENTIALS: Mapping[str, str] = {}


class EraDetector:
    def __init__(
        self,
        configured: str,
        probe: Probe,
        clock: Callable[[], float] = time.monotonic,
        *,
        on_change: Callable[[Era], None] = lambda era: None,
    ) -> None:
        """`on_change(era)`: called when a probe finds another era than the one last known."""
        self._configured = configured
        self._probe = probe
        self._clock = clock
        self._detected: Detected | None = None if configured == "auto" else Detected(Era(configured), None)
        self._last: Era | None = self._detected.era if self._detected is not None else None  # survives suspect()
        self._lock = asyncio.Lock()
        self._probing = SharedRun[Detected](self._probed)  # the probe running, owned here
        self.probed_at: float | None = None
        self._on_change = on_change
        # With a configured era: why the upstream seems to speak the other one (readiness says so).
        self.mismatch: str | None = None
        # The running probe's: what the first caller that needs the era brings (see Probe); and
        # what a caller brought before a probe ran, for the next one.
        self._hello: asyncio.Future[JSONDict | None] | None = None
        self._brought: tuple[JSONDict | None] | None = None

    @property
    def era(self) -> Era | None:
        """The era as last known (None before the first successful probe)."""
        return self._last

    @property
    def known(self) -> Era | None:
        """The era to use now without probing, if there is one (None: await current())."""
        detected = self._detected
        return detected.era if detected is not None else None

    async def current(
        self, credentials: Mapping[str, str] = _NO_CREDENTIALS, hello: JSONDict | None = None, *, needs: bool = True
    ) -> Era:
        """The era, probing with `credentials` (the caller's Authorization, when it may go upstream)
        if it is not known; an upstream that refuses them raises its UpstreamHTTPError (401/403),
        nothing cached, so the client authenticates and the next request probes again. `hello`:
        the caller's legacy `initialize`, if that is what it sent; `needs`: False for a caller that
        only learns the era early (at start), and brings nothing to the probe.

        The probe is the detector's own task: a caller that stops waiting (a readiness poll's
        timeout) leaves it running, and the next caller waits for that one. Cancelling it would
        kill a stdio server still starting (`npx` installing) and start another at the next poll."""
        detected = self._detected
        if detected is not None:
            return detected.era
        if needs:
            self._bring(hello)
        async with self._lock:
            if self._detected is None:
                await self._probing.join(lambda: self._probe(credentials, self._new_hello()))
            assert self._detected is not None  # set by _probed when the probe succeeded
            return self._detected.era

    def _bring(self, hello: JSONDict | None) -> None:
        """The first caller's message reaches the running probe, or the next one."""
        future = self._hello
        if future is not None:
            if not future.done():
                future.set_result(hello)
        elif self._brought is None:
            self._brought = (hello,)

    def _new_hello(self) -> asyncio.Future[JSONDict | None]:
        """A probe starts: its future, resolved at once if a caller brought something already."""
        future = self._hello = asyncio.get_running_loop().create_future()
        if self._brought is not None:
            future.set_result(self._brought[0])
            self._brought = None
        return future

    def _probed(self, probing: asyncio.Future[Detected]) -> None:
        self._hello = None
        if probing.cancelled() or probing.exception() is not None:
            return  # raised to its callers (if any still wait); the next call probes again
        found = probing.result()
        previous, self._last = self._last, found.era
        self._detected, self.probed_at = found, self._clock()
        if found.answered:
            log.info("upstream_era_detected", era=found.era.value, version=found.version)
        else:
            log.warning(
                "upstream_era_detected",
                era=found.era.value,
                version=None,
                reason="no JSON-RPC answer to the era probe: taken for legacy; is it an MCP endpoint?",
            )
        if found.era != previous:
            self._on_change(found.era)

    async def close(self) -> None:
        """Shutdown: a probe still running is stopped (and its stdio server with it)."""
        await self._probing.aclose()

    def suspect(self, reason: str) -> None:
        """An answer did not fit the era: detected, probe again before the next request; configured,
        nothing here can serve (readiness fails with `mismatch` until a probe of that era works)."""
        if self._configured == "auto":
            if self._detected is not None:
                log.warning("upstream_era_suspect", era=self._detected.era.value, reason=reason)
                self._detected = None
            return
        if self.mismatch is None:
            other = "legacy" if self._configured == "modern" else "2026-07-28"
            self.mismatch = (
                f"upstream.era is {self._configured}, but the upstream answers as a {other} server "
                f"({reason}): set upstream.era to auto, or to the server's era"
            )
            log.warning("upstream_era_mismatch", configured=self._configured, reason=reason)

    def confirm(self) -> None:
        """A probe in the configured era worked: a mismatch seen before is over."""
        if self.mismatch is not None:
            log.info("upstream_era_mismatch_cleared", configured=self._configured)
            self.mismatch = None


class Handshakes:
    """Whether the upstream's era handshake works now: a legacy `initialize` (and its end), or
    `server/discover`. Readiness (downstream/admin.py) reports it: a handshake that worked within
    `readiness.window_s` counts, and any that failed since (a readiness probe's, or a request's: a
    pooled session's `initialize`, the discover a legacy client's `initialize` is answered from)
    makes the proxy not ready, with the reason, until one works again. A refusal of the caller's
    credentials (401, 403) says nothing of the upstream: not counted."""

    def __init__(self, upstream: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._upstream = upstream
        self._clock = clock
        self.worked_at: float | None = None
        self.failing: str | None = None  # why the latest handshake failed, while none worked since

    def worked(self) -> None:
        self.worked_at = self._clock()
        if self.failing is not None:
            log.info("upstream_handshake_recovered", upstream=self._upstream)
            self.failing = None

    def failed(self, exc: BaseException) -> None:
        """A handshake ended with `exc`: counted unless it refused the caller's credentials."""
        if isinstance(exc, UpstreamHTTPError) and exc.status in (401, 403):
            return
        reason = exc.client_message if isinstance(exc, UpstreamError) else str(exc) or exc.__class__.__name__
        if self.failing is None:
            log.warning("upstream_handshake_failed", upstream=self._upstream, reason=reason)
        self.failing = reason


async def probe_http(
    upstream: Upstream,
    timeout_s: float,
    credentials: Mapping[str, str] = _NO_CREDENTIALS,
    hello: object = None,
) -> Detected:
    """server/discover over HTTP; the status does not matter, the body does (docs/translation.md §1.3),
    except 401/403: an OAuth-protected server of either era refuses before it reads the body.
    (`hello` is for a stdio probe: over HTTP a client's `initialize` goes on as it is.)"""
    message = probe_request("era-probe")
    headers = upstream_headers(message, LATEST_MODERN)
    if credentials:
        headers = {**headers, **credentials}
    try:
        async with asyncio.timeout(timeout_s), upstream.exchange(message, headers) as reply:
            async for message in reply:
                if "method" not in message:
                    return era_from_reply(message)
    except UpstreamHTTPError as exc:
        if exc.status in (401, 403):
            raise  # unknown: the caller authenticates, then a probe with its token tells
    except UpstreamProtocolError:
        pass  # a body that is not a recognized modern reply: legacy
    except TimeoutError:
        raise UpstreamError(upstream.name, "did not answer the era probe in time") from None
    return era_from_reply(None)


# Once a stdio server answered the probe's initialize it is up: the answer to the server/discover
# written before it comes at once from a server that answers in order; this bounds one that does not.
_DISCOVER_GRACE_S = 0.5


# With nothing brought by a caller, how long a stdio probe waits before it writes its own legacy
# `initialize` (for the servers that ignore requests before their session): a host that starts the
# proxy sends its `initialize` within it.
_HELLO_WAIT_S = 2.0


async def probe_stdio(
    start: Callable[[], Awaitable[Any]],
    timeout_s: float,
    credentials: Mapping[str, str] = _NO_CREDENTIALS,
    hello: asyncio.Future[JSONDict | None] | None = None,
    *,
    default_hello: JSONDict,
    keep: Callable[..., bool] = lambda channel, **held: False,
) -> Detected:
    """server/discover as the first line, a legacy `initialize` as the second (docs/translation.md
    §1.4): the one a legacy client brings (`hello`, resolved by the first caller that needs the
    era), or `default_hello` (what a pooled session of no capabilities sends) for any other caller,
    or when nobody brought one within _HELLO_WAIT_S. The answer to server/discover decides; a server
    that answers only the `initialize` is legacy as soon as it has (many ignore requests before
    their session); silence for `timeout_s`, a bound on the server's start-up, means legacy too.
    The probe never cuts a server short that is still starting: a slow start (`npx` installing)
    waits up to that bound, not a guess below it.

    The process is then offered to `keep(channel, modern=, hello=, answer=)` (ProbeHandover.hold):
    a 2026-07-28 server's, or a legacy server's (uninitialized, or with its answer to the
    `initialize` written) serves on instead of a second start; what is not kept is stopped.

    A program that cannot be started says nothing of its era: its UpstreamUnavailable propagates,
    nothing is cached, and the next request probes again, as for an HTTP upstream that is down.
    A stdio server has no credentials: `credentials` is ignored.
    """
    channel = await start()
    kept = False
    brought = hello if hello is not None else asyncio.get_running_loop().create_future()
    try:
        discover = probe_request("era-probe")
        routes = [channel.open_route(discover)]
        answer = asyncio.ensure_future(_reply(routes[0]))
        chosen = asyncio.ensure_future(asyncio.wait_for(asyncio.shield(brought), _HELLO_WAIT_S))
        legacy: asyncio.Future[JSONDict | None] | None = None  # the initialize's answer, once written
        greeting: JSONDict | None = None
        answered: JSONDict | None = None
        found: Detected | None = None
        try:
            await channel.write(discover)
            async with asyncio.timeout(timeout_s) as bound:
                while not answer.done():
                    waiting: set[asyncio.Future[Any]] = {answer, legacy or chosen}
                    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                    if legacy is None and chosen.done() and not answer.done():
                        try:
                            own = chosen.result()
                        except TimeoutError:
                            own = None
                        greeting = {**(own if own is not None else default_hello), "id": "era-probe-initialize"}
                        routes.append(channel.open_route(greeting))
                        legacy = asyncio.ensure_future(_reply(routes[-1]))
                        await channel.write(greeting)
                    elif legacy is not None and legacy.done() and not answer.done():
                        # It is up and answered initialize: discover's answer is due now.
                        grace = asyncio.get_running_loop().time() + _DISCOVER_GRACE_S
                        bound.reschedule(min(grace, bound.when() or grace))
                        await answer
                found = era_from_reply(answer.result())
                if found.era is Era.LEGACY and legacy is not None:  # its session is the initialize's
                    answered = await legacy
                elif legacy is not None:
                    # A 2026-07-28 server refuses the initialize at once; one of both eras takes it,
                    # and its process is then a legacy session: not the shared process (below).
                    with contextlib.suppress(TimeoutError):
                        answered = await asyncio.wait_for(asyncio.shield(legacy), _DISCOVER_GRACE_S)
        except (TimeoutError, UpstreamError, ConnectionError):
            # Silence, or the process died on the probe: legacy. Answered initialize only: legacy,
            # and an MCP server for sure. (Answered discover, not the initialize: legacy, not kept.)
            if found is None:
                found = era_from_reply(None)
                if legacy is not None and legacy.done() and not legacy.cancelled() and legacy.exception() is None:
                    if legacy.result():
                        found, answered = Detected(Era.LEGACY, None), legacy.result()
        finally:
            for waiting_on in (answer, chosen, legacy):
                if waiting_on is not None:
                    waiting_on.cancel()
            await asyncio.gather(answer, chosen, *([legacy] if legacy else []), return_exceptions=True)
            for route in routes:
                channel.close_route(route)
        modern = found.era is Era.MODERN
        if not modern or greeting is None or (answered is not None and "error" in answered):
            kept = keep(channel, modern=modern, hello=greeting, answer=None if modern else answered)
        return found
    finally:
        if not kept:
            await channel.stop(2.0)


async def _reply(route: Any) -> JSONDict | None:
    """The reply on `route` (what else comes first, notifications or requests, is not it)."""
    async for message in route.messages():
        if "method" not in message:
            return dict(message)
    return None
