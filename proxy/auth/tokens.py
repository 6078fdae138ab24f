"""JWT access tokens (RFC 9068) verified against the issuers' JWKS: the `TokenVerifier` the
identifier (auth/identity.py) is given when `auth.issuers` is set, and only then imported (app.py),
with PyJWT.

PyJWT checks signatures and claims; the keys are fetched here with aiohttp (PyJWKClient would
block the event loop on urllib), from auth.jwks_url or the `jwks_uri` of the issuer's metadata
(which Discovery fetches and caches). Everything verified is cached: the JWKS per its Cache-Control
(bounded by auth.metadata_max_age_s) and each verified token until it expires, so a repeated token
costs one hash and a dict lookup. A `kid` the JWKS does not hold refetches it at most once per
UNKNOWN_KID_REFETCH_S per JWKS, so a flood of made-up kids is not a flood of fetches; concurrent
fetches of one URL share one request.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import jwt
import orjson
import structlog

from ..config import AuthConfig
from .discovery import MetadataError
from .identity import InvalidToken, KeysUnavailable, VerifiedToken, unverified_claims

log = structlog.get_logger(__name__)

UNKNOWN_KID_REFETCH_S = 30.0  # the least time between two fetches of one JWKS for a kid it lacked
STALE_KEYS_GRACE_S = 3600.0  # expired keys still used this long while their JWKS cannot be fetched
FETCH_TIMEOUT_S = 5.0  # for the whole JWKS fetch
MAX_DOCUMENT_BYTES = 1 << 20  # a JWKS larger than this is refused
TOKEN_CACHE_MAX = 8192  # verified tokens remembered

# Which key type (and curve) can carry each JWS algorithm (RFC 7518 §3, RFC 8037).
_KEY_TYPES: dict[str, tuple[str, str | None]] = {
    **{f"{p}{n}": ("RSA", None) for p in ("RS", "PS") for n in (256, 384, 512)},
    "ES256": ("EC", "P-256"),
    "ES384": ("EC", "P-384"),
    "ES512": ("EC", "P-521"),
    "ES256K": ("EC", "secp256k1"),
    "EdDSA": ("OKP", None),
}
_MAX_AGE = re.compile(r"(?i)(?:^|,)\s*max-age\s*=\s*\"?(\d+)")
_NO_CACHE = re.compile(r"(?i)(?:^|,)\s*(?:no-store|no-cache)\b")


def same_url(a: str, b: str) -> bool:
    """Issuers and audiences compared as strings, up to a trailing slash (libraries differ in
    whether `https://as.example` gains one)."""
    return a == b or a.rstrip("/") == b.rstrip("/")


def max_age(cache_control: str | None, bound: float) -> float:
    """How long a fetched document may be used: its max-age, at most `bound` (no-store: 0)."""
    if cache_control is None:
        return bound
    if _NO_CACHE.search(cache_control):
        return 0.0
    match = _MAX_AGE.search(cache_control)
    return min(float(match.group(1)), bound) if match else bound


class _Key:
    __slots__ = ("alg", "crv", "data", "kid", "kty", "objects")

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.kid = data.get("kid") if isinstance(data.get("kid"), str) else None
        self.kty = data.get("kty")
        self.crv = data.get("crv")
        self.alg = data.get("alg")
        self.objects: dict[str, Any] = {}  # algorithm -> the key as PyJWT uses it

    def fits(self, alg: str) -> bool:
        kty, crv = _KEY_TYPES.get(alg, ("", None))
        if self.kty != kty or (crv is not None and self.crv != crv):
            return False
        if alg == "EdDSA" and self.crv not in ("Ed25519", "Ed448"):
            return False
        return self.alg is None or self.alg == alg

    def key_for(self, alg: str) -> Any:
        key = self.objects.get(alg)
        if key is None:
            key = self.objects[alg] = jwt.PyJWK(self.data, algorithm=alg).key
        return key


class _KeySet:
    """One JWKS: its keys, when they go stale, and when it was last fetched."""

    __slots__ = ("expires_at", "fetched_at", "keys")

    def __init__(self, keys: list[_Key], fetched_at: float, expires_at: float) -> None:
        self.keys = keys
        self.fetched_at = fetched_at
        self.expires_at = expires_at

    def matching(self, kid: str | None, alg: str) -> list[_Key]:
        return [k for k in self.keys if (kid is None or k.kid == kid) and k.fits(alg)]


class TokenVerifier:
    """Verifies access tokens of the configured issuers for one audience per call."""

    def __init__(
        self,
        config: AuthConfig,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        *,
        issuer_metadata: Callable[[str], Awaitable[dict[str, Any]]] | None = None,
    ) -> None:
        """`issuer_metadata(issuer)`: the issuer's authorization server metadata (Discovery's),
        where its `jwks_uri` is unless auth.jwks_url says."""
        self._config = config
        self._issuer_metadata = issuer_metadata
        self._clock = clock
        self._monotonic = monotonic
        self._issuers = list(config.issuers)
        self._algorithms = list(config.algorithms)
        self._bound = config.metadata_max_age_s
        self._client: aiohttp.ClientSession | None = None
        self._jwks: dict[str, _KeySet] = {}  # JWKS URL -> its keys
        self._jwks_uris: dict[str, str] = {}  # issuer -> where its metadata last said its JWKS is
        self._attempted: dict[str, float] = {}  # JWKS URL -> monotonic time of the last fetch attempt
        self._flights: dict[str, asyncio.Future[Any]] = {}  # URL -> its fetch under way
        self._verified: OrderedDict[bytes, tuple[VerifiedToken, float]] = OrderedDict()
        self.fetches = 0  # JWKS documents fetched

    # ------------------------------------------------------------ tokens

    def issuer_of(self, claims: dict[str, Any]) -> str | None:
        """The configured issuer an (unverified) payload names, as configured."""
        iss = claims.get("iss")
        if not isinstance(iss, str):
            return None
        return next((issuer for issuer in self._issuers if same_url(issuer, iss)), None)

    def cached(self, token: str, audience: str) -> VerifiedToken | None:
        """A token verified before for this audience and not yet expired."""
        key = _cache_key(token, audience)
        hit = self._verified.get(key)
        if hit is None:
            return None
        verified, expires = hit
        if self._clock() >= expires:
            del self._verified[key]
            return None
        self._verified.move_to_end(key)
        return verified

    async def verify(self, token: str, audience: str) -> VerifiedToken:
        """The token's verified claims for `audience`; raises InvalidToken or KeysUnavailable."""
        cache_key = _cache_key(token, audience)
        hit = self.cached(token, audience)
        if hit is not None:
            return hit
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise InvalidToken("the token is not a well-formed JWT") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self._algorithms:
            raise InvalidToken(f"the token's algorithm {str(alg)[:20]!r} is not accepted")
        claims = unverified_claims(token)
        if claims is None:
            raise InvalidToken("the token is not a well-formed JWT")
        issuer = self.issuer_of(claims)
        if issuer is None:
            raise InvalidToken("the token's issuer is not trusted")
        kid = header.get("kid") if isinstance(header.get("kid"), str) else None
        candidates = await self._keys(issuer, kid, alg)
        accepted = [audience, audience.rstrip("/"), audience.rstrip("/") + "/"]
        payload: dict[str, Any] | None = None
        failure: InvalidToken | None = None
        for key in candidates:
            try:
                payload = jwt.decode(
                    token,
                    key.key_for(alg),
                    algorithms=[alg],
                    audience=list(dict.fromkeys(accepted)),
                    issuer=claims["iss"],
                    leeway=self._config.leeway_s,
                    options={"require": ["exp", "iss", "sub", "aud"]},
                )
                break
            except jwt.InvalidSignatureError:
                failure = InvalidToken("the token's signature does not verify")
            except jwt.PyJWKError:
                failure = InvalidToken("the issuer's key for the token is unusable")
            except jwt.PyJWTError as exc:
                raise InvalidToken(_reason(exc, audience)) from None
        if payload is None:
            raise failure or InvalidToken("the token's signature does not verify")
        subject = payload.get("sub")
        if not isinstance(subject, str) or not subject:
            raise InvalidToken("the token has no subject")
        client = payload.get("client_id", payload.get("azp"))
        verified = VerifiedToken(
            issuer=issuer,
            subject=subject,
            client_id=client if isinstance(client, str) else None,
            scopes=_scopes(payload),
            expires_at=float(payload["exp"]),
        )
        self._verified[cache_key] = (verified, verified.expires_at + self._config.leeway_s)
        while len(self._verified) > TOKEN_CACHE_MAX:
            self._verified.popitem(last=False)
        return verified

    # ------------------------------------------------------------ keys

    async def _keys(self, issuer: str, kid: str | None, alg: str) -> list[_Key]:
        now = self._monotonic()
        url = self._config.jwks_url or self._jwks_uris.get(issuer)
        keyset = self._jwks.get(url) if url is not None else None
        if url is None or keyset is None or now >= keyset.expires_at:
            # The metadata is asked only when the keys need fetching: where they are may have moved.
            try:
                fresh = self._config.jwks_url
                if fresh is None:
                    fresh = self._jwks_uris[issuer] = await self._jwks_uri(issuer)
                keyset = await self._fetch_jwks(fresh)
                url = fresh
            except KeysUnavailable:
                if keyset is None or now >= keyset.expires_at + STALE_KEYS_GRACE_S:
                    raise
                log.warning("jwks_stale_used", url=url)  # a passing outage: the last keys still verify
        assert url is not None
        if not keyset.keys:
            raise KeysUnavailable("the issuer's JWKS holds no signing keys")  # no key yet: not the token's fault
        found = keyset.matching(kid, alg)
        if found or kid is None:
            if not found:
                raise InvalidToken(f"the issuer has no key for algorithm {alg}")
            return found
        # A kid this JWKS lacks: the issuer may have rotated its keys since (once per interval;
        # a fetch already under way is joined).
        if url in self._flights or now - self._attempted.get(url, -UNKNOWN_KID_REFETCH_S) >= UNKNOWN_KID_REFETCH_S:
            keyset = await self._fetch_jwks(url)
            found = keyset.matching(kid, alg)
        if not found:
            raise InvalidToken("the token's key id is not among the issuer's keys")
        return found

    async def _fetch_jwks(self, url: str) -> _KeySet:
        """The JWKS fetched anew; concurrent callers share one fetch (a flight)."""
        flight = self._flights.get(url)
        if flight is None:
            self._attempted[url] = self._monotonic()
            flight = self._flights[url] = asyncio.ensure_future(self._load_jwks(url))
            flight.add_done_callback(partial(self._landed, url))
        keyset: _KeySet = await asyncio.shield(flight)  # a caller that goes away leaves the fetch to the others
        return keyset

    async def _load_jwks(self, url: str) -> _KeySet:
        document, lifetime = await self._get(url)
        raw_keys = document.get("keys")
        if not isinstance(raw_keys, list):
            log.warning("jwks_unavailable", url=url, error="the document has no keys list")
            raise KeysUnavailable("the issuer's JWKS is malformed")
        keys = [
            _Key(k)
            for k in raw_keys
            if isinstance(k, dict) and isinstance(k.get("kty"), str) and k.get("use", "sig") == "sig"
        ]
        now = self._monotonic()
        keyset = _KeySet(keys, now, now + lifetime)
        self._jwks[url] = keyset
        log.info("jwks_fetched", url=url, keys=len(keys), max_age_s=lifetime)
        return keyset

    def _landed(self, url: str, flight: asyncio.Future[Any]) -> None:
        self._flights.pop(url, None)
        if not flight.cancelled():
            flight.exception()  # retrieved: each caller re-raises it itself

    async def _jwks_uri(self, issuer: str) -> str:
        """The issuer's `jwks_uri`, from its authorization server metadata (Discovery fetches and
        caches it, and checks that it names this issuer: RFC 8414 §3.3)."""
        if self._issuer_metadata is None:
            raise KeysUnavailable("neither auth.jwks_url nor the issuer's metadata is at hand")
        try:
            document = await self._issuer_metadata(issuer)
        except MetadataError as exc:
            log.warning("jwks_unavailable", issuer=issuer, error=exc.description)
            raise KeysUnavailable(f"the issuer's metadata cannot be had ({exc.description})") from None
        jwks_uri = document.get("jwks_uri")
        if not isinstance(jwks_uri, str) or urlsplit(jwks_uri).scheme not in ("http", "https"):
            log.warning("jwks_unavailable", issuer=issuer, error="the metadata has no jwks_uri")
            raise KeysUnavailable("the issuer's metadata has no jwks_uri")
        return jwks_uri

    async def _get(self, url: str) -> tuple[dict[str, Any], float]:
        """The JWKS document and how long it may be used; KeysUnavailable (logged) otherwise."""
        if self._client is None:
            self._client = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S),
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),  # fetched for every caller: nothing kept between fetches
            )
        self.fetches += 1
        try:
            async with self._client.get(url, headers={"Accept": "application/json"}) as response:
                if response.status != 200:
                    raise KeysUnavailable(f"the JWKS {url} answered HTTP {response.status}")
                lifetime = max_age(response.headers.get("Cache-Control"), self._bound)
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.content.iter_chunked(1 << 16):
                    size += len(chunk)
                    if size > MAX_DOCUMENT_BYTES:
                        raise KeysUnavailable(f"the JWKS {url} is too large")
                    chunks.append(chunk)
            try:
                document = orjson.loads(b"".join(chunks))
            except orjson.JSONDecodeError:
                document = None
            if not isinstance(document, dict):
                raise KeysUnavailable(f"the JWKS {url} is not a JSON object")
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("jwks_unavailable", url=url, error=f"{exc.__class__.__name__}: {exc}"[:300])
            raise KeysUnavailable(f"the JWKS {url} is unreachable ({exc.__class__.__name__})") from None
        except KeysUnavailable as exc:
            log.warning("jwks_unavailable", url=url, error=str(exc))
            raise
        return document, lifetime

    async def close(self) -> None:
        for flight in list(self._flights.values()):
            flight.cancel()
        if self._client is not None:
            await self._client.close()
            self._client = None


def _cache_key(token: str, audience: str) -> bytes:
    return hashlib.sha256(token.encode() + b"\0" + audience.encode()).digest()


def _scopes(payload: dict[str, Any]) -> frozenset[str]:
    """`scope` (RFC 9068 §2.2.3: space-separated), or the `scp` list some servers send."""
    scope = payload.get("scope")
    if isinstance(scope, str):
        return frozenset(scope.split())
    scp = payload.get("scp")
    if isinstance(scp, list):
        return frozenset(s for s in scp if isinstance(s, str))
    if isinstance(scp, str):
        return frozenset(scp.split())
    return frozenset()


def _reason(exc: jwt.PyJWTError, audience: str) -> str:
    """What the client's challenge says about a claim check that failed."""
    if isinstance(exc, jwt.ExpiredSignatureError):
        return "the token expired"
    if isinstance(exc, jwt.ImmatureSignatureError):
        return "the token is not valid yet"
    if isinstance(exc, jwt.InvalidAudienceError):
        return f"the token's audience is not {audience}"
    if isinstance(exc, jwt.MissingRequiredClaimError):
        return f"the token has no {exc.claim} claim"
    if isinstance(exc, jwt.InvalidIssuerError):
        return "the token's issuer is not trusted"
    if isinstance(exc, jwt.DecodeError):
        return "the token is not a well-formed JWT"
    return "the token is invalid"
