"""Same era on both sides over HTTP: the request's bytes go upstream unchanged and the reply's
bytes come back as they arrive. A legacy session maps one to one onto the upstream's (its id and
Last-Event-ID pass through)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

from ..protocol.headers import SESSION_HEADER
from ..upstream.errors import UpstreamError
from ..upstream.http import HttpUpstream
from .failures import UpstreamFailures

_RETURNED = ("Content-Type", "WWW-Authenticate", "Allow")


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

    @asynccontextmanager
    async def forward(
        self, method: str, body: bytes | None, headers: Mapping[str, str], *, legacy: bool
    ) -> AsyncIterator[ByteReply]:
        """Relay one request; a failure to reach the upstream is the client's ProxyError. A POST is
        bounded by the request timeout, body included; GET streams are not."""
        try:
            async with asyncio.timeout(self._request_timeout_s if method == "POST" else None):
                async with self._upstream.forward(method, body, headers) as response:
                    returned = _RETURNED + ((SESSION_HEADER,) if legacy else ())
                    yield ByteReply(
                        response.status,
                        {name: response.headers[name] for name in returned if name in response.headers},
                        response.content_length,
                        response.content.iter_any(),
                    )
        except UpstreamError as exc:
            raise self._failures.client_error(exc) from None
        except TimeoutError:
            raise self._failures.timeout(self._upstream.name) from None
