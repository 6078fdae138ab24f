"""Replacing `security.secret` without ending sessions: replicas on one store, some still on the
old secret, some on the new one with the old in `security.previous_secrets`."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from proxy.app import create_app
from proxy.config import load_settings
from proxy.state.sessions import InMemorySessionStore
from tests.integration.conftest import UPSTREAM_NAME, serve
from tests.support.fake_modern import FakeModern
from tests.support.legacy_client import LegacyClient

OLD, NEW = "old-secret-0123456789", "new-secret-0123456789"


async def test_a_session_minted_under_the_old_secret_lives_on_under_the_new_one(
    aiohttp_server: Any, aiohttp_client: Any, fake: FakeModern
) -> None:
    store = InMemorySessionStore()  # what replicas share (a shared store in production)

    async def replica(**security: Any) -> TestClient:
        settings = load_settings(
            None,
            **{
                "upstream.url": fake.url,
                "upstream.name": UPSTREAM_NAME,
                "upstream.era": "modern",
                "cache.watch": False,
                **{f"security.{key}": value for key, value in security.items()},
            },
        )
        app, _ = create_app(settings, store=store)
        return await aiohttp_client(await serve(aiohttp_server, app))

    before = await replica(secret=OLD)
    peer = await LegacyClient.connect(before)
    assert (await peer.request("tools/list")).result is not None

    peer.client = await replica(secret=NEW, previous_secrets=[OLD])  # rolled out: the old id still checks
    assert (await peer.request("tools/list")).result is not None

    peer.client = await replica(secret=NEW)  # the old secret dropped: its ids end as unknown (404)
    _, response = await peer.send("tools/list")
    assert response.status == 404
