"""OAuth discovery through the proxy: the protected resource metadata and authorization server
metadata on the proxy's origin, and every relayed challenge naming the proxy's metadata
(docs/design.md §Authorization discovery). The upstream is a small aiohttp app on 127.0.0.1 that
publishes metadata and refuses every MCP request with 401."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from structlog.testing import capture_logs

from proxy.app import DISCOVERY, create_app
from proxy.auth import challenge
from proxy.auth.discovery import MetadataError
from proxy.config import load_settings
from tests.integration.conftest import closed_port_url, serve
from tests.support.legacy_client import LegacyClient, initialize_message
from tests.support.mcp_client import ACCEPT
from tests.support.modern_client import ModernClient

WAIT = 5.0
PRM = "/.well-known/oauth-protected-resource"
PRM_MCP = PRM + "/mcp"
ASM = "/.well-known/oauth-authorization-server"
OIDC = "/.well-known/openid-configuration"
AS_URL = "https://auth.example.com"


@dataclass
class Doc:
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 200


def doc(document: Any, cache_control: str | None = None, status: int = 200) -> Doc:
    headers = {"Content-Type": "application/json"}
    if cache_control is not None:
        headers["Cache-Control"] = cache_control
    return Doc(json.dumps(document).encode(), headers, status)


class Upstream:
    """Publishes `docs` (path → document) and refuses every POST to /mcp with 401 and a challenge
    naming `named` (its own metadata by default); counts the requests for each path."""

    def __init__(self) -> None:
        self.docs: dict[str, Doc] = {}
        self.hits: dict[str, int] = {}
        self.methods: list[Any] = []
        self.hold: asyncio.Event | None = None  # metadata answers wait for it when set
        self.arrived = asyncio.Event()  # a metadata request came
        self.url = ""
        self.origin = ""
        self.named: str | None = None
        self.session_allowed = False  # initialize answered, everything else refused
        self.app = web.Application()
        self.app.router.add_post("/mcp", self._mcp)
        self.app.router.add_get("/{tail:.*}", self._doc)

    def challenge(self) -> str:
        named = self.named or self.origin + PRM_MCP
        return f'Bearer error="invalid_token", resource_metadata="{named}", scope="read"'

    async def _mcp(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.session_allowed and isinstance(body, dict) and body.get("method") == "initialize":
            # A 2025-03-26 session, so that a batch (only allowed in a session) reaches the refusal.
            result = {"protocolVersion": "2025-03-26", "capabilities": {}, "serverInfo": {"name": "u", "version": "1"}}
            reply = {"jsonrpc": "2.0", "id": body["id"], "result": result}
            return web.json_response(reply, headers={"Mcp-Session-Id": "upstream-session"})
        if self.session_allowed and isinstance(body, dict) and "id" not in body:
            return web.Response(status=202)
        self.methods.append([m.get("method") for m in body] if isinstance(body, list) else body.get("method"))
        return web.json_response({"error": "invalid_token"}, status=401, headers={"WWW-Authenticate": self.challenge()})

    async def _doc(self, request: web.Request) -> web.Response:
        self.hits[request.path] = self.hits.get(request.path, 0) + 1
        self.arrived.set()
        if self.hold is not None:
            await self.hold.wait()
        found = self.docs.get(request.path)
        if found is None:
            return web.json_response({"error": "not_found"}, status=404)
        return web.Response(body=found.body, status=found.status, headers=found.headers)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Proxy:
    client: TestClient
    clock: Clock
    app: web.Application

    @property
    def resource(self) -> str:
        return str(self.client.make_url("/mcp"))

    @property
    def metadata(self) -> str:
        return str(self.client.make_url(PRM_MCP))

    async def get(self, path: str, **kwargs: Any) -> tuple[int, Any, Any]:
        response = await self.client.get(path, **kwargs)
        assert response.content_type == "application/json", await response.text()
        return response.status, await response.json(), response.headers


MakeProxy = Callable[..., Any]


@pytest.fixture
async def upstream(aiohttp_server: Any) -> Upstream:
    fake = Upstream()
    server = await serve(aiohttp_server, fake.app)
    fake.origin = str(server.make_url("")).rstrip("/")
    fake.url = fake.origin + "/mcp"
    return fake


@pytest.fixture
def make_proxy(aiohttp_server: Any, aiohttp_client: Any, upstream: Upstream) -> MakeProxy:
    async def build(*, upstream_url: str | None = None, era: str = "modern", **overrides: Any) -> Proxy:
        settings = load_settings(
            None,
            **{
                "upstream.url": upstream_url or upstream.url,
                "upstream.era": era,
                "cache.watch": False,
                **overrides,
            },
        )
        clock = Clock()
        app, _ = create_app(settings, cache_clock=clock)
        server = await serve(aiohttp_server, app)
        return Proxy(await aiohttp_client(server), clock, app)

    return build


def upstream_document(upstream: Upstream, **extra: Any) -> dict[str, Any]:
    return {
        "resource": upstream.url,
        "authorization_servers": [AS_URL],
        "scopes_supported": ["read", "write"],
        "bearer_methods_supported": ["header"],
        "x_vendor_field": {"kept": [1, 2]},
        **extra,
    }


# ---------------------------------------------------------------- protected resource metadata


@pytest.mark.parametrize("published", [PRM_MCP, PRM])
async def test_both_forms_serve_the_upstream_document_with_resource_rewritten_and_unknown_fields_kept(
    make_proxy: MakeProxy, upstream: Upstream, published: str
) -> None:
    original = upstream_document(upstream)
    upstream.docs[published] = doc(original, "max-age=60")
    proxy = await make_proxy()
    async with asyncio.timeout(WAIT):
        for path in (PRM_MCP, PRM):
            status, body, headers = await proxy.get(path)
            assert status == 200, body
            assert body == {**original, "resource": proxy.resource}
            assert list(body) == list(original)  # the fields' order too
            assert headers["Cache-Control"] == "max-age=60"
            head = await proxy.client.head(path)
            assert head.status == 200 and await head.read() == b""
    assert upstream.hits[published] == 1  # cached: one fetch for both forms, GET and HEAD
    if published == PRM:
        assert upstream.hits[PRM_MCP] == 1  # the path-suffixed form was tried first, once


async def test_the_document_named_by_the_upstreams_last_challenge_is_the_one_relayed(
    make_proxy: MakeProxy, upstream: Upstream
) -> None:
    upstream.named = upstream.origin + "/custom/metadata"
    upstream.docs["/custom/metadata"] = doc(upstream_document(upstream, x_where="named"), "no-store")
    upstream.docs[PRM_MCP] = doc(upstream_document(upstream, x_where="well-known"), "no-store")
    proxy = await make_proxy()
    peer = ModernClient(proxy.client)
    async with asyncio.timeout(WAIT):
        _, body, _ = await proxy.get(PRM_MCP)
        assert body["x_where"] == "well-known"  # no challenge seen yet
        _, refused = await peer.send("tools/call", {"name": "t", "arguments": {}})
        assert refused.status == 401
        assert f'resource_metadata="{proxy.metadata}"' in refused.headers["WWW-Authenticate"]
        _, body, _ = await proxy.get(PRM_MCP)
        assert body["x_where"] == "named" and body["resource"] == proxy.resource


async def test_the_cache_follows_max_age(make_proxy: MakeProxy, upstream: Upstream) -> None:
    upstream.docs[PRM_MCP] = doc(upstream_document(upstream), "public, max-age=60")
    proxy = await make_proxy()
    async with asyncio.timeout(WAIT):
        await proxy.get(PRM_MCP)
        proxy.clock.now += 59
        _, _, headers = await proxy.get(PRM_MCP)
        assert upstream.hits[PRM_MCP] == 1 and headers["Cache-Control"] == "max-age=1"
        proxy.clock.now += 2
        await proxy.get(PRM_MCP)
        assert upstream.hits[PRM_MCP] == 2


async def test_a_longer_max_age_is_cut_to_metadata_max_age_s(make_proxy: MakeProxy, upstream: Upstream) -> None:
    upstream.docs[PRM_MCP] = doc(upstream_document(upstream), "max-age=86400")
    proxy = await make_proxy(**{"auth.metadata_max_age_s": 10})
    async with asyncio.timeout(WAIT):
        _, _, headers = await proxy.get(PRM_MCP)
        assert headers["Cache-Control"] == "max-age=10"
        proxy.clock.now += 9
        await proxy.get(PRM_MCP)
        assert upstream.hits[PRM_MCP] == 1
        proxy.clock.now += 2
        await proxy.get(PRM_MCP)
        assert upstream.hits[PRM_MCP] == 2


async def test_no_store_is_fetched_every_time(make_proxy: MakeProxy, upstream: Upstream) -> None:
    upstream.docs[PRM_MCP] = doc(upstream_document(upstream), "no-store")
    proxy = await make_proxy()
    async with asyncio.timeout(WAIT):
        for _ in range(3):
            status, _, headers = await proxy.get(PRM_MCP)
            assert status == 200 and headers["Cache-Control"] == "no-store"
    assert upstream.hits[PRM_MCP] == 3


async def test_concurrent_misses_share_one_fetch(make_proxy: MakeProxy, upstream: Upstream) -> None:
    upstream.docs[PRM_MCP] = doc(upstream_document(upstream), "max-age=60")
    upstream.hold = asyncio.Event()
    proxy = await make_proxy()
    async with asyncio.timeout(WAIT):
        gets = [asyncio.ensure_future(proxy.get(PRM_MCP)) for _ in range(5)]
        await upstream.arrived.wait()
        upstream.hold.set()
        results = await asyncio.gather(*gets)
    assert [status for status, _, _ in results] == [200] * 5
    assert upstream.hits[PRM_MCP] == 1


MALFORMED = {
    "not JSON": Doc(b"<html>metadata</html>", {"Content-Type": "text/html"}),
    "an array": doc([{"resource": "x"}]),
    "no resource": doc({"authorization_servers": [AS_URL]}),
    "resource not a string": doc({"resource": 7, "authorization_servers": [AS_URL]}),
    "no authorization servers": doc({"resource": "http://127.0.0.1/mcp"}),
    "authorization servers not a list": doc({"resource": "http://127.0.0.1/mcp", "authorization_servers": AS_URL}),
    "too large": doc({"resource": "http://127.0.0.1/mcp", "authorization_servers": [AS_URL], "pad": "x" * 70000}),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_malformed_metadata_is_a_logged_502_with_an_oauth_error_body(
    make_proxy: MakeProxy, upstream: Upstream, case: str
) -> None:
    upstream.docs[PRM_MCP] = MALFORMED[case]
    proxy = await make_proxy()
    with capture_logs() as logs:
        async with asyncio.timeout(WAIT):
            status, body, _ = await proxy.get(PRM_MCP)
    assert status == 502
    assert body["error"] == "invalid_metadata" and body["error_description"].startswith(f"the metadata at {PRM_MCP}")
    events = [e for e in logs if e["event"] == "oauth_metadata_invalid"]
    assert len(events) == 1 and events[0]["path"] == PRM_MCP and events[0]["log_level"] == "warning"


async def test_an_upstream_without_metadata_is_404_everywhere(make_proxy: MakeProxy, upstream: Upstream) -> None:
    proxy = await make_proxy()
    async with asyncio.timeout(WAIT):
        for path in (PRM, PRM_MCP, ASM, OIDC, ASM + "/mcp"):
            status, body, headers = await proxy.get(path)
            assert status == 404 and body["error"] == "not_found", (path, body)
            assert set(body) == {"error", "error_description"} and headers["Cache-Control"] == "no-store"
    assert upstream.hits == {PRM_MCP: 1, PRM: 1, ASM: 1, OIDC: 1, ASM + "/mcp": 1}  # both forms: one search


async def test_an_absence_is_kept_briefly(make_proxy: MakeProxy, upstream: Upstream) -> None:
    proxy = await make_proxy()
    async with asyncio.timeout(WAIT):
        assert (await proxy.get(PRM_MCP))[0] == 404
        proxy.clock.now += 9
        assert (await proxy.get(PRM_MCP))[0] == 404
        assert upstream.hits[PRM_MCP] == 1
        upstream.docs[PRM] = doc(upstream_document(upstream))  # the upstream starts publishing
        proxy.clock.now += 2
        assert (await proxy.get(PRM_MCP))[0] == 200
    assert upstream.hits == {PRM_MCP: 2, PRM: 2}


async def test_a_failure_is_not_kept(make_proxy: MakeProxy, upstream: Upstream) -> None:
    upstream.docs[PRM_MCP] = doc({"resource": "x"})
    proxy = await make_proxy()
    async with asyncio.timeout(WAIT):
        assert (await proxy.get(PRM_MCP))[0] == 502
        upstream.docs[PRM_MCP] = doc(upstream_document(upstream))
        assert (await proxy.get(PRM_MCP))[0] == 200
    assert upstream.hits[PRM_MCP] == 2


async def test_a_path_the_proxy_does_not_serve_is_404_json(make_proxy: MakeProxy, upstream: Upstream) -> None:
    upstream.docs[PRM + "/other"] = doc(upstream_document(upstream))
    proxy = await make_proxy()
    async with asyncio.timeout(WAIT):
        status, body, _ = await proxy.get(PRM + "/other")
    assert status == 404 and body["error"] == "not_found"
    assert upstream.hits == {}


async def test_an_unreachable_upstream_is_502(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(upstream_url=closed_port_url())
    with capture_logs() as logs:
        async with asyncio.timeout(WAIT):
            status, body, _ = await proxy.get(PRM_MCP)
    assert status == 502 and body["error"] == "temporarily_unavailable" and "unreachable" in body["error_description"]
    assert [e["event"] for e in logs if e["event"].startswith("oauth_")] == ["oauth_metadata_unavailable"]


async def test_an_upstream_5xx_is_502(make_proxy: MakeProxy, upstream: Upstream) -> None:
    upstream.docs[PRM_MCP] = Doc(b"oops", {"Content-Type": "text/plain"}, 503)
    proxy = await make_proxy()
    async with asyncio.timeout(WAIT):
        status, body, _ = await proxy.get(PRM_MCP)
    assert status == 502 and "HTTP 503" in body["error_description"]


async def test_an_upstream_that_does_not_answer_in_time_is_504(make_proxy: MakeProxy, upstream: Upstream) -> None:
    upstream.docs[PRM_MCP] = doc(upstream_document(upstream))
    upstream.hold = asyncio.Event()  # never set while the proxy waits
    proxy = await make_proxy(**{"upstream.connect_timeout_s": 0.3})
    try:
        async with asyncio.timeout(WAIT):
            status, body, _ = await proxy.get(PRM_MCP)
    finally:
        upstream.hold.set()
    assert status == 504 and body["error"] == "temporarily_unavailable" and "0.3 s" in body["error_description"]


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
async def test_other_methods_are_405_with_allow(make_proxy: MakeProxy, method: str) -> None:
    proxy = await make_proxy()
    async with asyncio.timeout(WAIT):
        for path in (PRM_MCP, ASM, OIDC):
            response = await proxy.client.request(method, path)
            assert response.status == 405 and response.headers["Allow"] == "GET, HEAD"
            assert (await response.json())["error"] == "method_not_allowed"


async def test_a_host_the_guard_refuses_is_421(make_proxy: MakeProxy, upstream: Upstream) -> None:
    upstream.docs[PRM_MCP] = doc(upstream_document(upstream))
    proxy = await make_proxy()
    async with asyncio.timeout(WAIT):
        status, body, _ = await proxy.get(PRM_MCP, headers={"Host": "evil.example"})
    assert status == 421 and body["error"] == "invalid_request"
    assert upstream.hits == {}


async def test_public_url_is_the_resource_when_set(make_proxy: MakeProxy, upstream: Upstream) -> None:
    upstream.docs[PRM_MCP] = doc(upstream_document(upstream))
    proxy = await make_proxy(**{"auth.public_url": "https://mcp.example.com/mcp"})
    peer = ModernClient(proxy.client)
    async with asyncio.timeout(WAIT):
        _, body, _ = await proxy.get(PRM_MCP)
        assert body["resource"] == "https://mcp.example.com/mcp"
        _, refused = await peer.send("tools/call", {"name": "t", "arguments": {}})
    assert refused.status == 401
    expected = 'resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/mcp"'
    assert expected in refused.headers["WWW-Authenticate"]


async def test_the_derived_resource_follows_the_host_the_client_used(make_proxy: MakeProxy, upstream: Upstream) -> None:
    upstream.docs[PRM_MCP] = doc(upstream_document(upstream))
    proxy = await make_proxy()
    port = proxy.client.port
    async with asyncio.timeout(WAIT):
        _, body, _ = await proxy.get(PRM_MCP, headers={"Host": f"localhost:{port}"})
    assert body["resource"] == f"http://localhost:{port}/mcp"


# ---------------------------------------------------------------- authorization server metadata


async def test_authorization_server_metadata_is_relayed_from_the_upstream_origin(
    make_proxy: MakeProxy, upstream: Upstream
) -> None:
    metadata = {"issuer": upstream.origin, "authorization_endpoint": upstream.origin + "/authorize", "x": 1}
    upstream.docs[ASM] = doc(metadata, "max-age=30")
    upstream.docs[OIDC + "/mcp"] = doc({**metadata, "userinfo_endpoint": upstream.origin + "/me"})
    proxy = await make_proxy()
    async with asyncio.timeout(WAIT):
        status, body, headers = await proxy.get(ASM)
        assert (status, body, headers["Cache-Control"]) == (200, metadata, "max-age=30")
        await proxy.get(ASM)
        assert upstream.hits[ASM] == 1
        status, body, _ = await proxy.get(OIDC + "/mcp")
        assert status == 200 and body["userinfo_endpoint"] == upstream.origin + "/me"
        status, body, _ = await proxy.get(OIDC)
        assert status == 404


async def test_authorization_server_metadata_without_issuer_is_502(make_proxy: MakeProxy, upstream: Upstream) -> None:
    upstream.docs[ASM] = doc({"authorization_endpoint": "https://a/authorize"})
    proxy = await make_proxy()
    with capture_logs() as logs:
        async with asyncio.timeout(WAIT):
            status, body, _ = await proxy.get(ASM)
    assert status == 502 and body["error"] == "invalid_metadata" and "issuer" in body["error_description"]
    assert any(e["event"] == "oauth_metadata_invalid" for e in logs)


# ---------------------------------------------------------------- resource_server mode


async def test_resource_server_serves_its_own_document(make_proxy: MakeProxy, upstream: Upstream) -> None:
    upstream.docs[PRM_MCP] = doc(upstream_document(upstream))
    issuers = [upstream.origin + "/tenant", "https://other.example.com"]
    proxy = await make_proxy(
        **{"auth.mode": "resource_server", "auth.issuers": issuers, "auth.required_scopes": ["mcp"]}
    )
    async with asyncio.timeout(WAIT):
        for path in (PRM_MCP, PRM):
            status, body, _ = await proxy.get(path)
            assert status == 200
            assert body == {
                "resource": proxy.resource,
                "authorization_servers": issuers,
                "bearer_methods_supported": ["header"],
                "scopes_supported": ["mcp"],
            }
    assert upstream.hits == {}  # the upstream's own metadata is not the proxy's


async def test_resource_server_serves_the_first_issuers_metadata_found_by_path_insertion_then_oidc(
    make_proxy: MakeProxy, upstream: Upstream
) -> None:
    issuer = upstream.origin + "/tenant"
    metadata = {"issuer": issuer, "jwks_uri": issuer + "/jwks", "token_endpoint": issuer + "/token"}
    upstream.docs[OIDC + "/tenant"] = doc(metadata)
    proxy = await make_proxy(**{"auth.mode": "resource_server", "auth.issuers": [issuer]})
    async with asyncio.timeout(WAIT):
        for path in (ASM, OIDC, ASM + "/mcp"):
            status, body, _ = await proxy.get(path)
            assert (status, body) == (200, metadata), path
        status, _, _ = await proxy.get(ASM + "/elsewhere")
        assert status == 404
    assert upstream.hits == {ASM + "/tenant": 1, OIDC + "/tenant": 1}


async def test_issuer_metadata_is_there_for_the_token_verifier(make_proxy: MakeProxy, upstream: Upstream) -> None:
    """What finds the issuer's `jwks_uri` (auth.jwks_url unset) shares the fetch and the cache."""
    issuer = upstream.origin
    metadata = {"issuer": issuer + "/", "jwks_uri": issuer + "/jwks"}
    upstream.docs[ASM] = doc(metadata, "max-age=60")
    proxy = await make_proxy(**{"auth.issuers": [issuer]})
    async with asyncio.timeout(WAIT):
        assert await proxy.app[DISCOVERY].issuer_metadata(issuer) == metadata
        assert await proxy.app[DISCOVERY].issuer_metadata(issuer) == metadata
        with pytest.raises(MetadataError) as absent:
            await proxy.app[DISCOVERY].issuer_metadata(issuer + "/elsewhere")
    assert absent.value.status == 404
    assert upstream.hits[ASM] == 1


async def test_resource_server_refuses_metadata_naming_another_issuer(
    make_proxy: MakeProxy, upstream: Upstream
) -> None:
    upstream.docs[ASM] = doc({"issuer": "https://impostor.example.com"})
    proxy = await make_proxy(**{"auth.mode": "resource_server", "auth.issuers": [upstream.origin + "/"]})
    async with asyncio.timeout(WAIT):
        status, body, _ = await proxy.get(ASM)
    assert status == 502 and "impostor" in body["error_description"]


# ---------------------------------------------------------------- challenges


def modern_tools_call(proxy: Proxy) -> Any:
    return ModernClient(proxy.client).send("tools/call", {"name": "t", "arguments": {}})


async def legacy_initialize(proxy: Proxy) -> Any:
    return await proxy.client.post("/mcp", json=initialize_message(), headers={"Accept": ACCEPT})


async def legacy_batch(proxy: Proxy) -> Any:
    peer = await LegacyClient.connect(proxy.client, "2025-03-26")
    batch = [{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, {"jsonrpc": "2.0", "id": 2, "method": "prompts/list"}]
    return await peer.post(batch)


CLIENTS = {
    # (client, upstream era): what the upstream refused
    ("legacy", "legacy"): ("initialize", legacy_initialize),
    ("legacy batch", "legacy"): (["tools/list", "prompts/list"], legacy_batch),
    ("legacy", "modern"): ("server/discover", legacy_initialize),
    ("modern", "modern"): ("tools/call", None),
    ("modern", "legacy"): ("initialize", None),
}


@pytest.mark.parametrize("client, era", sorted(CLIENTS))
async def test_every_relayed_challenge_names_the_proxys_metadata(
    make_proxy: MakeProxy, upstream: Upstream, client: str, era: str
) -> None:
    refused_method, send = CLIENTS[(client, era)]
    upstream.session_allowed = client == "legacy batch"
    proxy = await make_proxy(era=era)
    async with asyncio.timeout(WAIT):
        if send is None:
            _, response = await modern_tools_call(proxy)
        else:
            response = await send(proxy)
        await response.read()
    assert response.status == 401, await response.text()
    assert upstream.methods[-1] == refused_method
    assert response.headers.getall("WWW-Authenticate") == [challenge.rewrite(upstream.challenge(), proxy.metadata)]
    assert f'resource_metadata="{proxy.metadata}"' in response.headers["WWW-Authenticate"]
    assert upstream.origin not in response.headers["WWW-Authenticate"]
