"""The `requestState` tokens that resume parked legacy calls (docs/translation.md §4.5).

A legacy server asks the client for input in the middle of a call. The modern client can only
get an `input_required` result and retry later, so the upstream call stays open ("parked")
and the result carries a token naming it. The token is HMAC-signed, expires, and is bound to
the caller, the method, the parameters and the round, so it resumes that call exactly once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from . import jsonrpc

JSONDict = dict[str, Any]
_MAC_BYTES = 16
_VERSION = 1  # of the claims format
_DIGEST_EXCLUDED = ("_meta", "inputResponses", "requestState")


def params_digest(params: object) -> str:
    """What ties a token to the request it answers: the parameters, minus the MRTR fields."""
    salient = {k: v for k, v in params.items() if k not in _DIGEST_EXCLUDED} if isinstance(params, dict) else {}
    return hashlib.sha256(jsonrpc.canonical(salient)).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class StateClaims:
    park_id: str
    principal: str
    method: str
    digest: str
    round: int
    expires: float
    instance: str


class RequestStateCodec:
    def __init__(
        self, secret: bytes, instance: str, clock: Callable[[], float], previous: Sequence[bytes] = ()
    ) -> None:
        # A key of its own, so a session id can never pass for a requestState or the reverse.
        # Tokens are minted with `secret`; those of a `previous` secret still verify (rotation).
        self._keys = tuple(_derive(key) for key in (secret, *previous))
        self._key = self._keys[0]
        self.instance = instance
        self._clock = clock

    def mint(self, park_id: str, principal: str, method: str, digest: str, round_: int, ttl_s: float) -> str:
        claims = {
            "v": _VERSION,
            "pid": park_id,
            "sub": principal,
            "m": method,
            "d": digest,
            "r": round_,
            "exp": round(self._clock() + ttl_s, 3),
            "inst": self.instance,
        }
        payload = orjson.dumps(claims)
        return b64url(payload) + "." + b64url(self._mac(payload, self._key))

    def verify(self, token: object) -> StateClaims | None:
        """The token's claims if it is intact, ours and unexpired; None otherwise."""
        if not isinstance(token, str) or len(token) > 4096:
            return None
        body, dot, mac = token.partition(".")
        if not dot:
            return None
        try:
            payload, given = unb64url(body), unb64url(mac)
            if not any(hmac.compare_digest(given, self._mac(payload, key)) for key in self._keys):
                return None
            claims = orjson.loads(payload)
        except (ValueError, orjson.JSONDecodeError):
            return None
        if not isinstance(claims, dict) or claims.get("v") != _VERSION:
            return None
        strings = [value for key in ("pid", "sub", "m", "d", "inst") if isinstance(value := claims.get(key), str)]
        round_, expires = claims.get("r"), claims.get("exp")
        if (
            len(strings) != 5
            or not isinstance(round_, int)
            or isinstance(round_, bool)
            or not isinstance(expires, (int, float))
            or isinstance(expires, bool)
        ):
            return None
        if expires <= self._clock():  # valid while exp > now (docs/translation.md §4.5)
            return None
        park_id, principal, method, digest, instance = strings
        return StateClaims(park_id, principal, method, digest, round_, float(expires), instance)

    def _mac(self, payload: bytes, key: bytes) -> bytes:
        return hmac.new(key, payload, hashlib.sha256).digest()[:_MAC_BYTES]


def _derive(secret: bytes) -> bytes:
    return hmac.new(secret, b"mcp-era-proxy/requestState/v1", hashlib.sha256).digest()


def new_park_id() -> str:
    return secrets.token_urlsafe(16)


class ParkIds:
    """Unique ids for calls that may park: a random prefix per process and a counter. They need not
    be secret: a requestState naming one is sealed, so only the proxy can mint it."""

    __slots__ = ("_count", "_prefix")

    def __init__(self) -> None:
        self._prefix = new_park_id()
        self._count = 0

    def next(self) -> str:
        self._count += 1
        return f"{self._prefix}.{self._count}"


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def unb64url(text: str) -> bytes:
    """Strict base64url: any byte outside the alphabet, or a non-canonical form, is refused."""
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (ValueError, TypeError) as exc:
        raise ValueError(str(exc)) from None
    if b64url(raw) != text:
        raise ValueError("non-canonical base64url")
    return raw
