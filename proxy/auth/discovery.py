"""OAuth discovery on the proxy's origin (docs/design.md §Authorization discovery).

A client finds out how to authorize from the MCP server's origin: the protected resource metadata
(RFC 9728) at `/.well-known/oauth-protected-resource[<path>]`, and, for clients of 2025-03-26,
authorization server metadata (RFC 8414) at `/.well-known/oauth-authorization-server` or
`/.well-known/openid-configuration`. Behind the proxy that origin is the proxy's, so it serves them:
in `passthrough` the upstream's documents (the protected resource's `resource` rewritten to the
proxy's public URL, every other field as it came), in `resource_server` its own. And every
`WWW-Authenticate` the client gets names the proxy's metadata (challenge.rewrite), never the
upstream's address.

Errors are OAuth-shaped JSON (`{"error", "error_description"}`), never HTML or a traceback.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import structlog
from aiohttp import web

from ..config import Settings
from . import challenge

log = structlog.get_logger(__name__)

JSONDict = dict[str, Any]

WELL_KNOWN_RESOURCE = challenge.WELL_KNOWN_RESOURCE
WELL_KNOWN_AUTHORIZATION_SERVER = "/.well-known/oauth-authorization-server"
WELL_KNOWN_OPENID = "/.well-known/openid-configuration"
ALLOWED_METHODS = "GET, HEAD"

ABSENCE_KEPT_S = 10.0  # an upstream without metadata is asked again after this long
BODY_LIMIT = 64 * 1024  # a metadata document is a few hundred bytes; anything this large is no metadata
_NAMED_URL_MAX = 2048  # a resource_metadata an upstream names, remembered only when it is a plausible URL
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)(?::[0-9]{1,5})?")
_NAMED = re.compile(r'(?i)\bresource_metadata\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))')
_UNESCAPE = re.compile(r"\\(.)")
_STDIO = "a stdio server"


# ---------------------------------------------------------------- pure parts


class MetadataError(Exception):
    """What the client gets instead of a document: an HTTP status and an OAuth error body."""

    def __init__(self, status: int, error: str, description: str, *, kept_s: float = 0.0) -> None:
        super().__init__(description)
        self.status = status
        self.error = error
        self.description = description
        self.kept_s = kept_s  # how long the cache may answer with it (an absence, not a failure)


def error_body(error: str, description: str) -> JSONDict:
    return {"error": error, "error_description": description}


def derived_resource(scheme: str, host: str | None, path: str) -> str | None:
    """The MCP endpoint's URL as this request reached it (scheme, Host, the endpoint's path); None
    when the Host is no host[:port] (it would be quoted into challenges and documents)."""
    if not host or len(host) > 300 or _HOST.fullmatch(host) is None:
        return None
    return f"{scheme}://{host}{path}"


def cache_lifetime(cache_control: str | None, max_age_s: float) -> float:
    """How long a fetched document may be served again: the upstream's `max-age`, none at all for
    `no-store` / `no-cache`, and never longer than `max_age_s` (also the lifetime when it says
    nothing)."""
    if not cache_control:
        return max_age_s
    lifetime = max_age_s
    for directive in cache_control.split(","):
        name, _, value = directive.strip().partition("=")
        name = name.strip().lower()
        if name in ("no-store", "no-cache"):
            return 0.0
        if name == "max-age":
            try:
                lifetime = min(lifetime, max(0.0, float(int(value.strip().strip('"')))))
            except ValueError:
                return 0.0  # RFC 9111 §4.2.1: an invalid max-age means stale
    return lifetime


def protected_resource_problem(document: Any) -> str | None:
    """Why `document` is no protected resource metadata the proxy can relay (RFC 9728 §2; the MCP
    authorization spec requires `authorization_servers`), or None."""
    if not isinstance(document, dict):
        return f"is a JSON {_json_kind(document)}, not an object"
    if not isinstance(document.get("resource"), str) or not document["resource"]:
        return "has no `resource` string"
    servers = document.get("authorization_servers")
    if not isinstance(servers, list) or not servers or not all(isinstance(s, str) and s for s in servers):
        return "has no `authorization_servers` list of URLs"
    return None


def authorization_server_problem(document: Any) -> str | None:
    """Why `document` is no authorization server metadata (RFC 8414 §2: `issuer` is required)."""
    if not isinstance(document, dict):
        return f"is a JSON {_json_kind(document)}, not an object"
    if not isinstance(document.get("issuer"), str) or not document["issuer"]:
        return "has no `issuer` string"
    return None


def with_resource(document: JSONDict, resource: str) -> JSONDict:
    """The upstream's document naming `resource` instead; every other field (unknown ones too) and
    their order unchanged."""
    return {name: (resource if name == "resource" else value) for name, value in document.items()}


def resource_candidates(upstream_url: str, named: str | None) -> list[str]:
    """Where a client would look for the upstream's protected resource metadata, in its order (the
    MCP authorization spec, 2025-11-25, "Protected Resource Metadata Discovery"): the URL its last
    challenge named, then the path-suffixed well-known URL, then the root one."""
    parts = urlsplit(upstream_url)
    root = urlunsplit((parts.scheme, parts.netloc, WELL_KNOWN_RESOURCE, "", ""))
    candidates = [named] if named else []
    for url in (challenge.metadata_url(upstream_url), root):
        if url not in candidates:
            candidates.append(url)
    return candidates


def issuer_candidates(issuer: str) -> list[str]:
    """Where an issuer's metadata is (the MCP authorization spec's "Authorization Server Metadata
    Discovery"): RFC 8414 §3.1 path insertion, then OpenID Connect discovery inserted and appended."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")

    def at(well_known: str) -> str:
        return urlunsplit((parts.scheme, parts.netloc, well_known + path, "", ""))

    candidates = [at(WELL_KNOWN_AUTHORIZATION_SERVER), at(WELL_KNOWN_OPENID)]
    if path:
        candidates.append(urlunsplit((parts.scheme, parts.netloc, path + WELL_KNOWN_OPENID, "", "")))
    return candidates


def named_metadata(header: str) -> str | None:
    """The `resource_metadata` a challenge names (RFC 9728 §5.1), when it is an http(s) URL."""
    match = _NAMED.search(header)
    if match is None:
        return None
    quoted, token = match.groups()
    value = _UNESCAPE.sub(r"\1", quoted) if quoted is not None else token
    parts = urlsplit(value)
    if len(value) > _NAMED_URL_MAX or parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return value


def _json_kind(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _same_issuer(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


# ---------------------------------------------------------------- the cache


@dataclass(slots=True)
class Document:
    body: JSONDict
    expires: float  # monotonic; 0 for a document not to be kept

    def max_age(self, now: float) -> int:
        return max(0, int(self.expires - now))


class DocumentCache:
    """Fetched documents until they expire; concurrent misses of one key share one fetch (a burst
    of clients discovering at once costs the upstream one request). An absence is kept briefly
    (`MetadataError.kept_s`), so a server without OAuth is not asked again for every probe of the
    well-known paths; failures (unreachable, malformed) are not kept."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._kept: dict[tuple[str, ...], tuple[float, Document | MetadataError]] = {}
        self._flights: dict[tuple[str, ...], asyncio.Task[Document]] = {}

    async def get(self, key: tuple[str, ...], fetch: Callable[[], Awaitable[Document]]) -> Document:
        kept = self._kept.get(key)
        if kept is not None:
            expires, outcome = kept
            if expires > self._clock():
                if isinstance(outcome, MetadataError):
                    raise outcome
                return outcome
            del self._kept[key]
        flight = self._flights.get(key)
        if flight is None:
            flight = self._flights[key] = asyncio.ensure_future(self._fetch(key, fetch))
        # Shielded: a client that goes away must not cancel the fetch the others wait for.
        return await asyncio.shield(flight)

    async def _fetch(self, key: tuple[str, ...], fetch: Callable[[], Awaitable[Document]]) -> Document:
        try:
            document = await fetch()
            self._keep(key, document.expires, document)
            return document
        except MetadataError as exc:
            if exc.kept_s > 0:
                self._keep(key, self._clock() + exc.kept_s, exc)
            raise
        finally:
            del self._flights[key]

    def _keep(self, key: tuple[str, ...], expires: float, outcome: Document | MetadataError) -> None:
        if expires > self._clock():
            if len(self._kept) >= 64:  # keys are few (one per well-known path); stay bounded
                self._kept.clear()
            self._kept[key] = (expires, outcome)

    async def close(self) -> None:
        flights = list(self._flights.values())
        for flight in flights:
            flight.cancel()
        await asyncio.gather(*flights, return_exceptions=True)


# ---------------------------------------------------------------- the endpoints


class Discovery:
    """The well-known endpoints of the MCP listener and the rewriting of challenges."""

    def __init__(
        self,
        settings: Settings,
        host_allowed: Callable[[str | None], bool],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._auth = settings.auth
        self._path = settings.path
        upstream = settings.upstream
        self._upstream_name = upstream.name
        self._upstream_url = upstream.url if upstream.transport == "http" else None
        self._timeout_s = upstream.connect_timeout_s
        self._host_allowed = host_allowed
        self._clock = clock
        self._cache = DocumentCache(clock)
        self._session: aiohttp.ClientSession | None = None
        self._named: str | None = None  # the resource_metadata the upstream's last challenge named
        self._suffix = settings.path.rstrip("/")  # the path-suffixed form's suffix ("" for "/")

    # -- the public resource

    def public_resource(self, request: web.BaseRequest) -> str | None:
        """The MCP endpoint's URL as clients reach it: auth.public_url, else derived from the
        request (its scheme and Host, which the guard has checked); None for a Host that is no host."""
        if self._auth.public_url is not None:
            return self._auth.public_url
        return derived_resource(request.scheme, request.headers.get("Host"), self._path)

    def metadata_url(self, request: web.BaseRequest) -> str | None:
        """Where the proxy serves the protected resource metadata (the path-suffixed form)."""
        resource = self.public_resource(request)
        return challenge.metadata_url(resource) if resource is not None else None

    # -- WWW-Authenticate

    async def on_response_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """Every challenge leaving the MCP listener names the proxy's metadata. One lookup when
        there is none (the usual)."""
        if "WWW-Authenticate" not in response.headers:
            return
        target = self.metadata_url(request)
        if target is None:
            return
        headers = response.headers
        values = headers.getall("WWW-Authenticate")
        if self._auth.mode == "passthrough" and response.status in (401, 403):
            for value in values:
                named = named_metadata(value)
                # Never the proxy's own origin: its own challenges name it, and an upstream that
                # already names the proxy would have the proxy fetch from itself.
                if named is not None and urlsplit(named).netloc != urlsplit(target).netloc:
                    self._named = named
                    break
        del headers["WWW-Authenticate"]
        for value in values:
            headers.add("WWW-Authenticate", challenge.rewrite(value, target))

    # -- handlers

    async def protected_resource(self, request: web.Request) -> web.StreamResponse:
        try:
            self._check(request)
            tail = request.match_info.get("tail", "")
            if tail and tail != self._suffix:
                raise MetadataError(404, "not_found", f"no protected resource metadata at {request.path[:200]}")
            resource = self.public_resource(request)
            if resource is None:
                raise MetadataError(400, "invalid_request", "the Host header names no host")
            if self._auth.mode == "resource_server":
                return self._own_document(resource)
            document = await self._upstream_resource()
            return _document(with_resource(document.body, resource), document, self._clock())
        except MetadataError as exc:
            return _error(exc)

    async def authorization_server(self, request: web.Request) -> web.StreamResponse:
        try:
            self._check(request)
            tail = request.match_info.get("tail", "")
            if tail and not tail.startswith("/"):
                raise MetadataError(404, "not_found", f"no metadata at {request.path[:200]}")
            if self._auth.mode == "resource_server":
                if tail and tail != self._suffix:
                    raise MetadataError(404, "not_found", f"no authorization server metadata at {request.path[:200]}")
                document = await self._issuer_metadata(self._auth.issuers[0])
            else:
                document = await self._upstream_authorization_server(request.rel_url.raw_path)
            return _document(document.body, document, self._clock())
        except MetadataError as exc:
            return _error(exc)

    async def method_not_allowed(self, request: web.Request) -> web.StreamResponse:
        response = _error(MetadataError(405, "method_not_allowed", f"{request.method[:20]} is not allowed here"))
        response.headers["Allow"] = ALLOWED_METHODS
        return response

    def _check(self, request: web.BaseRequest) -> None:
        # The Host check of the MCP endpoint (a derived resource is built from it); no Origin check:
        # the documents are public, and browser-based clients fetch them from their own origin.
        if not self._host_allowed(request.headers.get("Host")):
            log.warning("host_rejected", host=(request.headers.get("Host") or "")[:200])
            raise MetadataError(421, "invalid_request", "Misdirected request: Host not allowed")

    def _own_document(self, resource: str) -> web.Response:
        body: JSONDict = {
            "resource": resource,
            "authorization_servers": list(self._auth.issuers),
            "bearer_methods_supported": ["header"],
        }
        if self._auth.required_scopes:
            body["scopes_supported"] = list(self._auth.required_scopes)
        return _json(200, body, {"Cache-Control": f"max-age={int(self._auth.metadata_max_age_s)}"})

    # -- fetching

    async def _upstream_resource(self) -> Document:
        if self._upstream_url is None:
            raise MetadataError(404, "not_found", f"the upstream ({_STDIO}) publishes no protected resource metadata")
        candidates = resource_candidates(self._upstream_url, self._named)
        return await self._cache.get(
            ("resource", *candidates),
            lambda: self._first(candidates, protected_resource_problem, self._upstream_name, "protected resource"),
        )

    async def _upstream_authorization_server(self, path: str) -> Document:
        if self._upstream_url is None:
            raise MetadataError(404, "not_found", f"the upstream ({_STDIO}) publishes no authorization server metadata")
        parts = urlsplit(self._upstream_url)
        url = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
        return await self._cache.get(
            ("authorization_server", url),
            lambda: self._first([url], authorization_server_problem, self._upstream_name, "authorization server"),
        )

    async def issuer_metadata(self, issuer: str) -> JSONDict:
        """`issuer`'s authorization server metadata (cached; MetadataError when it has none or it
        is malformed): where its `jwks_uri` is, for instance."""
        return (await self._issuer_metadata(issuer)).body

    async def _issuer_metadata(self, issuer: str) -> Document:
        candidates = issuer_candidates(issuer)

        async def fetch() -> Document:
            document = await self._first(candidates, authorization_server_problem, issuer, "authorization server")
            if not _same_issuer(document.body["issuer"], issuer):  # RFC 8414 §3.3
                raise self._invalid(issuer, candidates[0], f"names issuer {document.body['issuer'][:200]!r}")
            return document

        return await self._cache.get(("issuer", issuer), fetch)

    async def _first(
        self, candidates: list[str], problem: Callable[[Any], str | None], source: str, kind: str
    ) -> Document:
        """The first candidate that has the document. One that answers 4xx has none (the next is
        tried); a malformed document, an unreachable host or a timeout ends the search, as it would
        a client's; when every candidate is without one, 404, or 502 if one failed with 5xx."""
        server_error: int | None = None
        for url in candidates:
            status, raw, cache_control = await self._get(url, source)
            if status >= 500:
                server_error = status
                continue
            if status != 200:
                continue
            try:
                document = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                raise self._invalid(source, url, "is not JSON") from None
            reason = problem(document)
            if reason is not None:
                raise self._invalid(source, url, reason)
            lifetime = cache_lifetime(cache_control, self._auth.metadata_max_age_s)
            return Document(document, self._clock() + lifetime if lifetime > 0 else 0.0)
        if server_error is not None:
            raise MetadataError(
                502, "temporarily_unavailable", f"the upstream answered HTTP {server_error} for its {kind} metadata"
            )
        kept_s = min(ABSENCE_KEPT_S, self._auth.metadata_max_age_s)
        raise MetadataError(404, "not_found", f"the upstream publishes no {kind} metadata", kept_s=kept_s)

    def _invalid(self, source: str, url: str, reason: str) -> MetadataError:
        path = urlsplit(url).path[:200]
        log.warning("oauth_metadata_invalid", source=source, path=path, reason=reason)
        return MetadataError(502, "invalid_metadata", f"the metadata at {path} {reason}")

    async def _get(self, url: str, source: str) -> tuple[int, bytes, str | None]:
        path = urlsplit(url).path[:200]
        try:
            async with asyncio.timeout(self._timeout_s):
                async with self._client().get(
                    url, headers={"Accept": "application/json"}, allow_redirects=False
                ) as response:
                    if response.status != 200:
                        return response.status, b"", None
                    if response.content_length is not None and response.content_length > BODY_LIMIT:
                        raise self._invalid(source, url, f"is larger than {BODY_LIMIT} bytes")
                    raw = await response.content.read(BODY_LIMIT + 1)
                    while len(raw) <= BODY_LIMIT and (more := await response.content.read(BODY_LIMIT + 1 - len(raw))):
                        raw += more
                    if len(raw) > BODY_LIMIT:
                        raise self._invalid(source, url, f"is larger than {BODY_LIMIT} bytes")
                    return 200, raw, response.headers.get("Cache-Control")
        except TimeoutError:
            log.warning("oauth_metadata_unavailable", source=source, path=path, reason="timed out")
            raise MetadataError(
                504, "temporarily_unavailable", f"the metadata at {path} did not arrive within {self._timeout_s:g} s"
            ) from None
        except aiohttp.ClientError as exc:
            reason = f"{exc.__class__.__name__}: {exc}"[:300]
            log.warning("oauth_metadata_unavailable", source=source, path=path, reason=reason)
            raise MetadataError(502, "temporarily_unavailable", f"the metadata at {path} is unreachable") from None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Its own session: the upstream's carries upstream.headers (its credentials), which a
            # metadata fetch, possibly to another host (an issuer), must not send.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout_s),
                trust_env=False,
                auto_decompress=True,
                cookie_jar=aiohttp.DummyCookieJar(),  # fetched for every caller: nothing kept between fetches
            )
        return self._session

    async def close(self) -> None:
        await self._cache.close()
        if self._session is not None:
            await self._session.close()


def _json(status: int, body: JSONDict, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=json.dumps(body).encode(), status=status, content_type="application/json", headers=headers)


def _document(body: JSONDict, document: Document, now: float) -> web.Response:
    kept = document.max_age(now)
    return _json(200, body, {"Cache-Control": f"max-age={kept}" if kept else "no-store"})


def _error(exc: MetadataError) -> web.Response:
    return _json(exc.status, error_body(exc.error, exc.description), {"Cache-Control": "no-store"})
