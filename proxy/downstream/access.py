"""Who calls, and what of the client's request may go upstream: the headers the proxy reads
checked, the caller identified once per request (proxy/auth/identity.py), its credentials and
same-era headers picked. The Origin and Host checks are the middleware's (downstream/guard.py)."""

from __future__ import annotations

from itertools import compress
from operator import itemgetter, methodcaller
from typing import Any

from aiohttp import web

from ..auth.identity import Identifier, Identity
from ..config import Settings
from ..errors import ProxyError
from ..protocol import jsonrpc, meta
from ..protocol.headers import SESSION_HEADER
from ..relay.channel import Caller

# Headers carried from the client to the upstream, beside the ones the proxy computes: the trace
# context (meta.TRACE_KEYS) and these.
_PASSTHROUGH_PREFIXES = ("mcp-",)
_IS_MCP = methodcaller("startswith", _PASSTHROUGH_PREFIXES)  # of a lower-cased name
_NAME = itemgetter(0)
_SESSION_HEADER_LOWER = SESSION_HEADER.lower()
# The request's Identity, once computed (RequestKey: aiohttp 3.13 and later; a string before).
_IDENTITY: Any = web.RequestKey("identity", Identity) if hasattr(web, "RequestKey") else "mcp_era_proxy.identity"


class Access:
    def __init__(self, settings: Settings, identifier: Identifier | None = None) -> None:
        self._identifier = identifier or Identifier(settings, None)
        # resource_server: the proxy is the token's audience; passing the token on is forbidden.
        self.forward_authorization = settings.upstream.forward_authorization and not self._identifier.resource_server
        # Headers whose value the proxy hashes (the caller's identity) or writes into JSON (trace
        # context in `_meta`), lower-cased. The others it only compares or relays as they came.
        self._text_headers = tuple(
            sorted({"authorization", *meta.TRACE_KEYS, (settings.security.identity_header or "authorization").lower()})
        )

    def check_headers(self, request: web.BaseRequest) -> None:
        """aiohttp decodes header bytes that are not UTF-8 with surrogate escapes; such a value
        cannot be hashed or written as JSON, so it is refused in a header the proxy reads so.
        (Those few names are looked up: a request carries many more headers than that.)"""
        headers = request.headers
        for name in self._text_headers:
            if name not in headers:  # the usual: most of them are absent
                continue
            for value in headers.getall(name):
                if not value.isascii() and not _is_utf8(value):
                    raise ProxyError(
                        jsonrpc.INVALID_REQUEST, f"Invalid Request: header {name} is not valid UTF-8", refused=True
                    )

    async def caller(self, request: web.BaseRequest, *, same_era: bool = False, legacy: bool = False) -> Caller:
        """Who calls; `same_era`: the request goes upstream as it came, with the headers it brought.

        The caller is identified once per request (proxy/auth/identity.py); in resource_server
        mode that refuses a request without a valid token (401/403), and the client's
        Authorization is never among what goes upstream: upstream.headers carry the proxy's own."""
        identity: Identity | None = request.get(_IDENTITY)
        if identity is None:
            identity = self._identifier.unverified(request) or await self._identifier.identify(request)
            request[_IDENTITY] = identity
        return self._caller(request, identity, same_era, legacy)

    async def post_caller(self, request: web.BaseRequest) -> Caller:
        """A POST's caller, as `caller(request)` gives it. A POST is identified once and its caller
        passed on from there (`same_era` for what goes upstream as it came), so it is not
        remembered on the request (that lookup raises and catches a KeyError every time)."""
        identity = self._identifier.unverified(request) or await self._identifier.identify(request)
        return self._caller(request, identity, False, False)

    def _caller(self, request: web.BaseRequest, identity: Identity, same_era: bool, legacy: bool) -> Caller:
        headers = request.headers
        credentials: dict[str, str] = {}
        if self.forward_authorization and "Authorization" in headers:
            credentials["Authorization"] = headers["Authorization"]
        for name in meta.TRACE_KEYS:
            if name in headers:
                credentials[name] = headers[name]
        return Caller(identity.principal, credentials, _forwarded(request, credentials, legacy) if same_era else {})

    def same_era(self, request: web.BaseRequest, caller: Caller, *, legacy: bool = False) -> Caller:
        """`caller` (identified for this request) going upstream as it came, with the headers it
        brought: what `caller(request, same_era=True)` gives, without identifying it again."""
        return Caller(caller.principal, caller.credentials, _forwarded(request, caller.credentials, legacy))

    def probe_credentials(self, request: web.BaseRequest) -> dict[str, str]:
        """What an era probe made for this request carries: the caller's Authorization when it may
        go upstream (a protected upstream refuses an anonymous probe, and its 401, challenge
        rewritten, starts the client's OAuth)."""
        authorization = request.headers.get("Authorization") if self.forward_authorization else None
        return {"Authorization": authorization} if authorization else {}


def _is_utf8(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _forwarded(request: web.BaseRequest, credentials: dict[str, str], legacy: bool) -> dict[str, str]:
    """What a same-era request carries upstream: credentials, trace, its Mcp-* headers; for a legacy
    session also its id and Last-Event-ID (it maps one to one onto the upstream's)."""
    headers = dict(credentials)
    if not legacy:  # a modern request (every one of them): its Mcp-* headers but a session id
        # A request carries many headers and a few Mcp-* ones: those are picked out in C (each
        # pair's name lowered and tested by map, the pairs kept by compress), and only they loop
        # here. (Pairs on both sides: a multidict's keys() gives each name once.)
        received = request.headers
        picked = map(_IS_MCP, map(str.lower, map(_NAME, received.items())))
        for name, value in compress(received.items(), picked):
            if name.lower() != _SESSION_HEADER_LOWER:
                headers[name] = value
        return headers
    for name, value in request.headers.items():
        lowered = name.lower()
        if lowered.startswith(_PASSTHROUGH_PREFIXES):
            if legacy or lowered != _SESSION_HEADER_LOWER:
                headers[name] = value
        elif legacy and lowered == "last-event-id":
            headers[name] = value
    return headers
