"""The `requestState` tokens that resume parked legacy calls (docs/translation.md §4.5).

A legacy server asks the client for input in the middle of a call. The modern client can only
get an `input_required` result and retry later, so the upstream call stays open ("parked")
and the result carries a token naming it. The token is sealed (encrypted and authenticated by
the injected sealer), expires, is bound to the caller (as associated data), the method, the
parameters and the round, so it resumes that call exactly once; and it names the replica that
holds the call, so a retry that lands on another replica can be forwarded there.
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from . import jsonrpc

JSONDict = dict[str, Any]
PURPOSE = "rst"  # the sealing purpose of requestState tokens: no other token opens as one
MAX_TOKEN_CHARS = 4096
_VERSION = 2  # of the claims format
_DIGEST_EXCLUDED = ("_meta", "inputResponses", "requestState")


def params_digest(params: object) -> str:
    """What ties a token to the request it answers: the parameters, minus the MRTR fields."""
    salient = {k: v for k, v in params.items() if k not in _DIGEST_EXCLUDED} if isinstance(params, dict) else {}
    return hashlib.sha256(jsonrpc.canonical(salient)).hexdigest()[:32]


class TokenSealer(Protocol):
    """Authenticated encryption of tokens (the edge's proxy.sealing.Sealer), injected so that this
    core stays free of keys and ciphers. `aad` binds a token to a context without carrying it."""

    def seal(self, purpose: str, plaintext: bytes, aad: bytes = b"") -> str: ...

    def open(self, purpose: str, token: object, aad: bytes = b"") -> bytes | None: ...


@dataclass(frozen=True, slots=True)
class StateClaims:
    park_id: str
    principal: str
    method: str
    digest: str
    round: int
    expires: float
    boot: str  # the replica process that holds the parked call
    address: str | None  # where other replicas reach it (None: nowhere, one replica)


class RequestStateCodec:
    """`boot` and `address` name this replica; every token minted here carries them, so the replica
    a retry lands on knows who holds the call. The sealer keeps previous secrets (rotation)."""

    def __init__(self, sealer: TokenSealer, boot: str, address: str | None, clock: Callable[[], float]) -> None:
        self._sealer = sealer
        self.boot = boot
        self.address = address
        self._clock = clock

    def mint(self, park_id: str, principal: str, method: str, digest: str, round_: int, ttl_s: float) -> str:
        claims = {
            "v": _VERSION,
            "pid": park_id,
            "m": method,
            "d": digest,
            "r": round_,
            "exp": round(self._clock() + ttl_s, 3),
            "own": [self.boot, self.address],
        }
        # The principal is the associated data: bound to the token, never written in it.
        return self._sealer.seal(PURPOSE, orjson.dumps(claims), principal.encode())

    def verify(self, token: object, principal: str) -> StateClaims | None:
        """The claims of a token sealed for `principal`, intact and unexpired; None otherwise.
        Whoever holds the call (this replica or another) is for the caller to look at."""
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
            return None
        payload = self._sealer.open(PURPOSE, token, principal.encode())
        if payload is None:
            return None
        try:
            claims = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(claims, dict) or claims.get("v") != _VERSION:
            return None
        strings = [value for key in ("pid", "m", "d") if isinstance(value := claims.get(key), str)]
        round_, expires, owner = claims.get("r"), claims.get("exp"), claims.get("own")
        if (
            len(strings) != 3
            or not isinstance(round_, int)
            or isinstance(round_, bool)
            or not isinstance(expires, (int, float))
            or isinstance(expires, bool)
            or not isinstance(owner, list)
            or len(owner) != 2
            or not isinstance(owner[0], str)
            or not isinstance(owner[1], (str, type(None)))
        ):
            return None
        if expires <= self._clock():  # valid while exp > now (docs/translation.md §4.5)
            return None
        park_id, method, digest = strings
        return StateClaims(park_id, principal, method, digest, round_, float(expires), owner[0], owner[1])

    def is_local(self, claims: StateClaims) -> bool:
        return claims.boot == self.boot


def new_park_id() -> str:
    return secrets.token_urlsafe(16)


class ParkIds:
    """Unique ids for calls that may park: a random prefix per process and a counter. They need not
    be secret: a requestState naming one is sealed, so only the proxy can mint it."""

    __slots__ = ("next",)

    next: Callable[[], str]  # the next id: "<prefix>.<n>"

    def __init__(self) -> None:
        # Minted for every call that may park: made in C (format over a count), no Python frame.
        self.next = map(f"{new_park_id()}.{{}}".format, itertools.count(1)).__next__
