"""Same era on both sides over HTTP: the request's bytes go upstream unchanged and the reply's
bytes come back as they arrive. A legacy session maps one to one onto the upstream's (its id and
Last-Event-ID pass through)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import aiohttp

from ..protocol.headers import SESSION_HEADER
from ..upstream.errors import UpstreamError
from ..upstream.http import HttpUpstream
from .failures import UpstreamFailures
from .tasks import Deadline

_RETURNED = ("Content-Type", "WWW-Authenticate", "Allow")
_RETURNED_LEGACY = (*_RETURNED, SESSION_HEADER)  # a legacy session is the upstream's own


@dataclass(slots=True)
class ByteReply:
    """The upstream's reply: its status, the headers the client gets, and its body."""

    status: int
    headers: dict[str, str]
    content_length: int | None
    chunks: AsyncIterator[bytes]

    @property
    def is_stream(self) -> bool:
        return self.headers.get("Content-Type", "").startswith("text/event-stream")


class ByteRelay:
    def __init__(self, upstream: HttpUpstream, failures: UpstreamFailures, request_timeout_s: float) -> None:
        self._upstream = upstream
        self._failures = failures
        self._request_timeout_s = request_timeout_s

    def forward(self, method: str, body: bytes | None, headers: Mapping[str, str], *, legacy: bool) -> _Forward:
        """Relay one request; entering yields the reply, leaving closes it. A failure to reach the
        upstream is the client's ProxyError. A POST is bounded by the request timeout, body
        included; GET streams are not."""
        return _Forward(self, method, body, headers, legacy)


class _Forward:
    """One relayed request (a class, not a generator: it runs once per request)."""

    __slots__ = ("_body", "_deadline", "_headers", "_legacy", "_method", "_relay", "_response")

    def __init__(self, relay: ByteRelay, method: str, body: bytes | None, headers: Mapping[str, str], legacy: bool):
        self._relay = relay
        self._method = method
        self._body = body
        self._headers = headers
        self._legacy = legacy
        self._deadline: Deadline | None = None
        self._response: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> ByteReply:
        if self._method == "POST":
            self._deadline = Deadline(self._relay._request_timeout_s)
            self._deadline.__enter__()
        try:
            response = self._response = await self._relay._upstream.forward(self._method, self._body, self._headers)
        except BaseException as exc:
            self._end(exc)
            raise
        returned = _RETURNED_LEGACY if self._legacy else _RETURNED
        headers = response.headers
        return ByteReply(
            response.status,
            {name: headers[name] for name in returned if name in headers},
            response.content_length,
            response.content.iter_any(),
        )

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if self._response is not None:
            self._response.close()
        self._end(exc)

    def _end(self, exc: BaseException | None) -> None:
        """Leave the deadline; an upstream failure or the deadline becomes the client's error."""
        relay = self._relay
        if self._deadline is not None:
            try:
                self._deadline.__exit__(type(exc) if exc is not None else None, exc, None)
            except TimeoutError:
                raise relay._failures.timeout(relay._upstream.name) from None
        if isinstance(exc, UpstreamError):
            raise relay._failures.client_error(exc) from None
