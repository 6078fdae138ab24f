"""The shared session store on Redis: what changes in legacy sessions, seen by every replica.

A session's immutable core travels sealed in its id (sessions.SessionIds); Redis holds only what
changes (log level, initialized, a renegotiated modern version, subscriptions) in one hash per
session with a sliding TTL (the idle timeout), so one round trip serves a legacy request on any
replica. Keys hold a hash of the session id, never the id or the caller; subscription URIs
(client data) are sealed. docs/design.md §Replicas gives the schema and what each failure does:

- every call has a short deadline (`store.timeout_ms`) and a breaker (redis_connection.py): after
  `breaker_failures` straight failures calls fail at once for `breaker_open_s`. Redis slow or down
  never stalls a request: sessions are served from their id (and the last state seen here); changes
  fail with a clear error (StoreUnavailable) rather than apply on one replica only;
- a session whose record is missing is brought back with the defaults when Redis lost it (an
  `epoch` key newer than the session says Redis restarted empty since it began) or never held it
  (minted while Redis was down), so a Redis restart does not 404 live sessions. Otherwise a missing
  record means the session idled out, and a tombstone means it was deleted: 404.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

import orjson
import structlog

from ..config import StoreConfig
from ..metrics import Metrics
from .redis_connection import RedisCalls, connect, key_hash, text
from .redis_tracking import Tracking
from .sealing import Sealer
from .sessions import LegacySession, StoreUnavailable, decode_core, encode_core, short_hash

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = structlog.get_logger(__name__)
_L1_MAX = 65_536  # sessions whose last state this replica remembers (for when Redis is down)
# The record's TTL is the idle timeout plus this share of it, and is slid only when less than the
# idle timeout is left: once per this share of it per session, not on every request. A session so
# ends between idle_timeout_s and (1 + _SLACK) * idle_timeout_s after its last use, never earlier.
_SLACK = 0.1

# What this replica last saw of a session (its _l1 entry): a list, so serving a copy updates it in
# place: [its changing state (_State), when, its core when the store holds it (else None)].
_Entry = list[Any]
# A session's changing state, in the order of its fields: log_level, initialized, modern_version,
# subscriptions, stream_owner (a tuple: restored with one unpacking, not a lookup per field).
_State = tuple[str | None, bool, str, frozenset[str], str]


class RedisSessionStore:
    shared = True

    def __init__(
        self,
        client: Redis,
        config: StoreConfig,
        sealer: Sealer,
        *,
        idle_timeout_s: float,
        max_lifetime_s: float,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self._prefix = config.namespace + ":"
        # every call: its deadline, the breaker, the metrics (shared with the task store)
        self.calls = RedisCalls(config, metrics)
        self._sealer = sealer
        self._idle_ms = int(idle_timeout_s * 1000)
        self._ttl_ms = int(idle_timeout_s * (1 + _SLACK) * 1000)
        self._idle_s = idle_timeout_s
        self._read_cache_s = config.read_cache_ms / 1000
        self._lifetime_ms = int(max_lifetime_s * 1000)
        self._metrics = metrics
        self._clock = clock
        # session id -> its changing state as last seen here, and when (_Entry): served from when
        # Redis is not.
        self._l1: OrderedDict[str, _Entry] = OrderedDict()
        # Local copies kept fresh by invalidations (redis_tracking.py): record key -> when the
        # record expires in Redis, as this replica knows it (never later than it does). The state
        # is the session's _l1 entry. Only trusted while the tracking connection is healthy.
        self._tracking: Tracking | None = None
        self._copies: dict[str, float] = {}
        # session id -> its hashed part of a key (a hash and a base64 per request otherwise), bounded.
        self._hashed: dict[str, str] = {}
        self._records: dict[str, str] = {}  # session id -> its record's key (built per request otherwise), bounded
        self._reading: dict[str, int] = {}  # record keys being read now: how many reads
        self._overtaken: set[str] = set()  # of those, the ones changed meanwhile: not to be kept
        self.copies_served = 0
        # One round trip and one command per legacy request (a pipeline of three costs about twice
        # the CPU in redis-py); the script object reloads itself after a Redis restart (NOSCRIPT).
        self._load = client.register_script(_LOAD)
        self._save = client.register_script(_SAVE)
        self._claim = client.register_script(_CLAIM)
        self._offer = client.register_script(_OFFER)
        metrics.store_up.set(1)
        # Cells resolved once: every legacy request counts in one.
        reads = metrics.store_session_reads
        self._read_copy, self._read_recent, self._read_store = (reads.labels(s) for s in ("copy", "recent", "store"))

    # ------------------------------------------------------------ the store interface

    async def add(self, session: LegacySession) -> None:
        key = self._record(session.id)
        fields = self._fields(session, key)
        if session.core_in_store:
            fields["core"] = self._seal_core(session, key)
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self._prefix + "epoch", self._now_ms(), nx=True)
        pipe.hset(key, mapping=fields)
        pipe.pexpire(key, self._ttl_ms)
        await self.calls("add", pipe.execute())
        self._remember(session)

    def held(self, session_id: str) -> LegacySession | None:
        return None  # every replica reads the record (or its tracked copy) into a description

    async def load(self, session: LegacySession) -> LegacySession | None:
        session_id = session.id
        key = self._record(session_id)
        tracking = self._tracking
        watched = tracking is not None and tracking.healthy()
        if watched:
            # Served from its copy (nearly every request): held, not invalidated, and its record
            # lives at least the idle timeout longer (else the read slides it).
            until = self._copies.get(key)
            if until is not None:
                entry = self._l1.get(session_id)
                now = self._clock()
                if entry is not None and until - now >= self._idle_s:
                    self._restore(session, entry)
                    session.last_seen = entry[1] = now
                    self._l1.move_to_end(session_id)
                    self.copies_served += 1
                    self._read_copy.value += 1  # a TallyCell: counted in place, every copy served
                    return session
        if self._read_cache_s and self._recent(session):
            self._read_recent.inc()
            return session
        self._read_store.inc()
        started, epoch = self._clock(), tracking.epoch if tracking is not None else 0
        if watched:
            self._reading[key] = self._reading.get(key, 0) + 1
        try:
            found = await self.calls(
                "load", self._load(keys=[key, self._tombstone(session.id)], args=[self._idle_ms, self._ttl_ms])
            )
        except StoreUnavailable:
            return self._degraded(session)
        finally:
            overtaken = watched and self._done_reading(key)
        if isinstance(found, list):
            left_ms, flat = found
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            if not self._apply(session, fields, key):
                return None  # a record we cannot read is no session of ours
            self._remember(session)
            if watched and not overtaken and tracking is not None and tracking.epoch == epoch and tracking.healthy():
                self._keep_copy(key, started + int(left_ms) / 1000)
            return session
        if found == 1:
            return None  # deleted
        if not await self._lost_by_store(session):
            return None  # idled out
        if session.core_in_store:
            return None  # its core was only in the store, and the store lost it
        await self._resurrect(session, key)
        self._remember(session)
        return session

    async def save(self, session: LegacySession, changed: Collection[str] = ()) -> None:
        # Never over a tombstone: a change racing a DELETE on another replica (say, a GET stream
        # opened just before it) must not bring the session back.
        key = self._record(session.id)
        every = self._fields(session, key)
        wanted = {_FIELDS[name] for name in changed} if changed else set(every)
        fields = [item for name, value in every.items() if name in wanted for item in (name, value)]
        # The copy goes: the next request reads the record (another replica may have changed
        # another field meanwhile; its invalidation could reach here before this answer does).
        self._copies.pop(key, None)
        await self.calls("save", self._save(keys=[key, self._tombstone(session.id)], args=[self._ttl_ms, *fields]))
        self._copies.pop(key, None)
        self._remember(session)

    async def remove(self, session_id: str) -> bool:
        self._l1.pop(session_id, None)
        self._copies.pop(self._record(session_id), None)
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(self._record(session_id))
        # Only the same caller could present the id again; the tombstone outlives any id's lifetime.
        pipe.set(self._tombstone(session_id), b"1", px=self._lifetime_ms)
        deleted, _ = await self.calls("remove", pipe.execute())
        return bool(deleted)

    async def touch(self, session_id: str, now: float) -> None:
        key = self._record(session_id)
        until = self._copies.get(key)
        if until is None or until - self._clock() < self._idle_s:  # else it lives long enough as it is
            await self.calls("touch", self.client.pexpire(key, self._ttl_ms))
        entry = self._l1.get(session_id)
        if entry is not None:
            entry[1] = now

    def count(self) -> int:
        cutoff = self._clock() - self._idle_s
        while self._l1:
            oldest = next(iter(self._l1.values()))
            if oldest[1] >= cutoff:
                break
            self._l1.popitem(last=False)
        return len(self._l1)

    async def idle_since(self, cutoff: float) -> list[str]:
        return []  # the record's TTL ends idle sessions

    async def created_before(self, cutoff: float) -> list[str]:
        return []  # the id carries its issue time; SessionIds refuses it past the lifetime

    # ------------------------------------------------------------ input rounds (taken over)

    async def put_round(self, session_id: str, request_key: str, record: bytes, ttl_s: float) -> None:
        key = self._round(session_id, request_key)
        sealed = self._sealer.seal("sto", record, key.encode())
        await self.calls("round", self.client.set(key, sealed, px=max(int(ttl_s * 1000), 1)))

    async def drop_round(self, session_id: str, request_key: str) -> None:
        await self.calls("round", self.client.delete(self._round(session_id, request_key)))

    async def claim_round(
        self, session_id: str, request_key: str, claimant: str, server_ids: Callable[[bytes], list[str]], ttl_s: float
    ) -> tuple[bytes, dict[str, bytes]] | None:
        key = self._round(session_id, request_key)
        sealed = await self.calls("round", self.client.getdel(key))  # one claimant, whoever is first
        record = self._sealer.open("sto", text(sealed), key.encode()) if sealed else None
        if record is None:
            return None
        ids = server_ids(record)
        ttl_ms = max(int(ttl_s * 1000), 1)
        keys = [
            k for server_id in ids for k in (self._claimant(session_id, server_id), self._answer(session_id, server_id))
        ]
        owner = self._sealer.seal("sto", claimant.encode(), b"claimant")
        found = await self.calls("round", self._claim(keys=keys, args=[owner, ttl_ms])) if ids else []
        answers: dict[str, bytes] = {}
        for server_id, stored in zip(ids, found, strict=True):
            if stored:
                opened = self._sealer.open("sto", text(stored), self._answer(session_id, server_id).encode())
                if opened is not None:
                    answers[server_id] = opened
        return record, answers

    async def offer_answer(self, session_id: str, server_id: str, answer: bytes, ttl_s: float) -> str | None:
        target = self._answer(session_id, server_id)
        sealed = self._sealer.seal("sto", answer, target.encode())
        claimant = await self.calls(
            "round",
            self._offer(keys=[self._claimant(session_id, server_id), target], args=[sealed, max(int(ttl_s * 1000), 1)]),
        )
        if not claimant:
            return None
        opened = self._sealer.open("sto", text(claimant), b"claimant")
        return opened.decode() if opened is not None else None

    def _round(self, session_id: str, request_key: str) -> str:
        return f"{self._prefix}{{{self._hash(session_id)}}}:c:{request_key}"

    def _claimant(self, session_id: str, server_id: str) -> str:
        return f"{self._prefix}{{{self._hash(session_id)}}}:k:{key_hash(server_id)}"

    def _answer(self, session_id: str, server_id: str) -> str:
        return f"{self._prefix}{{{self._hash(session_id)}}}:r:{key_hash(server_id)}"

    # ------------------------------------------------------------ health

    @property
    def up(self) -> bool:
        return self.calls.up

    async def ping(self) -> bool:
        try:
            await self.calls("ping", self.client.ping())
        except StoreUnavailable:
            return False
        return True

    async def aclose(self) -> None:
        if self._tracking is not None:
            await self._tracking.aclose()
        await self.client.aclose()

    # ------------------------------------------------------------ local copies

    def track(self, tracking: Tracking) -> None:
        """Serve sessions from local copies while `tracking` says which records changed."""
        self._tracking = tracking

    def invalidated(self, keys: Collection[bytes] | None) -> None:
        """Redis says these keys changed (None: all of them)."""
        if keys is None:
            self.reset()
            return
        for raw in keys:
            name = raw.decode(errors="replace")
            if name.endswith(":x"):  # a tombstone: the record's session was deleted
                name = name[:-2] + ":s"
            elif not name.endswith(":s"):
                continue  # an input round's keys
            self._copies.pop(name, None)
            if name in self._reading:
                self._overtaken.add(name)

    def reset(self) -> None:
        """Changes may have been missed: no copy is to be trusted, nor any read now under way."""
        self._copies.clear()
        self._overtaken.update(self._reading)

    def _keep_copy(self, key: str, until: float) -> None:
        if len(self._copies) >= _L1_MAX:
            del self._copies[next(iter(self._copies))]
        self._copies[key] = until

    def _done_reading(self, key: str) -> bool:
        """A read of `key` ended: whether the record changed while it was under way."""
        overtaken = key in self._overtaken
        left = self._reading[key] - 1
        if left:
            self._reading[key] = left
        else:
            del self._reading[key]
            self._overtaken.discard(key)
        return overtaken

    # ------------------------------------------------------------ internals

    def _recent(self, session: LegacySession) -> bool:
        """Serve the state this replica read less than `store.read_cache_ms` ago, if the session is
        initialized (a session that is not yet may be told so through another replica any moment)."""
        entry = self._l1.get(session.id)
        if entry is None or self._clock() - entry[1] >= self._read_cache_s or not entry[0][1]:  # initialized
            return False
        self._restore(session, entry)
        return True

    def _restore(self, session: LegacySession, entry: _Entry) -> None:
        """The session's state as `entry` holds it."""
        if session.core_in_store:
            session.take_core(entry[2])
        (
            session.log_level,
            session.initialized,
            session.modern_version,
            session.subscriptions,
            session.stream_owner,
        ) = entry[0]

    def _degraded(self, session: LegacySession) -> LegacySession:
        """Redis is down: the session as last seen here, else as its id describes it."""
        entry = self._l1.get(session.id)
        if session.core_in_store and (entry is None or entry[2] is None):
            raise StoreUnavailable("serving this session")
        if entry is not None:
            self._restore(session, entry)
        return session

    async def _lost_by_store(self, session: LegacySession) -> bool:
        """Whether the missing record was lost by the store rather than ended by its TTL."""
        if not session.recorded:
            return True
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self._prefix + "epoch", self._now_ms(), nx=True)
        pipe.get(self._prefix + "epoch")
        _, epoch = await self.calls("load", pipe.execute())
        try:
            return int(epoch) > session.created_at * 1000
        except (TypeError, ValueError):
            return False

    async def _resurrect(self, session: LegacySession, key: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(key, mapping=self._fields(session, key))
        pipe.pexpire(key, self._ttl_ms)
        try:
            await self.calls("add", pipe.execute())
        except StoreUnavailable:
            pass  # served all the same; the next request tries again
        self._metrics.sessions_resurrected.inc()
        log.info("session_resurrected", session=short_hash(session.id))

    def _fields(self, session: LegacySession, key: str) -> dict[Any, str]:  # redis-py types keys loosely
        # Sealed (URIs are client data); none, the usual, is the empty string and costs nothing.
        subs = (
            self._sealer.seal("sto", orjson.dumps(sorted(session.subscriptions)), key.encode())
            if session.subscriptions
            else ""
        )
        return {
            "lvl": session.log_level or "",
            "init": "1" if session.initialized else "0",
            "mv": session.modern_version,
            "subs": subs,
            # Sealed too: an address other replicas forward to must come from the proxy itself.
            "own": self._sealer.seal("sto", session.stream_owner.encode(), key.encode())
            if session.stream_owner
            else "",
        }

    def _apply(self, session: LegacySession, fields: dict[bytes, bytes], key: str) -> bool:
        try:
            level = fields.get(b"lvl", b"").decode()
            session.log_level = level or None
            session.initialized = fields.get(b"init") == b"1"
            modern = fields.get(b"mv", b"").decode()
            if modern:
                session.modern_version = modern
            sealed = fields.get(b"subs", b"").decode()
            subs = self._sealer.open("sto", sealed, key.encode()) if sealed else b"[]"
            if subs is None:
                return False
            session.subscriptions = frozenset(str(uri) for uri in orjson.loads(subs))
            owner = fields.get(b"own", b"").decode()
            opened = self._sealer.open("sto", owner, key.encode()) if owner else b""
            if opened is None:
                return False
            session.stream_owner = opened.decode()
            if session.core_in_store:
                core = self._sealer.open("sto", fields.get(b"core", b"").decode(), key.encode())
                if core is None:
                    return False
                session.take_core(decode_core(core))
        except (UnicodeDecodeError, orjson.JSONDecodeError, TypeError, ValueError):
            return False
        session.last_seen = self._clock()
        return True

    def _seal_core(self, session: LegacySession, key: str) -> str:
        return self._sealer.seal("sto", encode_core(session.core), key.encode())

    def _remember(self, session: LegacySession) -> None:
        state: _State = (
            session.log_level,
            session.initialized,
            session.modern_version,
            session.subscriptions,
            session.stream_owner,
        )
        self._l1[session.id] = [state, self._clock(), session.core if session.core_in_store else None]
        self._l1.move_to_end(session.id)
        if len(self._l1) > _L1_MAX:
            self._l1.popitem(last=False)

    def _record(self, session_id: str) -> str:
        # The braces make the hash a Redis Cluster hash tag: a session's keys share a slot.
        key = self._records.get(session_id)
        if key is None:
            if len(self._records) >= _L1_MAX:
                self._records.clear()
            key = self._records[session_id] = f"{self._prefix}{{{self._hash(session_id)}}}:s"
        return key

    def _tombstone(self, session_id: str) -> str:
        return f"{self._prefix}{{{self._hash(session_id)}}}:x"

    def _hash(self, session_id: str) -> str:
        hashed = self._hashed.get(session_id)
        if hashed is None:
            if len(self._hashed) >= _L1_MAX:
                self._hashed.clear()
            hashed = self._hashed[session_id] = key_hash(session_id)
        return hashed

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


# The record and the milliseconds it has left, slid to ARGV[2] when less than ARGV[1] (the idle
# timeout) was left; or whether a tombstone stands where there is none. Read without a write
# mostly: a slide is a change, which every replica's copy is told of.
_LOAD = """
local found = redis.call('HGETALL', KEYS[1])
if #found > 0 then
  local left = redis.call('PTTL', KEYS[1])
  if left < tonumber(ARGV[1]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    left = tonumber(ARGV[2])
  end
  return {left, found}
end
return redis.call('EXISTS', KEYS[2])
"""

# Change a record (fields as name, value pairs after the idle time), slid, unless the session was
# deleted (its tombstone stands).
_SAVE = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""

# Claim the answers of a round taken over: for each (claimant key, answer key) pair, name the
# claimant and take the answer left meanwhile, if any, atomically with the offers below.
_CLAIM = """
local found = {}
for i = 1, #KEYS, 2 do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
  found[#found + 1] = redis.call('GET', KEYS[i + 1]) or false
  redis.call('DEL', KEYS[i + 1])
end
return found
"""

# An answer for a round: to its claimant, if there is one, else kept for the one to come.
_OFFER = """
local claimant = redis.call('GET', KEYS[1])
if claimant then return claimant end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return false
"""

# LegacySession's changing fields, by the names of their record fields.
_FIELDS = {
    "log_level": "lvl",
    "initialized": "init",
    "modern_version": "mv",
    "subscriptions": "subs",
    "stream_owner": "own",
}


def redis_store(
    config: StoreConfig,
    sealer: Sealer,
    *,
    idle_timeout_s: float,
    max_lifetime_s: float,
    metrics: Metrics,
    clock: Callable[[], float] = time.time,
) -> RedisSessionStore:
    """The store for `store.url`; needs the `redis` extra."""
    client = connect(config)
    store = RedisSessionStore(
        client,
        config,
        sealer,
        idle_timeout_s=idle_timeout_s,
        max_lifetime_s=max_lifetime_s,
        metrics=metrics,
        clock=clock,
    )
    if config.tracking and config.url is not None:
        store.track(
            Tracking(
                config.url,
                store._prefix + "{",
                on_keys=store.invalidated,
                on_reset=store.reset,
                timeout_s=config.timeout_ms / 1000,
            )
        )
    return store
