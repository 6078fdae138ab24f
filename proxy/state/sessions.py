"""Legacy sessions held by the proxy: signed ids, the session record, and the store interface.

The record is plain data so a shared store (e.g. Redis) can hold it; live objects (open
streams, waiting futures, tasks) stay with the replica that owns them (see relay.runtime).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from ..errors import ProxyError
from ..protocol import jsonrpc
from ..protocol.jsonrpc import b64url
from .sealing import Sealer

JSONDict = dict[str, Any]


def principal_of(credential: str | None) -> str:
    """A stable, non-reversible id for the caller's authorization context ("" = anonymous)."""
    if not credential:
        return ""
    return hashlib.sha256(credential.encode()).hexdigest()[:32]


def short_hash(value: str) -> str:
    """What logs show instead of a session id or credential."""
    return hashlib.sha256(value.encode()).hexdigest()[:12]


_OPENED_MAX = 8192  # ids remembered as opened (the cache starts afresh when full)
_NO_SUBSCRIPTIONS: frozenset[str] = frozenset()  # one for every session (each call makes another)
_CORE_VERSION = 1
MAX_CORE_BYTES = 3072  # sealed into the id up to this size; above it, the store holds it (see SessionIds)


@dataclass(frozen=True, slots=True)
class SessionCore:
    """What a legacy session fixes at `initialize` and never changes: sealed into its id, so any
    replica can serve the session from the id alone (docs/design.md §Replicas)."""

    legacy_version: str = ""
    modern_version: str = ""
    client_capabilities: JSONDict = field(default_factory=dict)
    upstream_capabilities: JSONDict = field(default_factory=dict)
    server_capabilities: JSONDict = field(default_factory=dict)
    client_info: JSONDict | None = None
    # False: the store could not record the session when it began (it was unavailable), so a
    # replica that finds no record brings the session back instead of answering 404.
    recorded: bool = True


@dataclass(frozen=True, slots=True)
class OpenedId:
    core: SessionCore | None  # None: too large for the id; the store holds it (`core_in_store`)
    issued_at: float
    # The fields of the session this id describes but for the caller's (LegacySession.from_id):
    # made once per id opened (SessionIds caches it), not for every request.
    described: tuple[Any, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        described: tuple[Any, ...] = (
            *_core_fields(self.core or SessionCore()),
            self.issued_at,  # created_at
            self.core is None,  # core_in_store
            _NO_SUBSCRIPTIONS,  # subscriptions, initialized, stream_owner: at the defaults
            False,
            "",
        )
        object.__setattr__(self, "described", described)


def _core_fields(core: SessionCore) -> tuple[Any, ...]:
    """A core's fields in their order: what encode_core writes and an opened id describes."""
    return (
        core.legacy_version,
        core.modern_version,
        core.client_capabilities,
        core.upstream_capabilities,
        core.server_capabilities,
        core.client_info,
        core.recorded,
    )


def encode_core(core: SessionCore) -> bytes:
    return orjson.dumps(_core_fields(core))


def decode_core(encoded: bytes) -> SessionCore:
    """encode_core's inverse; raises ValueError, TypeError or orjson's error on anything else."""
    lv, mv, caps, up_caps, server_caps, info, recorded = orjson.loads(encoded)
    return SessionCore(lv, mv, caps, up_caps, server_caps, info, bool(recorded))


def core_fits_in_id(core: SessionCore) -> bool:
    return len(encode_core(core)) <= MAX_CORE_BYTES


class SessionIds:
    """Mints and opens `Mcp-Session-Id` values: the session's immutable core, sealed.

    The id is AES-GCM-sealed (proxy.state.sealing, purpose "sid") with the caller's principal as associated
    data: an id presented by anyone else fails exactly like an unknown id (404), a forged or altered
    one never reaches the store, and nobody can read what it carries. Besides 128 random bits and the
    issue time it holds the SessionCore, so a replica that never saw the session can serve it. A core
    larger than MAX_CORE_BYTES stays in the store instead (the id says so). Ids minted under a
    `previous` secret still open (rotation, see Sealer).
    """

    def __init__(self, sealer: Sealer, max_lifetime_s: float, clock: Callable[[], float] = time.time) -> None:
        self._sealer = sealer
        self._max_lifetime_s = max_lifetime_s
        self._clock = clock
        # (id, principal) -> what opening it gave: a session presents its id with every request,
        # and need not be decrypted each time.
        self._opened: dict[tuple[str, str], OpenedId] = {}

    def mint(self, principal: str, core: SessionCore | None = None) -> str:
        core = core or SessionCore()
        fields = encode_core(core)
        in_store = len(fields) > MAX_CORE_BYTES
        issued = int(self._clock())
        head = orjson.dumps([_CORE_VERSION, b64url(secrets.token_bytes(16)), issued, in_store])
        plaintext = head if in_store else head + b"\n" + fields
        session_id = self._sealer.seal("sid", plaintext, principal.encode())
        # Remembered as opened: the session's requests find this core, not a copy decoded from
        # their header, and the id kept is this string, not the first request's copy of it.
        self._remember(session_id, principal, OpenedId(None if in_store else core, float(issued)))
        return session_id

    def open(self, session_id: str, principal: str) -> OpenedId | None:
        """What the id carries, if it was minted here for this caller and is within its lifetime."""
        opened = self._opened.get((session_id, principal))
        if opened is None:
            opened = self._decode(session_id, principal)
            if opened is None:
                return None
            self._remember(session_id, principal, opened)
        if self._clock() - opened.issued_at > self._max_lifetime_s:
            return None
        return opened

    def _remember(self, session_id: str, principal: str, opened: OpenedId) -> None:
        if len(self._opened) >= _OPENED_MAX:
            self._opened.clear()
        self._opened[(session_id, principal)] = opened

    def check(self, session_id: str, principal: str) -> bool:
        return self.open(session_id, principal) is not None

    def _decode(self, session_id: str, principal: str) -> OpenedId | None:
        plaintext = self._sealer.open("sid", session_id, principal.encode())
        if plaintext is None:
            return None
        head, _, fields = plaintext.partition(b"\n")
        try:
            version, _nonce, issued, in_store = orjson.loads(head)
            if version != _CORE_VERSION or not isinstance(issued, int):
                return None
            if in_store:
                return OpenedId(None, float(issued))
            core = decode_core(fields)
        except (orjson.JSONDecodeError, ValueError, TypeError):
            return None  # sealed by us, so only a format change gets here
        return OpenedId(core, float(issued))


@dataclass(slots=True)
class LegacySession:
    """Everything a legacy session needs to outlive one request: its core (from the id) and what
    changes (log level, subscriptions, initialized, a renegotiated modern version)."""

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
    recorded: bool = True  # see SessionCore.recorded
    core_in_store: bool = False  # the core was too large for the id: the store holds it
    # The replica whose GET stream the session last opened ("boot@address"): where what the
    # stream's upstream listen depends on (subscriptions) must be changed.
    stream_owner: str = ""

    @property
    def core(self) -> SessionCore:
        return SessionCore(
            self.legacy_version,
            self.modern_version,
            self.client_capabilities,
            self.upstream_capabilities,
            self.server_capabilities,
            self.client_info,
            self.recorded,
        )

    @classmethod
    def from_core(
        cls,
        session_id: str,
        principal: str,
        core: SessionCore,
        *,
        created_at: float,
        last_seen: float,
        log_level: str | None,
        core_in_store: bool = False,
    ) -> LegacySession:
        """A session with this core, its changing state at the defaults."""
        return cls(
            id=session_id,
            principal=principal,
            legacy_version=core.legacy_version,
            modern_version=core.modern_version,
            client_capabilities=core.client_capabilities,
            upstream_capabilities=core.upstream_capabilities,
            server_capabilities=core.server_capabilities,
            client_info=core.client_info,
            log_level=log_level,
            created_at=created_at,
            last_seen=last_seen,
            recorded=core.recorded,
            core_in_store=core_in_store,
        )

    @classmethod
    def from_id(
        cls, session_id: str, principal: str, opened: OpenedId, now: float, log_level: str | None
    ) -> LegacySession:
        """The session as its id describes it, its changing state at the defaults.

        A shared store's every request describes one: its fields are set from the tuple the
        opened id holds (one unpacking), not passed one by one to the dataclass's __init__."""
        session = _new(cls)
        (
            session.legacy_version,
            session.modern_version,
            session.client_capabilities,
            session.upstream_capabilities,
            session.server_capabilities,
            session.client_info,
            session.recorded,
            session.created_at,
            session.core_in_store,
            session.subscriptions,
            session.initialized,
            session.stream_owner,
        ) = opened.described
        session.id = session_id
        session.principal = principal
        session.log_level = log_level
        session.last_seen = now
        return session

    def take_core(self, core: SessionCore) -> None:
        """The core the store kept for a session whose id could not carry it (a modern version
        renegotiated since stays)."""
        self.legacy_version = core.legacy_version
        self.modern_version = self.modern_version or core.modern_version
        self.client_capabilities = core.client_capabilities
        self.upstream_capabilities = core.upstream_capabilities
        self.server_capabilities = core.server_capabilities
        self.client_info = core.client_info


_new = object.__new__  # LegacySession.from_id: the instance, its fields set there


class StoreUnavailable(ProxyError):
    """The shared store did not answer in time (or its breaker is open): what would change shared
    session state is refused rather than applied on one replica only."""

    def __init__(self, operation: str) -> None:
        super().__init__(
            jsonrpc.INTERNAL_ERROR,
            f"the shared session store is unavailable, so {operation} cannot be applied now; try again shortly",
            data={"reason": "store_unavailable"},
        )


class SessionStore(Protocol):
    """Where the changing state of legacy sessions lives; safe for concurrent coroutines.

    The immutable core travels in the session id (SessionIds), so `load` is given the session as
    its id describes it and fills in the rest. A `shared` store is seen by every replica and expires
    idle sessions itself (a sliding TTL): a replica then never ends a session for being idle here,
    it only lets its own live part go.
    """

    shared: bool

    async def add(self, session: LegacySession) -> None:
        """Record a new session; raises StoreUnavailable when it cannot."""

    def held(self, session_id: str) -> LegacySession | None:
        """The session as this process holds it, for a store that keeps its sessions here (no
        description to fill in, nothing to slide); None: `load` it."""

    async def load(self, session: LegacySession) -> LegacySession | None:
        """The session with its changing state, its idle time slid; None: it ended or expired."""

    async def save(self, session: LegacySession, changed: Collection[str] = ()) -> None:
        """Record a change to the fields named in `changed` (none named: every field); raises
        StoreUnavailable when it cannot (the change must not apply). Only what changed is written:
        another replica may be changing another field of the same session at the same time."""

    async def remove(self, session_id: str) -> bool:
        """End the session for every replica; False if it was not held."""

    async def touch(self, session_id: str, now: float) -> None:
        """The session is in use here (an open stream): it is not idle."""

    def count(self) -> int:
        """Sessions held: all of them here, or for a shared store those this replica served lately."""

    # An input round a legacy client is in the middle of, kept so another replica can take it over
    # when this one dies (docs/design.md §Replicas). Only a shared store keeps them.

    async def put_round(self, session_id: str, request_key: str, record: bytes, ttl_s: float) -> None:
        """Keep (or replace) the record of the open input round of one request."""

    async def drop_round(self, session_id: str, request_key: str) -> None:
        """The round ended here: nobody is to take it over."""

    async def claim_round(
        self, session_id: str, request_key: str, claimant: str, server_ids: Callable[[bytes], list[str]], ttl_s: float
    ) -> tuple[bytes, dict[str, bytes]] | None:
        """Take the round over, once: its record, and the answers already left for its requests
        (`server_ids(record)` names them); answers arriving later are for `claimant`."""

    async def offer_answer(self, session_id: str, server_id: str, answer: bytes, ttl_s: float) -> str | None:
        """An answer nobody here awaited: the replica that took its round over, or None (it is
        kept for the replica that will)."""

    async def idle_since(self, cutoff: float) -> list[str]:
        """Sessions not used since `cutoff` (a shared store: none, its TTL ends them)."""

    async def created_before(self, cutoff: float) -> list[str]:
        """Sessions begun before `cutoff` (a shared store: none, ids carry their age)."""


class InMemorySessionStore:
    """The default store: a dict in this process (one replica)."""

    shared = False

    def __init__(self) -> None:
        self._sessions: dict[str, LegacySession] = {}

    async def add(self, session: LegacySession) -> None:
        self._sessions[session.id] = session

    def held(self, session_id: str) -> LegacySession | None:
        return self._sessions.get(session_id)

    async def load(self, session: LegacySession) -> LegacySession | None:
        return self._sessions.get(session.id)

    async def save(self, session: LegacySession, changed: Collection[str] = ()) -> None:
        if session.id in self._sessions:  # a session ended meanwhile is not brought back
            self._sessions[session.id] = session

    async def remove(self, session_id: str) -> bool:
        return self._sessions.pop(session_id, None) is not None

    async def touch(self, session_id: str, now: float) -> None:
        session = self._sessions.get(session_id)
        if session is not None:
            session.last_seen = now

    def count(self) -> int:
        return len(self._sessions)

    async def put_round(self, session_id: str, request_key: str, record: bytes, ttl_s: float) -> None:
        return None  # one replica: a round dies with it

    async def drop_round(self, session_id: str, request_key: str) -> None:
        return None

    async def claim_round(
        self, session_id: str, request_key: str, claimant: str, server_ids: Callable[[bytes], list[str]], ttl_s: float
    ) -> tuple[bytes, dict[str, bytes]] | None:
        return None

    async def offer_answer(self, session_id: str, server_id: str, answer: bytes, ttl_s: float) -> str | None:
        return None

    async def idle_since(self, cutoff: float) -> list[str]:
        return [sid for sid, s in self._sessions.items() if s.last_seen < cutoff]

    async def created_before(self, cutoff: float) -> list[str]:
        return [sid for sid, s in self._sessions.items() if s.created_at < cutoff]
