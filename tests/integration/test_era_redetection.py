"""An upstream upgraded (or downgraded) in place: the proxy notices and detects the era again."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.app import DETECTOR, create_app
from proxy.config import load_settings
from proxy.protocol import jsonrpc
from proxy.protocol.versions import Era
from tests.support.fake_legacy import SERVER_INFO as LEGACY_SERVER_INFO
from tests.support.fake_legacy import FakeLegacy
from tests.support.fake_modern import PATH, FakeModern
from tests.support.tap import Tap

from .conftest import serve


@pytest.fixture
async def switchable(aiohttp_server: Any, tmp_path: Any) -> tuple[Tap, str, str, str]:
    """One URL whose server can be swapped: a relaying tap in front of a modern and a legacy fake."""
    modern, legacy = FakeModern(), FakeLegacy()
    modern_url = str((await serve(aiohttp_server, modern.app)).make_url(PATH))
    legacy_url = str((await serve(aiohttp_server, legacy.app)).make_url(PATH))
    tap = Tap([modern_url], tmp_path / "record.jsonl")
    app = web.Application()
    app.router.add_route("*", PATH, tap.handle)

    async def client(app: web.Application) -> Any:
        tap.client = aiohttp.ClientSession(auto_decompress=False)
        yield
        await tap.client.close()
        tap.record.close()

    app.cleanup_ctx.append(client)
    front = str((await serve(aiohttp_server, app)).make_url(PATH))
    return tap, front, modern_url, legacy_url


INITIALIZE = jsonrpc.request(
    1, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
)
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


async def test_a_modern_upstream_replaced_by_a_legacy_one_is_detected_again(
    aiohttp_server: Any, aiohttp_client: Any, switchable: tuple[Tap, str, str, str]
) -> None:
    tap, front, _, legacy_url = switchable
    settings = load_settings(None, **{"upstream.url": front})  # era: auto
    app, _ = create_app(settings)
    client = await aiohttp_client(await serve(aiohttp_server, app))
    detector = app[DETECTOR]

    first = await client.post(PATH, json=INITIALIZE, headers=HEADERS)
    assert first.status == 200 and detector.era is Era.MODERN
    session = {**HEADERS, "Mcp-Session-Id": first.headers["Mcp-Session-Id"], "MCP-Protocol-Version": "2025-11-25"}

    tap.targets = [legacy_url]  # the server behind the URL now speaks 2025-11-25 only
    stale = await client.post(PATH, json=jsonrpc.request(2, "tools/list"), headers=session)
    assert "error" in await stale.json()  # translated for a modern server the legacy one cannot read

    again = await client.post(PATH, json=INITIALIZE, headers=HEADERS)
    assert detector.era is Era.LEGACY
    body = await again.json()
    assert again.status == 200 and body["result"]["serverInfo"] == LEGACY_SERVER_INFO  # the upstream's own answer
    ready = await (await client.get("/readyz")).json()
    assert ready["upstream_era"] == "legacy"


async def test_a_protected_upstream_is_detected_with_the_first_callers_token(
    aiohttp_server: Any, aiohttp_client: Any, switchable: tuple[Tap, str, str, str]
) -> None:
    """An OAuth-protected modern server answers an anonymous probe with 401 and an OAuth error body,
    which says nothing of its era (it used to be taken for legacy): the client gets the challenge,
    the proxy stays ready, and the era is learnt with the caller's token."""
    tap, _, _, _ = switchable
    challenge = 'Bearer error="invalid_token", resource_metadata="http://10.0.0.9/.well-known/oauth-protected-resource"'

    async def protected(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != "Bearer good":
            return web.json_response({"error": "invalid_token"}, status=401, headers={"WWW-Authenticate": challenge})
        return await tap.handle(request)

    front_app = web.Application()
    front_app.router.add_route("*", PATH, protected)
    front = str((await serve(aiohttp_server, front_app)).make_url(PATH))
    settings = load_settings(None, **{"upstream.url": front})  # era: auto
    app, _ = create_app(settings)
    client = await aiohttp_client(await serve(aiohttp_server, app))
    detector = app[DETECTOR]

    anonymous = await client.post(PATH, json=INITIALIZE, headers=HEADERS)
    assert anonymous.status == 401
    assert "/.well-known/oauth-protected-resource/mcp" in anonymous.headers["WWW-Authenticate"]
    assert "10.0.0.9" not in anonymous.headers["WWW-Authenticate"]
    assert detector.known is None
    assert (await client.get("/readyz")).status == 200  # it answered: ready, era still to learn

    authorized = await client.post(PATH, json=INITIALIZE, headers={**HEADERS, "Authorization": "Bearer good"})
    assert authorized.status == 200 and detector.era is Era.MODERN
    assert "result" in await authorized.json()
