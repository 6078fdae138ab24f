"""Upstream era detection, cached per upstream and repeated when the assumption stops holding."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from ..protocol.detection import Detected, era_from_reply, probe_request
from ..protocol.legacy_to_modern import upstream_headers
from ..protocol.versions import LATEST_MODERN, Era
from ..upstream.errors import UpstreamError, UpstreamHTTPError, UpstreamProtocolError

log = structlog.get_logger(__name__)
# A probe gets the credentials of the request that needs the era (none at start): a protected
# upstream answers an anonymous probe with 401, which says nothing of its era.
Probe = Callable[[Mapping[str, str]], Awaitable[Detected]]
_NO_CREDENTIALS: Mapping[str, str] = {}


class EraDetector:
    def __init__(self, configured: str, probe: Probe, clock: Callable[[], float] = time.monotonic) -> None:
        self._configured = configured
        self._probe = probe
        self._clock = clock
        self._detected: Detected | None = None if configured == "auto" else Detected(Era(configured), None)
        self._last: Era | None = self._detected.era if self._detected is not None else None  # survives suspect()
        self._lock = asyncio.Lock()
        self.probed_at: float | None = None
        self.on_change: Callable[[Era], None] = lambda era: None

    @property
    def era(self) -> Era | None:
        """The era as last known (None before the first successful probe)."""
        return self._last

    @property
    def known(self) -> Era | None:
        """The era to use now without probing, if there is one (None: await current())."""
        detected = self._detected
        return detected.era if detected is not None else None

    async def current(self, credentials: Mapping[str, str] = _NO_CREDENTIALS) -> Era:
        """The era, probing with `credentials` (the caller's Authorization, when it may go upstream)
        if it is not known; an upstream that refuses them raises its UpstreamHTTPError (401/403),
        nothing cached, so the client authenticates and the next request probes again."""
        detected = self._detected
        if detected is not None:
            return detected.era
        async with self._lock:
            if self._detected is None:
                found = await self._probe(credentials)
                previous, self._last = self._last, found.era
                self._detected, self.probed_at = found, self._clock()
                log.info("upstream_era_detected", era=found.era.value, version=found.version)
                if found.era != previous:
                    self.on_change(found.era)
            return self._detected.era

    def suspect(self, reason: str) -> None:
        """An answer did not fit the detected era: probe again before the next request."""
        if self._configured == "auto" and self._detected is not None:
            log.warning("upstream_era_suspect", era=self._detected.era.value, reason=reason)
            self._detected = None


async def probe_http(upstream: Any, timeout_s: float, credentials: Mapping[str, str] = _NO_CREDENTIALS) -> Detected:
    """server/discover over HTTP; the status does not matter, the body does (docs/translation.md §1.3),
    except 401/403: an OAuth-protected server of either era refuses before it reads the body."""
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


async def probe_stdio(
    start: Callable[[], Awaitable[Any]], timeout_s: float, credentials: Mapping[str, str] = _NO_CREDENTIALS
) -> Detected:
    """server/discover as the first line; silence past the timeout means legacy (docs/translation.md §1.4).

    A program that cannot be started says nothing of its era: its UpstreamUnavailable propagates,
    nothing is cached, and the next request probes again, as for an HTTP upstream that is down.
    A stdio server has no credentials: `credentials` is ignored.
    """
    channel = await start()
    try:
        message = probe_request("era-probe")
        route = channel.open_route(message)
        try:
            await channel.write(message)
            async with asyncio.timeout(timeout_s):
                async for reply in route.messages():
                    if "method" not in reply:
                        return era_from_reply(reply)
        except (TimeoutError, UpstreamError, ConnectionError):
            pass  # silence, or the process died on the probe: legacy
        return era_from_reply(None)
    finally:
        await channel.stop(2.0)
