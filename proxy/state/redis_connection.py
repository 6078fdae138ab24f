"""The connection to Redis that the shared stores use (redis_store.py, redis_tasks.py): the client,
made for short deadlines, every call with its deadline and a breaker, and the hashing of keys.

Every call has a short deadline (`store.timeout_ms`) and a breaker: after `breaker_failures`
straight failures calls fail at once for `breaker_open_s`, so Redis slow or down never stalls a
request; a failed call raises StoreUnavailable, which names what could not be done.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import structlog

from ..config import StoreConfig
from ..metrics import Metrics
from ..protocol.jsonrpc import b64url
from .sessions import StoreUnavailable

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = structlog.get_logger(__name__)
T = TypeVar("T")


def connect(config: StoreConfig) -> Redis:
    """The client for `store.url`; needs the `redis` extra."""
    try:
        from redis import __version__ as redis_version
        from redis.asyncio import BlockingConnectionPool, Redis
        from redis.asyncio.retry import Retry  # the asyncio one: redis-py 8.2 warns at the sync one
        from redis.backoff import NoBackoff
        from redis.driver_info import DriverInfo
    except ImportError:  # pragma: no cover - depends on the installation
        raise RuntimeError("store.url needs redis-py: pip install 'mcp-era-proxy[redis]'") from None
    assert config.url is not None
    timeout = max(config.timeout_ms / 1000, 0.05)
    # Bounded, and a call past the bound waits for a connection (within its deadline, RedisCalls):
    # redis-py's own pool fails such a call at once ("Too many connections"), and a burst of new
    # sessions then opened the breaker for every request.
    pool = BlockingConnectionPool.from_url(
        config.url,
        max_connections=config.max_connections,
        timeout=timeout,
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
    return Redis.from_pool(pool)  # the client owns the pool: closing it closes the pool


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


class RedisCalls:
    """Every call to Redis: cut at the store's deadline, refused at once while the breaker is open,
    counted in the store metrics."""

    def __init__(self, config: StoreConfig, metrics: Metrics) -> None:
        self._timeout_s = config.timeout_ms / 1000
        self._breaker = Breaker(config.breaker_failures, config.breaker_open_s)
        self._metrics = metrics

    @property
    def up(self) -> bool:
        return self._breaker.closed

    async def __call__(self, op: str, pending: Awaitable[T]) -> T:
        if not self._breaker.allow():
            if asyncio.iscoroutine(pending):
                pending.close()
            self._metrics.store_errors.labels(op, "rejected").inc()
            raise StoreUnavailable(OPERATIONS.get(op, op))
        try:
            async with asyncio.timeout(self._timeout_s):
                result = await pending
        except Exception as exc:  # redis errors, OSError, TimeoutError: all mean "not now"
            self._breaker.failed()
            self._metrics.store_up.set(1 if self._breaker.closed else 0)
            kind = "timeout" if isinstance(exc, TimeoutError) else "error"
            self._metrics.store_errors.labels(op, kind).inc()
            log.warning("store_call_failed", op=op, kind=kind, error=str(exc) or type(exc).__name__)
            raise StoreUnavailable(OPERATIONS.get(op, op)) from None
        self._breaker.succeeded()
        self._metrics.store_up.set(1)
        return result


OPERATIONS = {
    "task": "keeping the task",
    "round": "taking an input round over",
    "save": "this change to the session",
    "add": "recording the session",
    "remove": "ending the session everywhere",
    "touch": "keeping the session alive",
    "load": "reading the session",
    "ping": "a health check",
}


def key_hash(value: str) -> str:
    """What keys hold instead of a session id, a caller or a task id."""
    # Not keyed by the secret, so a rotation keeps every record: the id is itself a random
    # sealed token, and its hash reveals nothing of it.
    return b64url(hashlib.sha256(b"mcp-era-proxy/store/" + value.encode()).digest())[:22]


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
