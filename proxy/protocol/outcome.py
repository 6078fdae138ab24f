"""Plain values that cross from the edges into the core and back: a request's final outcome, and
an upstream failure."""

from __future__ import annotations

from dataclasses import dataclass

from . import jsonrpc

JSONDict = jsonrpc.JSONDict


@dataclass(slots=True)  # not frozen: made for every request, and frozen fields cost a call each
class Outcome:
    """The final reply to one request: the JSON-RPC message, the HTTP status it goes with when it
    is the whole reply, and whether it may be kept and shared (a result that took the caller's
    own answers may not; docs/translation.md §5). A value nobody changes once made: the
    cache hands one to several callers."""

    message: JSONDict
    status: int = 200
    shareable: bool = True


@dataclass(frozen=True, slots=True)
class UpstreamFailure:
    """Why talking to the upstream failed: what the client is told (`code`, `message`) and what
    is counted (`kind`, a metrics label). `http_status` when the upstream answered one."""

    upstream: str
    kind: str  # unavailable | timeout | invalid | http | session_gone
    code: int
    detail: str  # "is unreachable (...)": follows the upstream's name in messages
    http_status: int | None = None
    www_authenticate: str | None = None

    @property
    def message(self) -> str:
        return f"upstream {self.upstream!r} {self.detail}"

    @property
    def is_auth(self) -> bool:
        """A 401/403: relayed to the client as it came, so it can authenticate."""
        return self.http_status in (401, 403)


def timed_out(upstream: str) -> UpstreamFailure:
    return UpstreamFailure(upstream, "timeout", jsonrpc.UPSTREAM_TIMEOUT, "timed out")


def invalid(upstream: str, detail: str) -> UpstreamFailure:
    return UpstreamFailure(upstream, "invalid", jsonrpc.UPSTREAM_INVALID, detail)
