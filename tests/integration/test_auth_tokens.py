"""Access tokens through the running proxy: the caller named by (issuer, subject) so a refreshed
token keeps what is bound to it, bad tokens refused with a challenge, and resource_server mode
(the proxy is the token's audience; the upstream only ever sees the proxy's own credentials).

The issuer's JWKS is served on 127.0.0.1 (tests/support/jwt_issuer.py); the fake upstreams record
the Authorization header of every request they receive.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import jwt
import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from proxy.app import create_app
from proxy.config import load_settings
from proxy.protocol import jsonrpc
from proxy.protocol.headers import SESSION_HEADER
from proxy.protocol.task_extension import EXTENSION
from tests.integration.conftest import serve
from tests.integration.test_modern_tasks_http import ended, until
from tests.integration.test_modern_to_legacy_http import tool_result
from tests.integration.test_modern_to_legacy_tasks import RELATED, RESEARCH, task_server
from tests.support import fake_legacy, fake_modern
from tests.support.fake_legacy import FakeLegacy
from tests.support.fake_modern import FakeModern
from tests.support.jwt_issuer import JwtIssuer
from tests.support.legacy_client import LegacyClient, error_body, initialize_message
from tests.support.legacy_sse_client import sse_client as legacy_sse_client
from tests.support.mcp_client import ACCEPT, SseReader
from tests.support.modern_client import FULL_CAPABILITIES, ModernClient

JSONDict = dict[str, Any]
WAIT = 5.0
PUBLIC = "https://mcp.example.com/mcp"
METADATA = "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
PROXY_OWN = "Bearer proxy-own-credential"
ELICIT: JSONDict = {
    "mode": "form",
    "message": "Deploy?",
    "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
}


@pytest.fixture
async def issuer(aiohttp_server: Any) -> JwtIssuer:
    issuer = JwtIssuer()
    server = await aiohttp_server(issuer.app)
    issuer.url = str(server.make_url("")).rstrip("/")
    return issuer


@pytest.fixture
async def modern_upstream(aiohttp_server: Any) -> FakeModern:
    fake = FakeModern()

    async def tools_list(call: fake_modern.Call) -> fake_modern.Outcome:
        return fake_modern.complete(tools=[], ttlMs=0, cacheScope="private")  # never cached: each call goes upstream

    fake.handlers["tools/list"] = tools_list
    fake.url = str((await serve(aiohttp_server, fake.app)).make_url("/mcp"))
    return fake


@pytest.fixture
async def legacy_upstream(aiohttp_server: Any) -> FakeLegacy:
    fake = FakeLegacy()
    fake.url = str((await serve(aiohttp_server, fake.app)).make_url(fake_legacy.PATH))
    return fake


Build = Callable[..., Awaitable[TestClient]]


@pytest.fixture
def make_proxy(aiohttp_server: Any, aiohttp_client: Any, issuer: JwtIssuer) -> Build:
    async def build(upstream: FakeModern | FakeLegacy, mode: str = "passthrough", **overrides: Any) -> TestClient:
        era = "modern" if isinstance(upstream, FakeModern) else "legacy"
        fields: JSONDict = {
            "upstream.url": upstream.url,
            "upstream.era": era,
            "cache.watch": False,
            "auth.mode": mode,
            "auth.issuers": [issuer.issuer],
            "auth.jwks_url": issuer.jwks_url,
            "auth.public_url": PUBLIC,
        }
        if mode == "resource_server":
            fields["upstream.headers"] = {"Authorization": PROXY_OWN}
        settings = load_settings(None, **{**fields, **overrides})
        app, _ = create_app(settings)
        return await aiohttp_client(await serve(aiohttp_server, app))

    return build


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def bad_tokens(issuer: JwtIssuer) -> dict[str, tuple[str, str]]:
    """Tokens naming the configured issuer that must not pass, and what the challenge says."""
    now = int(time.time())
    claims = {"iss": issuer.issuer, "sub": "alice", "aud": PUBLIC, "exp": now + 300}
    hs256 = issuer.hs256_with_public_key(claims)
    return {
        "forged": (issuer.mint(aud=PUBLIC, key=issuer.other_rsa), "the token's signature does not verify"),
        "expired": (issuer.mint(aud=PUBLIC, lifetime_s=-300), "the token expired"),
        "wrong_aud": (issuer.mint(aud="https://elsewhere.example/mcp"), f"the token's audience is not {PUBLIC}"),
        "hs256": (hs256, "the token's algorithm 'HS256' is not accepted"),
        "alg_none": (jwt.encode(claims, None, algorithm="none"), "the token's algorithm 'none' is not accepted"),
    }


async def challenged(response: ClientResponse, status: int = 401) -> tuple[str, JSONDict]:
    """A refusal: its status, a JSON-RPC error body, and the WWW-Authenticate challenge."""
    assert response.status == status, await response.text()
    assert response.headers.get("Content-Type", "").startswith("application/json")
    body = json.loads(await response.read())
    assert body["jsonrpc"] == "2.0" and isinstance(body["error"]["code"], int), body
    return response.headers["WWW-Authenticate"], body["error"]


def authorization_seen(calls: list[Any]) -> set[str | None]:
    return {call.headers.get("Authorization") for call in calls}


# ---------------------------------------------------------------------------- passthrough


async def test_a_refreshed_token_keeps_the_legacy_session_and_another_subject_is_refused(
    make_proxy: Build, modern_upstream: FakeModern, issuer: JwtIssuer
) -> None:
    client = await make_proxy(modern_upstream)
    first, refreshed = issuer.mint(aud=PUBLIC), issuer.mint(aud=PUBLIC, kid="ec-1")
    async with asyncio.timeout(WAIT):
        peer = await LegacyClient.connect(client, headers=bearer(first))
        before = len(modern_upstream.calls)
        reply = await peer.request("tools/list", headers=bearer(refreshed))
        assert reply.status == 200 and reply.result == {"tools": []}
        # The upstream got the refreshed token (passthrough forwards it unchanged).
        assert authorization_seen(modern_upstream.calls[before:]) == {f"Bearer {refreshed}"}
        other = await peer.request("tools/list", headers=bearer(issuer.mint(aud=PUBLIC, sub="bob")))
        assert other.status == 404  # another caller's session: as unknown to it as any
        get = await peer.get_stream(headers=bearer(issuer.mint(aud=PUBLIC, sub="bob")))
        assert get.status == 404
        deleted = await peer.delete(headers=bearer(issuer.mint(aud=PUBLIC, sub="bob")))
        assert deleted.status == 404
        assert (await peer.delete(headers=bearer(refreshed))).status == 200


async def test_a_get_stream_opened_with_a_refreshed_token_listens_upstream_with_it(
    make_proxy: Build, modern_upstream: FakeModern, issuer: JwtIssuer
) -> None:
    client = await make_proxy(modern_upstream)
    first, refreshed = issuer.mint(aud=PUBLIC), issuer.mint(aud=PUBLIC)
    async with asyncio.timeout(WAIT):
        peer = await LegacyClient.connect(client, headers=bearer(first))
        stream = await peer.get_stream(headers=bearer(refreshed))  # no request in between
        assert stream.status == 200
        listen = await modern_upstream.wait_listen()
        stream.close()
    assert listen.call.headers.get("Authorization") == f"Bearer {refreshed}"


async def test_an_opaque_token_keeps_the_header_hash_and_reaches_the_upstream(
    make_proxy: Build, modern_upstream: FakeModern, issuer: JwtIssuer
) -> None:
    client = await make_proxy(modern_upstream)
    async with asyncio.timeout(WAIT):
        peer = await LegacyClient.connect(client, headers={"Authorization": "Bearer opaque-1"})
        assert authorization_seen(modern_upstream.calls) == {"Bearer opaque-1"}
        assert (await peer.request("tools/list")).status == 200
        # Nothing says an opaque token's successor is the same caller: the session is not its.
        assert (await peer.request("tools/list", headers={"Authorization": "Bearer opaque-2"})).status == 404
    assert issuer.jwks_fetches == 0


@pytest.mark.parametrize("kind", ["forged", "expired", "wrong_aud", "hs256", "alg_none"])
async def test_a_bad_token_of_a_configured_issuer_gets_401_with_a_challenge(
    make_proxy: Build, modern_upstream: FakeModern, legacy_upstream: FakeLegacy, issuer: JwtIssuer, kind: str
) -> None:
    token, description = bad_tokens(issuer)[kind]
    expected = f'Bearer error="invalid_token", error_description="{description}", resource_metadata="{METADATA}"'
    for mode in ("passthrough", "resource_server"):
        legacy_client = await make_proxy(modern_upstream, mode)
        async with asyncio.timeout(WAIT):
            initialize = await legacy_client.post(
                "/mcp", json=fake_legacy_initialize(), headers={"Accept": ACCEPT, **bearer(token)}
            )
            header, error = await challenged(initialize)
            assert header == expected and description in error["message"]
            modern = ModernClient(await make_proxy(legacy_upstream, mode), headers=bearer(token))
            header, _ = await challenged((await modern.send("tools/list"))[1])
            assert header == expected
    assert modern_upstream.calls == [] and legacy_upstream.calls == []  # refused before the upstream


def fake_legacy_initialize() -> JSONDict:
    return initialize_message()


async def test_the_audience_defaults_to_the_url_the_request_names(
    make_proxy: Build, modern_upstream: FakeModern, issuer: JwtIssuer
) -> None:
    client = await make_proxy(modern_upstream, **{"auth.public_url": None})
    resource = str(client.make_url("/mcp"))
    async with asyncio.timeout(WAIT):
        await LegacyClient.connect(client, headers=bearer(issuer.mint(aud=resource)))
        refused = await client.post(
            "/mcp", json=fake_legacy_initialize(), headers={"Accept": ACCEPT, **bearer(issuer.mint(aud=PUBLIC))}
        )
        header, _ = await challenged(refused)
    host = resource.split("/mcp")[0]
    assert f'resource_metadata="{host}/.well-known/oauth-protected-resource/mcp"' in header


# ---------------------------------------------------------------------------- refresh: pool and parked call


async def test_a_refreshed_token_keeps_the_pooled_session_and_a_parked_call(
    make_proxy: Build, legacy_upstream: FakeLegacy, issuer: JwtIssuer
) -> None:
    async def deploy(call: fake_legacy.Call) -> fake_legacy.Outcome:
        answer = await call.ask("elicitation/create", ELICIT)
        return {"content": [{"type": "text", "text": f"deployed: {answer['result']['action']}"}]}

    legacy_upstream.handlers["tools/call"] = deploy
    client = await make_proxy(legacy_upstream)
    first, refreshed, third = (issuer.mint(aud=PUBLIC, jti=str(i)) for i in range(3))
    params = {"name": "deploy", "arguments": {}}
    async with asyncio.timeout(WAIT):
        reply = await ModernClient(client, headers=bearer(first)).request("tools/call", params)
        result = reply.result
        assert result["resultType"] == "input_required", result
        [asked] = legacy_upstream.calls_of("tools/call")[-1].asked
        retry = {**params, "inputResponses": {f"s{asked.id}": {"action": "accept", "content": {"ok": True}}}}
        retry["requestState"] = result["requestState"]
        resumed = await ModernClient(client, headers=bearer(refreshed)).request("tools/call", retry)
        assert resumed.result["content"] == [{"type": "text", "text": "deployed: accept"}], resumed.final
        # The answer went upstream with the refreshed token, not the one the call was parked with.
        [answer] = legacy_upstream.responses
        assert answer.headers.get("Authorization") == f"Bearer {refreshed}"
        listed = await ModernClient(client, headers=bearer(third)).request("tools/list")
        assert listed.status == 200
    assert len(legacy_upstream.sessions) == 1  # one pooled session served all three tokens
    assert legacy_upstream.calls_of("tools/list")[-1].headers.get("Authorization") == f"Bearer {third}"


async def test_a_parked_call_is_not_resumed_by_another_subject(
    make_proxy: Build, legacy_upstream: FakeLegacy, issuer: JwtIssuer
) -> None:
    async def deploy(call: fake_legacy.Call) -> fake_legacy.Outcome:
        answer = await call.ask("elicitation/create", ELICIT)
        return {"content": [{"type": "text", "text": str(answer)}]}

    legacy_upstream.handlers["tools/call"] = deploy
    client = await make_proxy(legacy_upstream)
    params = {"name": "deploy", "arguments": {}}
    async with asyncio.timeout(WAIT):
        alice = ModernClient(client, headers=bearer(issuer.mint(aud=PUBLIC)))
        result = (await alice.request("tools/call", params)).result
        [asked] = legacy_upstream.calls_of("tools/call")[-1].asked
        retry = {**params, "inputResponses": {f"s{asked.id}": {"action": "accept", "content": {"ok": True}}}}
        retry["requestState"] = result["requestState"]
        bob = await ModernClient(client, headers=bearer(issuer.mint(aud=PUBLIC, sub="bob"))).request(
            "tools/call", retry
        )
        assert bob.status == 400 and bob.error["code"] == -32602, bob.final
        assert legacy_upstream.responses == [] and not asked.response.done()
        # Its own caller, with a fresh token, still can (and so the call ends before shutdown).
        alice = await ModernClient(client, headers=bearer(issuer.mint(aud=PUBLIC))).request("tools/call", retry)
        assert alice.status == 200 and alice.result["resultType"] == "complete", alice.final


# ---------------------------------------------------------------------------- resource_server


async def test_resource_server_never_forwards_the_client_token(
    make_proxy: Build, modern_upstream: FakeModern, legacy_upstream: FakeLegacy, issuer: JwtIssuer
) -> None:
    token = issuer.mint(aud=PUBLIC)
    async with asyncio.timeout(WAIT):
        # A legacy client, translated for a modern upstream: its session, its GET stream.
        client = await make_proxy(modern_upstream, "resource_server")
        peer = await LegacyClient.connect(client, headers=bearer(token))
        assert (await peer.request("tools/list")).status == 200
        stream = await peer.get_stream()
        assert stream.status == 200
        stream.close()
        # A modern client of the same modern upstream (same era: its headers relayed).
        assert (await ModernClient(client, headers=bearer(token)).request("tools/list")).status == 200
        # A modern client, translated for a legacy upstream (the pool).
        pooled = await make_proxy(legacy_upstream, "resource_server")
        assert (await ModernClient(pooled, headers=bearer(token)).request("tools/list")).status == 200
        # A legacy client of a legacy upstream: relayed byte for byte.
        relayed = await LegacyClient.connect(pooled, headers=bearer(token))
        assert (await relayed.request("tools/list")).status == 200
        assert (await relayed.delete()).status == 200
    assert authorization_seen(modern_upstream.calls) == {PROXY_OWN}
    assert authorization_seen(legacy_upstream.calls) == {PROXY_OWN}
    assert len(modern_upstream.calls) >= 3 and len(legacy_upstream.calls) >= 4


async def test_resource_server_refuses_every_endpoint_without_a_token(
    make_proxy: Build, modern_upstream: FakeModern, issuer: JwtIssuer
) -> None:
    client = await make_proxy(modern_upstream, "resource_server")
    async with asyncio.timeout(WAIT):
        peer = await LegacyClient.connect(client, headers=bearer(issuer.mint(aud=PUBLIC)))
        before = len(modern_upstream.calls)
        anonymous = LegacyClient(client, peer.version, peer.session_id, {}, peer.initialize_result)
        responses = [
            await client.post("/mcp", json=fake_legacy_initialize(), headers={"Accept": ACCEPT}),
            (await anonymous.send("tools/list"))[1],
            await anonymous.get_stream(),
            await anonymous.delete(),
            (await ModernClient(client).send("tools/list"))[1],
            (await ModernClient(client, headers={"Authorization": "Basic dXNlcjpwdw=="}).send("tools/list"))[1],
        ]
        for response in responses:
            header, error = await challenged(response)
            assert header == f'Bearer resource_metadata="{METADATA}"'  # RFC 6750 §3.1: no error code
            assert error["message"] == "authorization required: send a Bearer access token"
        opaque, _ = await challenged((await ModernClient(client, headers=bearer("opaque")).send("tools/list"))[1])
        assert opaque.startswith('Bearer error="invalid_token"')
    assert len(modern_upstream.calls) == before
    assert SESSION_HEADER in peer.headers()


async def test_resource_server_wants_the_required_scopes(
    make_proxy: Build, modern_upstream: FakeModern, issuer: JwtIssuer
) -> None:
    client = await make_proxy(modern_upstream, "resource_server", **{"auth.required_scopes": ["mcp:tools"]})
    async with asyncio.timeout(WAIT):
        reader = ModernClient(client, headers=bearer(issuer.mint(aud=PUBLIC, scope="mcp:read")))
        response = (await reader.send("tools/list"))[1]
        header, error = await challenged(response, 403)
        assert header == (
            'Bearer error="insufficient_scope", error_description="the token lacks the scopes mcp:tools", '
            f'scope="mcp:tools", resource_metadata="{METADATA}"'
        )
        assert error["message"].startswith("insufficient_scope")
        ok = await ModernClient(client, headers=bearer(issuer.mint(aud=PUBLIC, scope="mcp:tools"))).request(
            "tools/list"
        )
        assert ok.status == 200
    assert len(modern_upstream.calls_of("tools/list")) == 1


@pytest.mark.parametrize("mode", ["passthrough", "resource_server"])
async def test_keys_unavailable_is_503_never_401_nor_500(
    make_proxy: Build, modern_upstream: FakeModern, issuer: JwtIssuer, mode: str
) -> None:
    issuer.down = True
    client = await make_proxy(modern_upstream, mode)
    async with asyncio.timeout(WAIT):
        response = (await ModernClient(client, headers=bearer(issuer.mint(aud=PUBLIC))).send("tools/list"))[1]
        assert response.status == 503, await response.text()
        body = json.loads(await response.read())
        assert body["error"]["code"] == -32603 and "cannot be verified now" in body["error"]["message"]
        assert "WWW-Authenticate" not in response.headers
        issuer.down = False  # the keys come back: so does service (the failed fetch was not cached)
        assert (await ModernClient(client, headers=bearer(issuer.mint(aud=PUBLIC))).request("tools/list")).status == 200
    assert modern_upstream.calls_of("tools/list") and issuer.jwks_fetches == 2


async def test_error_body_of_a_refused_legacy_request_is_valid_json_rpc(
    make_proxy: Build, modern_upstream: FakeModern, issuer: JwtIssuer
) -> None:
    client = await make_proxy(modern_upstream, "resource_server")
    async with asyncio.timeout(WAIT):
        response = await client.post("/mcp", json=fake_legacy_initialize(), headers={"Accept": ACCEPT})
        assert response.status == 401
        error = await error_body(response)
    assert error["code"] == -32600


async def test_resource_server_turns_the_upstreams_refusal_of_its_own_credentials_into_502(
    make_proxy: Build, modern_upstream: FakeModern, legacy_upstream: FakeLegacy, issuer: JwtIssuer
) -> None:
    """The client's token was fine; the upstream's challenge would only send it to authorize again."""
    challenge = 'Bearer error="invalid_token", resource_metadata="http://127.0.0.1:1/.well-known/x"'

    async def refuse(call: Any) -> Any:
        return fake_modern.Reply(401, {"error": "unauthorized"}, headers={"WWW-Authenticate": challenge})

    modern_upstream.handlers["tools/call"] = refuse
    modern_upstream.handlers["tools/list"] = refuse
    token = issuer.mint(aud=PUBLIC)
    client = await make_proxy(modern_upstream, "resource_server")
    async with asyncio.timeout(WAIT):
        # Same era, byte for byte (tools/call), and translated for a legacy client (tools/list).
        modern = ModernClient(client, headers=bearer(token))
        relayed = (await modern.send("tools/call", {"name": "x", "arguments": {}}))[1]
        peer = await LegacyClient.connect(client, headers=bearer(token))
        translated = (await peer.send("tools/list"))[1]
        for response in (relayed, translated):
            assert response.status == 502, await response.text()
            assert "WWW-Authenticate" not in response.headers
            error = json.loads(await response.read())["error"]
            assert error["code"] == -32010 and "refused the proxy's own credentials (HTTP 401)" in error["message"]
    assert authorization_seen(modern_upstream.calls) == {PROXY_OWN}


async def test_in_passthrough_the_upstreams_401_still_reaches_the_client(
    make_proxy: Build, modern_upstream: FakeModern, issuer: JwtIssuer
) -> None:
    async def refuse(call: Any) -> Any:
        return fake_modern.Reply(401, b"", headers={"WWW-Authenticate": "Bearer"})

    modern_upstream.handlers["tools/call"] = refuse
    client = await make_proxy(modern_upstream)
    async with asyncio.timeout(WAIT):
        modern = ModernClient(client, headers=bearer(issuer.mint(aud=PUBLIC)))
        response = (await modern.send("tools/call", {"name": "x", "arguments": {}}))[1]
        assert response.status == 401 and response.headers["WWW-Authenticate"].startswith("Bearer")


async def test_the_jwks_is_found_through_the_issuers_metadata(
    make_proxy: Build, modern_upstream: FakeModern, issuer: JwtIssuer
) -> None:
    client = await make_proxy(modern_upstream, "resource_server", **{"auth.jwks_url": None})
    async with asyncio.timeout(WAIT):
        for subject in ("alice", "bob"):
            token = issuer.mint(aud=PUBLIC, sub=subject)
            assert (await ModernClient(client, headers=bearer(token)).request("tools/list")).status == 200
    # Asked once: while the JWKS is fresh the metadata is not asked again (it says no-store).
    assert issuer.metadata_fetches == ["/.well-known/oauth-authorization-server"]
    assert issuer.jwks_fetches == 1


async def test_a_refreshed_token_keeps_the_callers_private_cache_entries(
    make_proxy: Build, modern_upstream: FakeModern, issuer: JwtIssuer
) -> None:
    async def tools_list(call: fake_modern.Call) -> fake_modern.Outcome:
        return fake_modern.complete(tools=[], ttlMs=60_000, cacheScope="private")

    modern_upstream.handlers["tools/list"] = tools_list
    client = await make_proxy(modern_upstream, **{"cache.watch": False})
    async with asyncio.timeout(WAIT):
        for token in (issuer.mint(aud=PUBLIC), issuer.mint(aud=PUBLIC)):  # the second: a refresh
            assert (await ModernClient(client, headers=bearer(token)).request("tools/list")).status == 200
        assert len(modern_upstream.calls_of("tools/list")) == 1  # the refreshed token hit alice's entry
        bob = ModernClient(client, headers=bearer(issuer.mint(aud=PUBLIC, sub="bob")))
        assert (await bob.request("tools/list")).status == 200
    assert len(modern_upstream.calls_of("tools/list")) == 2  # never alice's entry for bob


# ---------------------------------------------------------------- resource_server: same-era state bound to the caller
# The upstream sees only the proxy's credentials here, so it cannot tell callers apart: the proxy
# binds what it hands out (a legacy session id, a modern requestState) to the caller instead.


@pytest.mark.parametrize("mode", ["passthrough", "resource_server"])
async def test_a_relayed_legacy_session_is_its_callers_alone(
    make_proxy: Build, legacy_upstream: FakeLegacy, issuer: JwtIssuer, mode: str
) -> None:
    client = await make_proxy(legacy_upstream, mode)
    bob = bearer(issuer.mint(aud=PUBLIC, sub="bob"))
    async with asyncio.timeout(WAIT):
        peer = await LegacyClient.connect(client, headers=bearer(issuer.mint(aud=PUBLIC)))
        [upstream_id] = [session.id for session in legacy_upstream.sessions]
        if mode == "resource_server":
            assert peer.session_id != upstream_id  # sealed for its caller around the upstream's own
        else:
            assert peer.session_id == upstream_id  # the upstream binds it to the token it sees
        kept = await peer.request("tools/list", headers=bearer(issuer.mint(aud=PUBLIC)))  # a refreshed token
        assert kept.status == 200, kept.final
        assert legacy_upstream.calls_of("tools/list")[-1].session_id == upstream_id
        seen = len(legacy_upstream.calls)
        if mode == "passthrough":
            return  # the upstream's to refuse (the e2e suite runs a real one)
        refused = await peer.request("tools/list", headers=bob)
        assert refused.status == 404 and refused.error == {"code": -32001, "message": "Session not found"}
        assert (await peer.get_stream(headers=bob)).status == 404
        assert (await peer.delete(headers=bob)).status == 404
        # The upstream's own id is no session of the proxy's either (a client never had it).
        raw = await client.post(
            "/mcp",
            json={"jsonrpc": "2.0", "id": 9, "method": "tools/list"},
            headers={"Accept": ACCEPT, SESSION_HEADER: upstream_id, **bearer(issuer.mint(aud=PUBLIC))},
        )
        assert raw.status == 404 and (await error_body(raw))["code"] == -32001
        assert len(legacy_upstream.calls) == seen  # none of these reached the upstream
        assert (await peer.request("tools/list")).status == 200  # the refusals did not end it
        assert (await peer.delete()).status == 200
    assert legacy_upstream.calls[-1].http_method == "DELETE"
    assert legacy_upstream.calls[-1].session_id == upstream_id


@pytest.mark.parametrize("reply", ["json", "sse"])
@pytest.mark.parametrize("method", ["tools/call", "resources/read"])  # relayed byte for byte / message by message
@pytest.mark.parametrize("mode", ["passthrough", "resource_server"])
async def test_a_modern_upstreams_request_state_is_its_callers_alone(
    make_proxy: Build, modern_upstream: FakeModern, issuer: JwtIssuer, mode: str, method: str, reply: str
) -> None:
    upstream_state = "upstream-state-1"
    asked = {"confirm": {"method": "elicitation/create", "params": ELICIT}}

    async def handler(call: fake_modern.Call) -> fake_modern.Outcome:
        if reply == "sse":  # an interim message first: the reply is an SSE stream
            await call.send(fake_modern.notification("notifications/message", {"level": "info", "data": "working"}))
        if "requestState" not in call.params:
            return fake_modern.input_required(asked, upstream_state)
        if method == "resources/read":
            return fake_modern.complete(
                contents=[{"uri": "file:///a", "text": call.params["requestState"]}], ttlMs=0, cacheScope="private"
            )
        return fake_modern.complete(content=[{"type": "text", "text": call.params["requestState"]}])

    modern_upstream.handlers[method] = handler
    client = await make_proxy(modern_upstream, mode)
    params: JSONDict = {"name": "deploy", "arguments": {}} if method == "tools/call" else {"uri": "file:///a"}
    async with asyncio.timeout(WAIT):
        first = await ModernClient(client, headers=bearer(issuer.mint(aud=PUBLIC))).request(method, params)
        result = first.result
        assert result["resultType"] == "input_required", first.final
        if mode == "resource_server":
            assert result["requestState"] != upstream_state
        else:
            assert result["requestState"] == upstream_state  # passthrough: the upstream binds it itself
        retry = {**params, "inputResponses": {"confirm": {"action": "accept", "content": {"ok": True}}}}
        retry["requestState"] = result["requestState"]
        if mode == "resource_server":
            seen = len(modern_upstream.calls)
            bob = ModernClient(client, headers=bearer(issuer.mint(aud=PUBLIC, sub="bob")))
            refused = await bob.request(method, retry)
            assert refused.status == 400 and refused.error["code"] == -32602, refused.final
            assert "requestState is invalid" in refused.error["message"]
            forged = await ModernClient(client, headers=bearer(issuer.mint(aud=PUBLIC))).request(
                method, {**retry, "requestState": upstream_state}
            )
            assert forged.status == 400 and forged.error["code"] == -32602, forged.final
            assert len(modern_upstream.calls) == seen  # neither reached the upstream
        # Its own caller, with a refreshed token: the upstream gets its own requestState back.
        done = await ModernClient(client, headers=bearer(issuer.mint(aud=PUBLIC))).request(method, retry)
        assert done.status == 200 and done.result["resultType"] == "complete", done.final
    assert modern_upstream.calls_of(method)[-1].params["requestState"] == upstream_state
    assert modern_upstream.schema_problems() == []


async def test_resource_server_guards_the_http_sse_transport_too(
    make_proxy: Build, modern_upstream: FakeModern, issuer: JwtIssuer
) -> None:
    """GET /sse and each POST need a valid token; a valid one gets a session whose upstream calls
    carry the proxy's own credentials."""
    client = await make_proxy(modern_upstream, "resource_server")
    async with asyncio.timeout(WAIT):
        header, _ = await challenged(await client.get("/sse", headers={"Accept": "text/event-stream"}))
        assert header == f'Bearer resource_metadata="{METADATA}"'
        token = bearer(issuer.mint(aud=PUBLIC))
        async with legacy_sse_client(client, token) as stream:
            await stream.initialize()
            assert (await stream.request(1, "tools/list"))["result"]["tools"] == []
            refused, _ = await challenged(
                await stream.post({"jsonrpc": "2.0", "id": 2, "method": "ping"}, {"Authorization": ""})
            )
            assert refused.startswith("Bearer")
            expired, _ = await challenged(
                await stream.post(
                    {"jsonrpc": "2.0", "id": 3, "method": "ping"}, bearer(issuer.mint(aud=PUBLIC, lifetime_s=-300))
                )
            )
            assert expired.startswith('Bearer error="invalid_token"')
    assert authorization_seen(modern_upstream.calls) == {PROXY_OWN}


async def test_a_hosted_task_goes_on_upstream_with_the_callers_refreshed_token(
    make_proxy: Build, modern_upstream: FakeModern, issuer: JwtIssuer
) -> None:
    """A task outlives its token: the round after the refresh goes upstream with the new one."""
    first, refreshed = issuer.mint(aud=PUBLIC), issuer.mint(aud=PUBLIC)
    rounds = iter(
        [
            fake_modern.input_required({"ok": {"method": "elicitation/create", "params": ELICIT}}, request_state="r1"),
            fake_modern.complete(content=[{"type": "text", "text": "deployed"}]),
        ]
    )

    async def deploy(call: fake_modern.Call) -> fake_modern.Outcome:
        return next(rounds)

    modern_upstream.handlers["tools/call"] = deploy
    client = await make_proxy(modern_upstream)
    async with asyncio.timeout(WAIT):
        peer = await LegacyClient.connect(client, headers=bearer(first))
        task = (await peer.request("tools/call", {"name": "deploy", "arguments": {}, "task": {}})).result["task"]
        await modern_upstream.next_call("tools/call")  # the first round went with the first token
        _, response = await peer.send("tasks/result", {"taskId": task["taskId"]}, headers=bearer(refreshed))
        reader = SseReader(response)
        asked = await reader.message()
        assert asked is not None and asked["method"] == "elicitation/create"
        assert await peer.respond(asked["id"], {"action": "accept", "content": {"ok": True}}) == 202
        final = await reader.message()
    assert final is not None and final["result"]["content"] == [{"type": "text", "text": "deployed"}]
    calls = [c for c in modern_upstream.calls if c.method == "tools/call"]
    assert [c.headers.get("Authorization") for c in calls] == [f"Bearer {first}", f"Bearer {refreshed}"]


async def test_a_2026_task_hosted_for_a_modern_client_goes_on_with_its_refreshed_token(
    make_proxy: Build, legacy_upstream: FakeLegacy, issuer: JwtIssuer
) -> None:
    """The answer of a task's input round (tasks/update) brings a refreshed token: what the call
    sends the server from then on goes with it, and another subject cannot touch the task."""
    first, refreshed = issuer.mint(aud=PUBLIC), issuer.mint(aud=PUBLIC)

    async def result(call: fake_legacy.Call) -> fake_legacy.Outcome:
        answer = await call.ask("elicitation/create", {**ELICIT, "_meta": dict(RELATED)})
        return tool_result(f"deployed: {answer['result']['action']}")

    task_server(legacy_upstream, result)
    client = await make_proxy(legacy_upstream)
    tasks_declared = {**FULL_CAPABILITIES, "extensions": {EXTENSION: {}}}
    alice = ModernClient(client, capabilities=tasks_declared, headers=bearer(first))
    async with asyncio.timeout(WAIT):
        handle = (await alice.request("tools/call", RESEARCH)).result
        asking = await until(alice, handle["taskId"], lambda t: t["status"] == "input_required")
        [key] = asking["inputRequests"]
        update = {"taskId": handle["taskId"], "inputResponses": {key: {"action": "accept", "content": {"ok": True}}}}
        bob = ModernClient(client, capabilities=tasks_declared, headers=bearer(issuer.mint(aud=PUBLIC, sub="bob")))
        refused = await bob.request("tasks/update", update)
        alice.base_headers = bearer(refreshed)
        await alice.request("tasks/update", update)
        done = await until(alice, handle["taskId"], ended)
    assert refused.error["code"] == jsonrpc.INVALID_PARAMS  # not found, for another subject
    assert done["status"] == "completed"
    [answer] = [c for c in legacy_upstream.calls if c.kind == "response"]
    assert answer.headers.get("Authorization") == f"Bearer {refreshed}"
    [call] = legacy_upstream.calls_of("tools/call")
    assert call.headers.get("Authorization") == f"Bearer {first}"
