"""Who calls: the principal every caller-bound thing is keyed by, and in resource_server mode
whether the caller may call at all.

The principal binds legacy sessions (the AAD of their ids), pooled upstream sessions, private
cache entries, requestState and parked calls. Its sources, first that applies:
1. `security.identity_header` (a gateway in front has authenticated the caller and names it);
2. a Bearer JWT verified against `auth.issuers`: the caller is (issuer, subject[, client id]), so a
   refreshed token is the same caller (docs/design.md §Authorization);
3. otherwise (an opaque token, or no issuers configured) the hash of the Authorization header.
Principals of kind 2 carry a prefix no hash has: they never collide with kind 1 or 3.

Tokens are verified by a `TokenVerifier` (auth/tokens.py, PyJWT), given only when `auth.issuers`
is set: what the identifier needs of one, and the verification's outcomes, are defined here, so
that a proxy with no issuers never imports PyJWT (nor cryptography's certificates and keys).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import orjson
import structlog
from aiohttp import web

from ..config import Settings
from ..errors import ProxyError
from ..metrics import Metrics
from ..protocol import jsonrpc
from ..state.sessions import principal_of
from . import challenge
from .discovery import derived_resource

log = structlog.get_logger(__name__)

SUBJECT_PREFIX = "iss:"  # principals named by a verified token; a header hash is bare hex


class InvalidToken(Exception):
    """The token is not acceptable: the message says why (an `error_description`)."""


class KeysUnavailable(Exception):
    """The issuer's keys cannot be had (JWKS or metadata unreachable, malformed, empty)."""


@dataclass(frozen=True, slots=True)
class VerifiedToken:
    issuer: str
    subject: str
    client_id: str | None
    scopes: frozenset[str]
    expires_at: float


class TokenVerifier(Protocol):
    """What the identifier asks of the verifier of `auth.issuers`' tokens (auth/tokens.py)."""

    def issuer_of(self, claims: dict[str, Any]) -> str | None:
        """The configured issuer an (unverified) payload names, or None: not a token of ours."""
        ...

    def cached(self, token: str, audience: str) -> VerifiedToken | None:
        """A token verified before for this audience and not yet expired."""
        ...

    async def verify(self, token: str, audience: str) -> VerifiedToken:
        """The token's verified claims for `audience`; raises InvalidToken or KeysUnavailable."""
        ...


def unverified_claims(token: str) -> dict[str, Any] | None:
    """The payload of something shaped like a JWS compact serialization, unverified; None if it
    is not one (an opaque token)."""
    parts = token.split(".")
    if len(parts) != 3 or not parts[0] or not parts[1]:  # an empty signature is still a JWT (alg none)
        return None
    try:
        payload = orjson.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, orjson.JSONDecodeError):
        return None
    return payload if isinstance(payload, dict) else None


@dataclass(frozen=True, slots=True)
class Identity:
    principal: str
    token: VerifiedToken | None = None  # the caller's verified access token, if it had one


_ANONYMOUS = Identity(principal_of(None))


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (RFC 6750 §2.1), else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def subject_principal(token: VerifiedToken, with_client: bool) -> str:
    parts = [token.issuer, token.subject, token.client_id or ""] if with_client else [token.issuer, token.subject]
    return SUBJECT_PREFIX + hashlib.sha256(orjson.dumps(parts)).hexdigest()[:32]


class Identifier:
    """One per app: identifies each downstream request's caller (refusing it in resource_server
    mode when its token does not do)."""

    def __init__(
        self,
        settings: Settings,
        verifier: TokenVerifier | None,
        public_resource: Callable[[web.BaseRequest], str | None] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        """`public_resource(request)`: the MCP endpoint's URL as clients reach it (Discovery's, so
        the challenges and the metadata name the same one); None for a Host that is no host."""
        auth = settings.auth
        self._settings = settings
        self._verifier = verifier
        self._public_resource = public_resource or partial(_public_resource, settings)
        self._resource_server = auth.mode == "resource_server"
        self._identity_header = settings.security.identity_header
        self._client_in_identity = auth.client_in_identity
        self._required = frozenset(auth.required_scopes)
        self._audience = auth.audience or auth.public_url
        checks = (metrics or Metrics()).token_checks
        # Children resolved once: counting a check costs an increment, not a label lookup.
        self._checked = {
            result: checks.labels(result)
            for result in ("verified", "cached", "invalid", "missing", "insufficient_scope", "keys_unavailable")
        }

    @property
    def resource_server(self) -> bool:
        return self._resource_server

    def unverified(self, request: web.BaseRequest) -> Identity | None:
        """The caller's identity when no token of it is to be verified (no verifier, not a
        resource server): what `identify` would say, without awaiting. None otherwise."""
        if self._verifier is not None or self._resource_server:
            return None
        header = self._identity_header if self._identity_header is not None else "Authorization"
        credential = request.headers.get(header)
        return Identity(principal_of(credential)) if credential else _ANONYMOUS

    async def identify(self, request: web.BaseRequest) -> Identity:
        headers = request.headers
        authorization = headers.get("Authorization")
        verified = await self._verified(request, authorization)
        if self._identity_header is not None:
            return Identity(principal_of(headers.get(self._identity_header)), verified)
        if verified is not None:
            return Identity(subject_principal(verified, self._client_in_identity), verified)
        return Identity(principal_of(authorization))

    async def _verified(self, request: web.BaseRequest, authorization: str | None) -> VerifiedToken | None:
        verifier = self._verifier
        token = bearer_token(authorization)
        if verifier is None or token is None:
            if self._resource_server:
                self._checked["missing"].inc()
                # RFC 6750 §3.1: a request without credentials gets a challenge with no error code.
                raise self._refusal(request, 401, None, "authorization required: send a Bearer access token")
            return None
        audience = self._audience or self._resource(request)
        verified = verifier.cached(token, audience)
        if verified is not None:
            self._checked["cached"].inc()
        else:
            if not self._resource_server:
                claims = unverified_claims(token)
                if claims is None or verifier.issuer_of(claims) is None:
                    return None  # not a token of ours to judge: the upstream does (passthrough)
            try:
                verified = await verifier.verify(token, audience)
            except InvalidToken as exc:
                self._checked["invalid"].inc()
                log.info("token_refused", reason=str(exc), mode=self._settings.auth.mode)
                raise self._refusal(request, 401, "invalid_token", str(exc)) from None
            except KeysUnavailable:
                self._checked["keys_unavailable"].inc()
                # What failed (a URL, perhaps internal) is logged as jwks_unavailable, not told.
                raise ProxyError(
                    jsonrpc.INTERNAL_ERROR,
                    "the access token cannot be verified now: the authorization server's keys are unavailable",
                    status=503,
                    headers={"Retry-After": "5"},
                    outcome="error",
                ) from None
            self._checked["verified"].inc()
        if self._resource_server and not self._required <= verified.scopes:
            self._checked["insufficient_scope"].inc()
            missing = " ".join(sorted(self._required - verified.scopes))
            log.info("token_refused", reason=f"missing scopes {missing}", mode=self._settings.auth.mode)
            raise self._refusal(
                request,
                403,
                "insufficient_scope",
                f"the token lacks the scopes {missing}",
                scope=" ".join(sorted(self._required)),
            )
        return verified

    def _resource(self, request: web.BaseRequest) -> str:
        resource = self._public_resource(request)
        if resource is None:  # the guard lets only hosts through; this is the last word
            raise ProxyError(jsonrpc.INVALID_REQUEST, "the Host header names no host", status=400, outcome="rejected")
        return resource

    def _refusal(
        self, request: web.BaseRequest, status: int, error: str | None, description: str, scope: str | None = None
    ) -> ProxyError:
        metadata = challenge.metadata_url(self._resource(request))
        return ProxyError(
            jsonrpc.INVALID_REQUEST,
            description if status == 401 and error is None else f"{error}: {description}",
            status=status,
            headers={"WWW-Authenticate": challenge.bearer(metadata, error, description if error else None, scope)},
            outcome="rejected",
        )


def _public_resource(settings: Settings, request: web.BaseRequest) -> str | None:
    return settings.auth.public_url or derived_resource(request.scheme, request.headers.get("Host"), settings.path)
