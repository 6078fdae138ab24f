"""Middlewares at the edge: DNS-rebinding guard (Origin, Host) and JSON-only error bodies, down to
requests aiohttp cannot parse as HTTP."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler

from ..config import Settings, is_loopback_host
from ..protocol import jsonrpc
from .reply import json_response

log = structlog.get_logger(__name__)


def _hostname(host_header: str) -> str:
    return (urlsplit("//" + host_header).hostname or "").lower()


class Guard:
    def __init__(self, settings: Settings) -> None:
        security = settings.security
        self._origins = {o.rstrip("/").lower() for o in security.allowed_origins}
        self._hosts = {h.lower() for h in security.allowed_hosts}
        self._loopback_only = not self._hosts and is_loopback_host(settings.listen_address[0])
        self._host_verdicts: dict[str | None, bool] = {}

    def origin_allowed(self, origin: str) -> bool:
        if self._origins:
            return "*" in self._origins or origin.rstrip("/").lower() in self._origins
        return is_loopback_host(_hostname(urlsplit(origin).netloc or ""))

    def host_allowed(self, host: str | None) -> bool:
        allowed = self._host_verdicts.get(host)
        if allowed is None:
            allowed = self._host_allowed(host)
            if len(self._host_verdicts) < 1024:  # clients send few distinct Host values
                self._host_verdicts[host] = allowed
        return allowed

    def _host_allowed(self, host: str | None) -> bool:
        if self._hosts:
            if host is None:
                return False
            return "*" in self._hosts or host.lower() in self._hosts or _hostname(host) in self._hosts
        if self._loopback_only:
            return host is not None and is_loopback_host(_hostname(host))
        return True

    def check(self, request: web.BaseRequest) -> web.Response | None:
        """The DNS-rebinding guard of the MCP endpoint: a refusal, or None to go on."""
        origin = request.headers.get("Origin")
        if origin is not None and not self.origin_allowed(origin):
            log.warning("origin_rejected", origin=origin[:200])
            return _error(403, "Forbidden: Origin not allowed")
        if not self.host_allowed(request.headers.get("Host")):
            log.warning("host_rejected", host=(request.headers.get("Host") or "")[:200])
            return _error(421, "Misdirected request: Host not allowed")
        return None


def _error(status: int, message: str, code: int = jsonrpc.INVALID_REQUEST) -> web.Response:
    return json_response(jsonrpc.error_response(None, code, message), status)


def safe(handler: Handler, guard: Guard | None = None) -> Handler:
    """A handler that never answers with HTML or a traceback: aiohttp's HTTP errors become JSON-RPC
    error bodies, anything unexpected a logged 500 with one. `guard` applies the Origin/Host check.

    (A wrapper per route rather than middlewares: middlewares cost every request a few frames.)
    """

    async def wrapped(request: web.Request) -> web.StreamResponse:
        if guard is not None:
            refused = guard.check(request)
            if refused is not None:
                return refused
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            response = _error(exc.status, exc.reason)
            for name in ("Allow", "WWW-Authenticate"):
                if name in exc.headers:
                    response.headers[name] = exc.headers[name]
            return response
        except Exception:
            log.exception("unhandled_error", path=request.path, method=request.method)
            return _error(500, "Internal error", jsonrpc.INTERNAL_ERROR)

    return wrapped


async def not_found(request: web.Request) -> web.Response:
    return _error(404, "Not Found")


async def method_not_allowed(request: web.Request) -> web.Response:
    response = _error(405, "Method not allowed")
    response.headers["Allow"] = "POST, GET, DELETE"
    return response


def allowing(methods: str) -> Handler:
    """The 405 of a path that serves only `methods` (its Allow header)."""

    async def refuse(request: web.Request) -> web.Response:
        response = _error(405, "Method not allowed")
        response.headers["Allow"] = methods
        return response

    return refuse


class JsonErrors(web.RequestHandler):
    """aiohttp's connection handler, answering what it cannot parse as HTTP (a bad request line,
    bytes a header may not hold, a line too long) with a JSON-RPC error body instead of its plain
    text. Such a request reaches no application handler or middleware, so this is the one place it
    can be answered; it is logged as one line, without aiohttp's traceback (the fault is the
    client's). docs/translation.md §7.24."""

    __slots__ = ()

    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if status >= 500:
            super().handle_error(request, status, exc, message)  # logs it, and refuses once output began
            reply = _error(status, "Internal error", jsonrpc.INTERNAL_ERROR)
        else:
            if request.writer.output_size > 0:
                raise ConnectionError("a reply is under way: no error reply can follow it")
            reason = (message or (exc.__class__.__name__ if exc is not None else "")).strip().splitlines()
            text = reason[0][:200] if reason else "malformed HTTP request"
            log.info("malformed_http_request", status=status, reason=text)
            reply = _error(status, f"Bad request: {text}")
        reply.force_close()
        return reply

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, web.RequestPayloadError):
            # A body the handler refused already (say, not the gzip it claimed to be) fails once
            # more when aiohttp reads its rest before reusing the connection: not a fault here.
            log.info("request_body_unreadable", reason=str(exc).strip().splitlines()[-1].strip()[:200])
            return
        super().log_exception(*args, **kwargs)
