"""The shared session store on Redis: what changes in legacy sessions, seen by every replica.

A session's immutable core travels sealed in its id (sessions.SessionIds); Redis holds only what
changes (log level, initialized, a renegotiated modern version, subscriptions) in one hash per
session with a sliding TTL (the idle timeout), so one round trip serves a legacy request on any
replica. Keys hold a hash of the session id, never the id or the caller; subscription URIs
(client data) are sealed. docs/design.md §Replicas gives the schema and what each failure does:

- every call has a short deadline (`store.timeout_ms`) and a breaker: after `breaker_failures`
  straight failures calls fail at once for `breaker_open_s`. Redis slow or down never stalls a
  request: sessions are served from their id (and the last state seen here); changes fail with a
  clear error (StoreUnavailable) rather than apply on one replica only;
- a session whose record is missing is brought back with the defaults when Redis lost it (an
  `epoch` key newer than the session says Redis restarted empty since it began) or never held it
  (minted while Redis was down), so a Redis restart does not 404 live sessions. Otherwise a missing
  record means the session idled out, and a tombstone means it was deleted: 404.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any, TypeVar, cast

import orjson
import structlog

from ..config import StoreConfig
from ..metrics import Metrics
from ..protocol.jsonrpc import b64url
from .sealing import Sealer
from .sessions import LegacySession, StoreUnavailable, decode_core, encode_core, short_hash

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = structlog.get_logger(__name__)
T = TypeVar("T")
_L1_MAX = 65_536  # sessions whose last state this replica remembers (for when Redis is down)


class Breaker:
    """Fails fast while the store keeps failing: open after `failures` straight failures, for `open_s`;
    then one call at a time tries again (half-open) until one succeeds."""

    def __init__(self, failures: int, open_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._threshold = failures
        self._open_s = open_s
        self._clock = clock
        self._failures = 0
        self._open_until = 0.0
        self._trying = False

    @property
    def closed(self) -> bool:
        return self._failures < self._threshold

    def allow(self) -> bool:
        if self.closed:
            return True
        if self._clock() < self._open_until or self._trying:
            return False
        self._trying = True  # half-open: this call probes the store
        return True

    def succeeded(self) -> None:
        self._failures = 0
        self._trying = False

    def failed(self) -> None:
        self._failures += 1
        self._trying = False
        if self._failures >= self._threshold:
            self._open_until = self._clock() + self._open_s


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
        self._timeout_s = config.timeout_ms / 1000
        self._breaker = Breaker(config.breaker_failures, config.breaker_open_s)
        self._sealer = sealer
        self._idle_ms = int(idle_timeout_s * 1000)
        self._idle_s = idle_timeout_s
        self._read_cache_s = config.read_cache_ms / 1000
        self._lifetime_ms = int(max_lifetime_s * 1000)
        self._metrics = metrics
        self._clock = clock
        # session id -> (its changing state as last seen here, when): served from when Redis is not.
        self._l1: OrderedDict[str, tuple[dict[str, Any], float]] = OrderedDict()
        # One round trip and one command per legacy request (a pipeline of three costs about twice
        # the CPU in redis-py); the script object reloads itself after a Redis restart (NOSCRIPT).
        self._load = client.register_script(_LOAD)
        self._save = client.register_script(_SAVE)
        self._claim = client.register_script(_CLAIM)
        self._offer = client.register_script(_OFFER)
        metrics.store_up.set(1)

    # ------------------------------------------------------------ the store interface

    async def add(self, session: LegacySession) -> None:
        key = self._record(session.id)
        fields = self._fields(session, key)
        if session.core_in_store:
            fields["core"] = self._seal_core(session, key)
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self._prefix + "epoch", self._now_ms(), nx=True)
        pipe.hset(key, mapping=fields)
        pipe.pexpire(key, self._idle_ms)
        await self._call("add", pipe.execute())
        self._remember(session)

    async def load(self, session: LegacySession) -> LegacySession | None:
        if self._read_cache_s and self._recent(session):
            return session
        key = self._record(session.id)
        try:
            found = await self._call("load", self._load(keys=[key, self._tombstone(session.id)], args=[self._idle_ms]))
        except StoreUnavailable:
            return self._degraded(session)
        fields = dict(zip(found[::2], found[1::2], strict=True)) if isinstance(found, list) else None
        deleted = found == 1
        if fields:
            if not self._apply(session, fields, key):
                return None  # a record we cannot read is no session of ours
        elif deleted:
            return None
        elif not await self._lost_by_store(session):
            return None  # idled out
        else:
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
        await self._call("save", self._save(keys=[key, self._tombstone(session.id)], args=[self._idle_ms, *fields]))
        self._remember(session)

    async def remove(self, session_id: str) -> bool:
        self._l1.pop(session_id, None)
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(self._record(session_id))
        # Only the same caller could present the id again; the tombstone outlives any id's lifetime.
        pipe.set(self._tombstone(session_id), b"1", px=self._lifetime_ms)
        deleted, _ = await self._call("remove", pipe.execute())
        return bool(deleted)

    async def touch(self, session_id: str, now: float) -> None:
        await self._call("touch", self.client.pexpire(self._record(session_id), self._idle_ms))
        entry = self._l1.get(session_id)
        if entry is not None:
            self._l1[session_id] = (entry[0], now)

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
        await self._call("round", self.client.set(key, sealed, px=max(int(ttl_s * 1000), 1)))

    async def drop_round(self, session_id: str, request_key: str) -> None:
        await self._call("round", self.client.delete(self._round(session_id, request_key)))

    async def claim_round(
        self, session_id: str, request_key: str, claimant: str, server_ids: Callable[[bytes], list[str]], ttl_s: float
    ) -> tuple[bytes, dict[str, bytes]] | None:
        key = self._round(session_id, request_key)
        sealed = await self._call("round", self.client.getdel(key))  # one claimant, whoever is first
        record = self._sealer.open("sto", _text(sealed), key.encode()) if sealed else None
        if record is None:
            return None
        ids = server_ids(record)
        ttl_ms = max(int(ttl_s * 1000), 1)
        keys = [
            k for server_id in ids for k in (self._claimant(session_id, server_id), self._answer(session_id, server_id))
        ]
        owner = self._sealer.seal("sto", claimant.encode(), b"claimant")
        found = await self._call("round", self._claim(keys=keys, args=[owner, ttl_ms])) if ids else []
        answers: dict[str, bytes] = {}
        for server_id, stored in zip(ids, found, strict=True):
            if stored:
                opened = self._sealer.open("sto", _text(stored), self._answer(session_id, server_id).encode())
                if opened is not None:
                    answers[server_id] = opened
        return record, answers

    async def offer_answer(self, session_id: str, server_id: str, answer: bytes, ttl_s: float) -> str | None:
        target = self._answer(session_id, server_id)
        sealed = self._sealer.seal("sto", answer, target.encode())
        claimant = await self._call(
            "round",
            self._offer(keys=[self._claimant(session_id, server_id), target], args=[sealed, max(int(ttl_s * 1000), 1)]),
        )
        if not claimant:
            return None
        opened = self._sealer.open("sto", _text(claimant), b"claimant")
        return opened.decode() if opened is not None else None

    def _round(self, session_id: str, request_key: str) -> str:
        return f"{self._prefix}{{{self._hash(session_id)}}}:c:{request_key}"

    def _claimant(self, session_id: str, server_id: str) -> str:
        return f"{self._prefix}{{{self._hash(session_id)}}}:k:{self._hash(server_id)}"

    def _answer(self, session_id: str, server_id: str) -> str:
        return f"{self._prefix}{{{self._hash(session_id)}}}:r:{self._hash(server_id)}"

    # ------------------------------------------------------------ health

    @property
    def up(self) -> bool:
        return self._breaker.closed

    async def ping(self) -> bool:
        try:
            await self._call("ping", self.client.ping())
        except StoreUnavailable:
            return False
        return True

    async def aclose(self) -> None:
        await self.client.aclose()

    # ------------------------------------------------------------ internals

    async def _call(self, op: str, pending: Awaitable[T]) -> T:
        if not self._breaker.allow():
            if asyncio.iscoroutine(pending):
                pending.close()
            self._metrics.store_errors.labels(op, "rejected").inc()
            raise StoreUnavailable(_OPERATIONS.get(op, op))
        try:
            async with asyncio.timeout(self._timeout_s):
                result = await pending
        except Exception as exc:  # redis errors, OSError, TimeoutError: all mean "not now"
            self._breaker.failed()
            self._metrics.store_up.set(1 if self._breaker.closed else 0)
            kind = "timeout" if isinstance(exc, TimeoutError) else "error"
            self._metrics.store_errors.labels(op, kind).inc()
            log.warning("store_call_failed", op=op, kind=kind, error=str(exc) or type(exc).__name__)
            raise StoreUnavailable(_OPERATIONS.get(op, op)) from None
        self._breaker.succeeded()
        self._metrics.store_up.set(1)
        return result

    def _recent(self, session: LegacySession) -> bool:
        """Serve the state this replica read less than `store.read_cache_ms` ago, if the session is
        initialized (a session that is not yet may be told so through another replica any moment)."""
        entry = self._l1.get(session.id)
        if entry is None or self._clock() - entry[1] >= self._read_cache_s or not entry[0]["init"]:
            return False
        self._restore(session, entry[0])
        return True

    def _restore(self, session: LegacySession, state: dict[str, Any]) -> None:
        if session.core_in_store:
            session.take_core(state["core"])
        session.log_level = state["lvl"]
        session.initialized = state["init"]
        session.modern_version = state["mv"]
        session.subscriptions = state["subs"]
        session.stream_owner = state["own"]

    def _degraded(self, session: LegacySession) -> LegacySession:
        """Redis is down: the session as last seen here, else as its id describes it."""
        entry = self._l1.get(session.id)
        if session.core_in_store and (entry is None or "core" not in entry[0]):
            raise StoreUnavailable("serving this session")
        if entry is not None:
            self._restore(session, entry[0])
        return session

    async def _lost_by_store(self, session: LegacySession) -> bool:
        """Whether the missing record was lost by the store rather than ended by its TTL."""
        if not session.recorded:
            return True
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self._prefix + "epoch", self._now_ms(), nx=True)
        pipe.get(self._prefix + "epoch")
        _, epoch = await self._call("load", pipe.execute())
        try:
            return int(epoch) > session.created_at * 1000
        except (TypeError, ValueError):
            return False

    async def _resurrect(self, session: LegacySession, key: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(key, mapping=self._fields(session, key))
        pipe.pexpire(key, self._idle_ms)
        try:
            await self._call("add", pipe.execute())
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
        state: dict[str, Any] = {
            "lvl": session.log_level,
            "init": session.initialized,
            "mv": session.modern_version,
            "subs": session.subscriptions,
            "own": session.stream_owner,
        }
        if session.core_in_store:
            state["core"] = session.core
        self._l1[session.id] = (state, self._clock())
        self._l1.move_to_end(session.id)
        if len(self._l1) > _L1_MAX:
            self._l1.popitem(last=False)

    @staticmethod
    def _hash(session_id: str) -> str:
        # Not keyed by the secret, so a rotation keeps every record: the id is itself a random
        # sealed token, and its hash reveals nothing of it.
        return b64url(hashlib.sha256(b"mcp-era-proxy/store/" + session_id.encode()).digest())[:22]

    def _record(self, session_id: str) -> str:
        # The braces make the hash a Redis Cluster hash tag: a session's keys share a slot.
        return f"{self._prefix}{{{self._hash(session_id)}}}:s"

    def _tombstone(self, session_id: str) -> str:
        return f"{self._prefix}{{{self._hash(session_id)}}}:x"

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


# The record and its idle time slid, or whether a tombstone stands where there is none.
_LOAD = """
local found = redis.call('HGETALL', KEYS[1])
if #found > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  return found
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

_OPERATIONS = {
    "task": "keeping the task",
    "round": "taking an input round over",
    "save": "this change to the session",
    "add": "recording the session",
    "remove": "ending the session everywhere",
    "touch": "keeping the session alive",
    "load": "reading the session",
    "ping": "a health check",
}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


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
    try:
        from redis import __version__ as redis_version
        from redis.asyncio import Redis
        from redis.asyncio.retry import Retry  # the asyncio one: redis-py 8.2 warns at the sync one
        from redis.backoff import NoBackoff
        from redis.driver_info import DriverInfo
    except ImportError:  # pragma: no cover - depends on the installation
        raise RuntimeError("store.url needs redis-py: pip install 'mcp-era-proxy[redis]'") from None
    assert config.url is not None
    timeout = max(config.timeout_ms / 1000, 0.05)
    client = Redis.from_url(
        config.url,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        # No retries inside redis-py (its default backs off for seconds): the deadline and the
        # breaker here decide, and a failed call is simply made again by the next request.
        retry=Retry(NoBackoff(), 0),
        health_check_interval=30,
        # Given, or redis-py looks its own version up in the installed metadata (file system
        # reads) for every new connection, on the event loop.
        driver_info=DriverInfo(name="redis-py", lib_version=redis_version),
    )
    return RedisSessionStore(
        client,
        config,
        sealer,
        idle_timeout_s=idle_timeout_s,
        max_lifetime_s=max_lifetime_s,
        metrics=metrics,
        clock=clock,
    )


class RedisTaskStore:
    """The tasks the proxy hosts (task_records.TaskStore), on the sessions' Redis: one key per task
    with the task's retention as its TTL, and one sorted set per caller of its task ids by creation
    time, for tasks/list and the per-caller bound. Keys hold hashes of the caller and the id; the
    records (results: client data) are sealed, bound to their key. Shares the session store's
    client, deadline and breaker, so Redis down fails a task request with StoreUnavailable."""

    shared = True

    def __init__(self, sessions: RedisSessionStore) -> None:
        self._sessions = sessions
        self._client = sessions.client
        self._prefix = sessions._prefix
        self._sealer = sessions._sealer

    async def put(self, principal: str, task_id: str, record: bytes, created_at: float, ttl_s: float) -> None:
        key = self._key(principal, task_id)
        index = self._index(principal)
        ttl_ms = max(int(ttl_s * 1000), 1)
        sealed = self._sealer.seal("sto", record, key.encode())
        pipe = self._client.pipeline(transaction=False)
        pipe.set(key, sealed, px=ttl_ms)
        pipe.zadd(index, {task_id: created_at})
        # The index lives as long as its longest-lived task: set when it has no TTL, else extended.
        pipe.pexpire(index, ttl_ms, nx=True)
        pipe.pexpire(index, ttl_ms, gt=True)
        await self._sessions._call("task", pipe.execute())

    async def get(self, principal: str, task_id: str) -> bytes | None:
        key = self._key(principal, task_id)
        sealed = await self._sessions._call("task", self._client.get(key))
        return self._sealer.open("sto", _text(sealed), key.encode()) if sealed else None

    async def page(self, principal: str, after: tuple[float, str] | None, limit: int) -> list[bytes]:
        index = self._index(principal)
        low = after[0] if after is not None else "-inf"
        # Ties on the creation time come back in the order of their ids, the order pages follow.
        found_entries = await self._sessions._call(
            "task", self._client.zrange(index, low, "+inf", byscore=True, withscores=True)
        )
        entries = cast("list[tuple[bytes, float]]", found_entries)  # redis-py types replies loosely
        ids = [_text(member) for member, score in entries if after is None or (score, _text(member)) > after]
        found: list[bytes] = []
        for start in range(0, len(ids), limit):
            batch = ids[start : start + limit]
            found.extend(await self._records(principal, batch))
            if len(found) >= limit:
                break
        return found[:limit]

    async def count(self, principal: str) -> int:
        ids = cast(
            "list[bytes]", await self._sessions._call("task", self._client.zrange(self._index(principal), 0, -1))
        )
        return len(await self._records(principal, [_text(member) for member in ids]))

    async def remove(self, principal: str, task_id: str) -> None:
        pipe = self._client.pipeline(transaction=False)
        pipe.delete(self._key(principal, task_id))
        pipe.zrem(self._index(principal), task_id)
        await self._sessions._call("task", pipe.execute())

    async def _records(self, principal: str, ids: list[str]) -> list[bytes]:
        """The live records of `ids`, in order; the ids whose record expired leave the index."""
        if not ids:
            return []
        keys = [self._key(principal, task_id) for task_id in ids]
        values = await self._sessions._call("task", self._client.mget(keys))
        records: list[bytes] = []
        gone: list[str] = []
        for task_id, key, sealed in zip(ids, keys, values, strict=True):
            opened = self._sealer.open("sto", _text(sealed), key.encode()) if sealed else None
            if opened is None:
                gone.append(task_id)
            else:
                records.append(opened)
        if gone:
            await self._sessions._call("task", self._client.zrem(self._index(principal), *gone))
        return records

    def _index(self, principal: str) -> str:
        return f"{self._prefix}{{t{RedisSessionStore._hash(principal)}}}:tasks"

    def _key(self, principal: str, task_id: str) -> str:
        return f"{self._prefix}{{t{RedisSessionStore._hash(principal)}}}:task:{RedisSessionStore._hash(task_id)}"
