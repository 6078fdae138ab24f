"""Legacy sessions held by the proxy: signed ids, the session record, and the store interface.

The record is plain data so a shared store (e.g. Redis) can hold it; live objects (open
streams, waiting futures, tasks) stay with the replica that owns them (see relay.runtime).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .protocol.request_state import b64url, unb64url

JSONDict = dict[str, Any]


def principal_of(credential: str | None) -> str:
    """A stable, non-reversible id for the caller's authorization context ("" = anonymous)."""
    if not credential:
        return ""
    return hashlib.sha256(credential.encode()).hexdigest()[:32]


def short_hash(value: str) -> str:
    """What logs show instead of a session id or credential."""
    return hashlib.sha256(value.encode()).hexdigest()[:12]


_CHECKED_MAX = 65_536  # ids remembered as checked (the cache starts afresh when full)


class SessionIds:
    """Mints and checks `Mcp-Session-Id` values: 128 random bits, issue time, HMAC.

    The HMAC covers the caller's principal, so an id presented by anyone else fails the
    check exactly like an unknown id (404), and a forged id never reaches the store. Ids are
    minted with `secret`; those minted with a `previous` secret still check, so a secret can be
    replaced across replicas without ending the sessions it signed.
    """

    _MAC_BYTES = 16

    def __init__(
        self,
        secret: bytes,
        max_lifetime_s: float,
        clock: Callable[[], float] = time.time,
        previous: Sequence[bytes] = (),
    ) -> None:
        self._secret = secret
        self._secrets = (secret, *previous)
        self._max_lifetime_s = max_lifetime_s
        self._clock = clock
        # (id, principal) -> issue time of the ids already checked: a session's every request
        # presents its id again, and the MAC need not be computed each time.
        self._checked: dict[tuple[str, str], int] = {}

    def mint(self, principal: str) -> str:
        payload = secrets.token_bytes(16) + struct.pack(">Q", int(self._clock()))
        return b64url(payload) + "." + b64url(self._mac(payload, principal, self._secret))

    def check(self, session_id: str, principal: str) -> bool:
        issued = self._checked.get((session_id, principal))
        if issued is None:
            issued = self._verify(session_id, principal)
            if issued is None:
                return False
            if len(self._checked) >= _CHECKED_MAX:
                self._checked.clear()
            self._checked[(session_id, principal)] = issued
        return self._clock() - issued <= self._max_lifetime_s

    def _verify(self, session_id: str, principal: str) -> int | None:
        """The issue time of an id minted here for this principal; None for any other id."""
        body, dot, mac = session_id.partition(".")
        if not dot or len(session_id) > 80:
            return None
        try:
            payload = unb64url(body)
            given = unb64url(mac)
        except ValueError:
            return None
        if len(payload) != 24 or not any(
            hmac.compare_digest(given, self._mac(payload, principal, key)) for key in self._secrets
        ):
            return None
        issued: int = struct.unpack(">Q", payload[16:])[0]
        return issued

    def _mac(self, payload: bytes, principal: str, secret: bytes) -> bytes:
        digest = hmac.new(secret, payload + principal.encode(), hashlib.sha256).digest()
        return digest[: self._MAC_BYTES]


@dataclass(slots=True)
class LegacySession:
    """Everything a legacy session needs to outlive one request."""

    id: str
    principal: str
    legacy_version: str
    modern_version: str
    client_capabilities: JSONDict  # as the legacy client declared them
    upstream_capabilities: JSONDict  # the same, as per-request modern clientCapabilities
    server_capabilities: JSONDict  # the upstream's modern capabilities, from server/discover
    client_info: JSONDict | None
    log_level: str | None = None
    subscriptions: frozenset[str] = frozenset()
    initialized: bool = False
    created_at: float = 0.0
    last_seen: float = 0.0
    extra: JSONDict = field(default_factory=dict)


class SessionStore(Protocol):
    """Where legacy sessions live. Implementations must be safe for concurrent coroutines."""

    async def add(self, session: LegacySession) -> None: ...
    async def get(self, session_id: str) -> LegacySession | None: ...
    async def save(self, session: LegacySession) -> None: ...
    async def remove(self, session_id: str) -> LegacySession | None: ...
    async def count(self) -> int: ...
    async def idle_since(self, cutoff: float) -> list[str]: ...
    async def created_before(self, cutoff: float) -> list[str]: ...


class InMemorySessionStore:
    """The default store: a dict in this process."""

    def __init__(self) -> None:
        self._sessions: dict[str, LegacySession] = {}

    async def add(self, session: LegacySession) -> None:
        self._sessions[session.id] = session

    async def get(self, session_id: str) -> LegacySession | None:
        return self._sessions.get(session_id)

    async def save(self, session: LegacySession) -> None:
        self._sessions[session.id] = session

    async def remove(self, session_id: str) -> LegacySession | None:
        return self._sessions.pop(session_id, None)

    async def count(self) -> int:
        return len(self._sessions)

    async def idle_since(self, cutoff: float) -> list[str]:
        return [sid for sid, s in self._sessions.items() if s.last_seen < cutoff]

    async def created_before(self, cutoff: float) -> list[str]:
        return [sid for sid, s in self._sessions.items() if s.created_at < cutoff]
