"""The one place where an upstream failure becomes the client's error, and is counted."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import structlog

from ..errors import ProxyError
from ..metrics import Metrics
from ..protocol import jsonrpc
from ..protocol.outcome import UpstreamFailure, timed_out
from ..upstream.errors import UpstreamError

T = TypeVar("T")
log = structlog.get_logger(__name__)


class UpstreamFailures:
    def __init__(self, metrics: Metrics, *, own_credentials: bool = False) -> None:
        self._metrics = metrics
        # auth.mode resource_server: the upstream is sent the proxy's own credentials, so its
        # 401/403 is the proxy's misconfiguration, nothing the client's token can fix.
        self.own_credentials = own_credentials

    def client_error(
        self,
        failure: UpstreamFailure | UpstreamError,
        *,
        status: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> ProxyError:
        """Count the failure (`upstream_errors_total`) and say it to the client: a 401/403 with
        its status and `WWW-Authenticate` as it came (so the client can authenticate), anything
        else as the JSON-RPC error of its kind (-32010 unavailable, -32011 timeout, -32012 invalid),
        with `status` and `headers` when the upstream's status must stay (a relayed session 404)."""
        if isinstance(failure, UpstreamError):
            failure = failure.failure
        self._metrics.upstream_errors.labels(failure.upstream, failure.kind).inc()
        if self.own_credentials and failure.is_auth:
            # Relayed, its challenge would send the client to authorize again, and again.
            log.warning("upstream_refused_proxy_credentials", upstream=failure.upstream, status=failure.http_status)
            return ProxyError(
                jsonrpc.UPSTREAM_UNAVAILABLE,
                f"upstream {failure.upstream!r} refused the proxy's own credentials (HTTP {failure.http_status})",
                status=502,
                outcome="upstream_error",
            )
        return to_client_error(failure, status=status, headers=headers)

    def timeout(self, upstream: str) -> ProxyError:
        return self.client_error(timed_out(upstream))

    async def reaching(self, work: Awaitable[T]) -> T:
        """`work`'s result; its upstream failure, if it fails, as the client's error."""
        try:
            return await work
        except UpstreamError as exc:
            raise self.client_error(exc) from None


def to_client_error(
    failure: UpstreamFailure, *, status: int | None = None, headers: dict[str, str] | None = None
) -> ProxyError:
    if failure.is_auth:
        if failure.www_authenticate:
            headers = {**(headers or {}), "WWW-Authenticate": failure.www_authenticate}
        return ProxyError(
            jsonrpc.INVALID_REQUEST,
            f"upstream refused the credentials (HTTP {failure.http_status})",
            status=failure.http_status,
            headers=headers,
            outcome="upstream_error",
        )
    return ProxyError(failure.code, failure.message, status=status, headers=headers, outcome="upstream_error")


async def deliver_notification(upstream: str, method: object, within_s: float, send: Awaitable[None]) -> None:
    """Send a client's notification upstream (`send`, bounded by `within_s`). Nothing answers a
    notification, so there is no reply to carry a failure: it is logged, and the client keeps its 202."""
    try:
        async with asyncio.timeout(within_s):
            await send
    except (UpstreamError, ProxyError, TimeoutError) as exc:
        log.warning("notification_not_delivered", upstream=upstream, method=method, error=str(exc) or "timed out")
