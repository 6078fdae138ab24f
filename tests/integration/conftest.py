"""Fixtures: the real proxy app, in-process, in front of a scripted fake modern upstream."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import LEGACY_TO_MODERN, create_app
from proxy.config import ENV_PREFIX, Settings, load_settings
from proxy.relay.legacy_sessions import LegacySessionHost
from tests.support.fake_modern import PATH, FakeModern
from tests.support.legacy_client import LegacyClient
from tests.support.redis_server import RedisServer

UPSTREAM_NAME = "fake-modern-upstream"


class FakeClock:
    """A wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Proxy:
    app: web.Application
    client: TestClient
    settings: Settings

    @property
    def relay(self) -> LegacySessionHost[Any]:
        """The host of the legacy sessions it translates."""
        return self.app[LEGACY_TO_MODERN]

    async def connect(self, version: str | None = None, **kwargs: Any) -> LegacyClient:
        if version is not None:
            kwargs["version"] = version
        return await LegacyClient.connect(self.client, **kwargs)


async def serve(aiohttp_server: Any, app: web.Application) -> TestServer:
    """Serve `app` on 127.0.0.1 with handler cancellation on (a disconnect cancels the handler).

    aiohttp's TestServer.start_server always passes handler_cancellation=True to its runner
    (passing it again would be a duplicate keyword), so only check that it is in effect.
    """
    server = await aiohttp_server(app)
    assert server.runner is not None and server.runner._kwargs.get("handler_cancellation") is True
    return server


def closed_port_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}{PATH}"


@pytest.fixture(autouse=True)
def _hermetic_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Settings read the environment: keep the developer's MCP_ERA_PROXY_* out of the tests."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    yield


@pytest.fixture
async def fake_server(aiohttp_server: Any) -> tuple[FakeModern, TestServer]:
    fake = FakeModern()
    server = await serve(aiohttp_server, fake.app)
    fake.url = str(server.make_url(PATH))
    return fake, server


@pytest.fixture
async def fake(fake_server: tuple[FakeModern, TestServer]) -> AsyncIterator[FakeModern]:
    fake = fake_server[0]
    yield fake
    problems = fake.schema_problems()
    assert not problems, f"the proxy sent invalid 2026-07-28 requests upstream: {problems}"


MakeProxy = Callable[..., Awaitable[Proxy]]


@pytest.fixture
def make_proxy(aiohttp_server: Any, aiohttp_client: Any, fake: FakeModern) -> MakeProxy:
    """Build and serve a proxy: `await make_proxy(**{"sessions.max_sessions": 2}, clock=...)`."""

    async def build(*, clock: Any = None, upstream_url: str | None = None, **overrides: Any) -> Proxy:
        settings = load_settings(
            None,
            # The era is fixed: these tests are about the legacy-client relay (detection has its own).
            **{
                "upstream.url": upstream_url or fake.url,
                "upstream.name": UPSTREAM_NAME,
                "upstream.era": "modern",
                # So is the cache's own upstream subscription (tests/integration/test_cache_http.py covers it).
                "cache.watch": False,
                **overrides,
            },
        )
        app, admin = create_app(settings, **({"clock": clock} if clock is not None else {}))
        assert admin is None
        server = await serve(aiohttp_server, app)
        client = await aiohttp_client(server)
        return Proxy(app, client, settings)

    return build


@pytest.fixture
async def proxy(make_proxy: MakeProxy) -> Proxy:
    return await make_proxy()


@pytest.fixture
async def peer(proxy: Proxy) -> LegacyClient:
    """An initialized 2025-11-25 session declaring roots, sampling and form elicitation."""
    return await proxy.connect()


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server of the test's own (on loopback, persisting nothing), stopped after it."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
