"""The pure parts of OAuth discovery (proxy/auth/discovery.py), the document cache, and the
endpoints where no upstream is needed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from proxy.auth import discovery
from proxy.auth.discovery import (
    Discovery,
    Document,
    DocumentCache,
    MetadataError,
    authorization_server_problem,
    cache_lifetime,
    derived_resource,
    issuer_candidates,
    named_metadata,
    protected_resource_problem,
    resource_candidates,
    with_resource,
)
from proxy.config import load_settings


@pytest.mark.parametrize(
    "header, expected",
    [
        (None, 300.0),
        ("", 300.0),
        ("max-age=60", 60.0),
        ("public, max-age=60", 60.0),
        ("Max-Age=60, must-revalidate", 60.0),
        ('max-age="60"', 60.0),
        ("max-age=86400", 300.0),
        ("max-age=0", 0.0),
        ("max-age=-5", 0.0),
        ("max-age=soon", 0.0),
        ("no-store", 0.0),
        ("max-age=60, no-store", 0.0),
        ("no-cache", 0.0),
        ("private", 300.0),
    ],
)
def test_cache_lifetime(header: str | None, expected: float) -> None:
    assert cache_lifetime(header, 300.0) == expected


@pytest.mark.parametrize(
    "scheme, host, expected",
    [
        ("http", "127.0.0.1:8080", "http://127.0.0.1:8080/mcp"),
        ("https", "mcp.example.com", "https://mcp.example.com/mcp"),
        ("http", "[::1]:9000", "http://[::1]:9000/mcp"),
        ("http", "localhost", "http://localhost/mcp"),
        ("http", None, None),
        ("http", "", None),
        ("http", 'evil"host', None),
        ("http", "a b", None),
        ("http", "host/path", None),
        ("http", "host:port", None),
        ("http", "user@host", None),
        ("http", "h" * 301, None),
    ],
)
def test_derived_resource_takes_only_a_host_and_port(scheme: str, host: str | None, expected: str | None) -> None:
    assert derived_resource(scheme, host, "/mcp") == expected


GOOD = {"resource": "https://u/mcp", "authorization_servers": ["https://as"]}


@pytest.mark.parametrize(
    "document, problem",
    [
        (GOOD, None),
        ({**GOOD, "x": 1}, None),
        ([GOOD], "is a JSON array, not an object"),
        ("text", "is a JSON string, not an object"),
        (None, "is a JSON null, not an object"),
        (3, "is a JSON number, not an object"),
        ({"authorization_servers": ["https://as"]}, "has no `resource` string"),
        ({**GOOD, "resource": ""}, "has no `resource` string"),
        ({**GOOD, "resource": ["https://u"]}, "has no `resource` string"),
        ({"resource": "https://u/mcp"}, "has no `authorization_servers` list of URLs"),
        ({**GOOD, "authorization_servers": []}, "has no `authorization_servers` list of URLs"),
        ({**GOOD, "authorization_servers": "https://as"}, "has no `authorization_servers` list of URLs"),
        ({**GOOD, "authorization_servers": [1]}, "has no `authorization_servers` list of URLs"),
    ],
)
def test_protected_resource_problem(document: Any, problem: str | None) -> None:
    assert protected_resource_problem(document) == problem


def test_authorization_server_problem() -> None:
    assert authorization_server_problem({"issuer": "https://as"}) is None
    assert authorization_server_problem({"issuer": ""}) == "has no `issuer` string"
    assert authorization_server_problem({"token_endpoint": "https://as/t"}) == "has no `issuer` string"
    assert authorization_server_problem([]) == "is a JSON array, not an object"


def test_with_resource_changes_only_resource_and_keeps_the_order() -> None:
    document = {"z": 1, "resource": "http://localhost:8000/mcp", "authorization_servers": ["a"], "x": {"y": [1]}}
    rewritten = with_resource(document, "https://mcp.example.com/mcp")
    assert rewritten == {**document, "resource": "https://mcp.example.com/mcp"}
    assert list(rewritten) == list(document)
    assert document["resource"] == "http://localhost:8000/mcp"  # the cached original is left alone


def test_resource_candidates_follow_the_clients_order() -> None:
    assert resource_candidates("http://u:8000/mcp", None) == [
        "http://u:8000/.well-known/oauth-protected-resource/mcp",
        "http://u:8000/.well-known/oauth-protected-resource",
    ]
    assert resource_candidates("http://u:8000/", None) == ["http://u:8000/.well-known/oauth-protected-resource"]
    assert resource_candidates("http://u:8000/mcp?x=1", "http://u:8000/meta") == [
        "http://u:8000/meta",
        "http://u:8000/.well-known/oauth-protected-resource/mcp",
        "http://u:8000/.well-known/oauth-protected-resource",
    ]
    named = "http://u:8000/.well-known/oauth-protected-resource"
    assert resource_candidates("http://u:8000/mcp", named)[0] == named
    assert len(resource_candidates("http://u:8000/mcp", named)) == 2


def test_issuer_candidates_are_path_insertion_then_oidc() -> None:
    assert issuer_candidates("https://as.example.com") == [
        "https://as.example.com/.well-known/oauth-authorization-server",
        "https://as.example.com/.well-known/openid-configuration",
    ]
    assert issuer_candidates("https://as.example.com/") == issuer_candidates("https://as.example.com")
    assert issuer_candidates("https://as.example.com/tenant1") == [
        "https://as.example.com/.well-known/oauth-authorization-server/tenant1",
        "https://as.example.com/.well-known/openid-configuration/tenant1",
        "https://as.example.com/tenant1/.well-known/openid-configuration",
    ]


@pytest.mark.parametrize(
    "header, named",
    [
        ('Bearer resource_metadata="http://u/.well-known/x"', "http://u/.well-known/x"),
        ('Bearer error="invalid_token", Resource_Metadata="https://u/m", scope="a b"', "https://u/m"),
        ("Bearer resource_metadata=http://u/m, scope=a", "http://u/m"),
        ('Bearer resource_metadata="http://u/a\\"b"', 'http://u/a"b'),
        ('Bearer resource_metadata="/relative"', None),
        ('Bearer resource_metadata="javascript:alert(1)"', None),
        ('Bearer resource_metadata="http://u/' + "x" * 3000 + '"', None),
        ('Bearer realm="mcp"', None),
        ("Basic realm=x", None),
    ],
)
def test_named_metadata(header: str, named: str | None) -> None:
    assert named_metadata(header) == named


# ---------------------------------------------------------------- the cache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_the_cache_keeps_a_document_until_it_expires() -> None:
    clock = Clock()
    cache = DocumentCache(clock)
    fetches: list[int] = []

    async def fetch() -> Document:
        fetches.append(1)
        return Document({"n": len(fetches)}, clock() + 10)

    assert (await cache.get(("k",), fetch)).body == {"n": 1}
    clock.now += 9.9
    assert (await cache.get(("k",), fetch)).body == {"n": 1}
    clock.now += 0.2
    assert (await cache.get(("k",), fetch)).body == {"n": 2}
    assert (await cache.get(("other",), fetch)).body == {"n": 3}


async def test_the_cache_keeps_neither_a_document_not_to_keep_nor_a_failure() -> None:
    clock = Clock()
    cache = DocumentCache(clock)
    outcomes: list[Document | MetadataError] = [
        Document({"n": 1}, 0.0),
        MetadataError(502, "invalid_metadata", "bad"),
        Document({"n": 3}, clock() + 10),
    ]

    async def fetch() -> Document:
        outcome = outcomes.pop(0)
        if isinstance(outcome, MetadataError):
            raise outcome
        return outcome

    assert (await cache.get(("k",), fetch)).body == {"n": 1}
    with pytest.raises(MetadataError):
        await cache.get(("k",), fetch)
    assert (await cache.get(("k",), fetch)).body == {"n": 3}
    assert (await cache.get(("k",), fetch)).body == {"n": 3}
    assert outcomes == []


async def test_the_cache_keeps_an_absence_for_its_time() -> None:
    clock = Clock()
    cache = DocumentCache(clock)
    calls: list[int] = []

    async def fetch() -> Document:
        calls.append(1)
        raise MetadataError(404, "not_found", "none", kept_s=5)

    for _ in range(2):
        with pytest.raises(MetadataError):
            await cache.get(("k",), fetch)
    assert calls == [1]
    clock.now += 5
    with pytest.raises(MetadataError):
        await cache.get(("k",), fetch)
    assert calls == [1, 1]


async def test_concurrent_misses_share_one_fetch_and_a_waiter_leaving_does_not_cancel_it() -> None:
    clock = Clock()
    cache = DocumentCache(clock)
    release = asyncio.Event()
    fetches: list[int] = []
    started = asyncio.Event()

    async def fetch() -> Document:
        fetches.append(1)
        started.set()
        await release.wait()
        return Document({"ok": True}, clock() + 10)

    async with asyncio.timeout(5):
        leaving = asyncio.ensure_future(cache.get(("k",), fetch))
        waiters = [asyncio.ensure_future(cache.get(("k",), fetch)) for _ in range(3)]
        await started.wait()
        leaving.cancel()
        release.set()
        results = await asyncio.gather(*waiters)
    assert [r.body for r in results] == [{"ok": True}] * 3 and fetches == [1]
    assert leaving.cancelled()


async def test_failure_reaches_every_waiter_of_the_flight() -> None:
    cache = DocumentCache(Clock())
    release = asyncio.Event()

    async def fetch() -> Document:
        await release.wait()
        raise MetadataError(504, "temporarily_unavailable", "slow")

    async with asyncio.timeout(5):
        waiters = [asyncio.ensure_future(cache.get(("k",), fetch)) for _ in range(2)]
        await asyncio.sleep(0)
        release.set()
        results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, MetadataError) and r.status == 504 for r in results)


# ---------------------------------------------------------------- endpoints without an upstream


def stdio_discovery(**overrides: Any) -> Discovery:
    settings = load_settings(None, **{"upstream.command": ["mcp-server"], **overrides})
    return Discovery(settings, lambda host: True)


def request(path: str, tail: str = "", method: str = "GET") -> Any:
    return make_mocked_request(method, path, headers={"Host": "127.0.0.1:9000"}, match_info={"tail": tail})


async def test_a_stdio_upstream_has_no_metadata() -> None:
    found = stdio_discovery()
    for handler, path, tail in (
        (found.protected_resource, "/.well-known/oauth-protected-resource/mcp", "/mcp"),
        (found.authorization_server, "/.well-known/oauth-authorization-server", ""),
    ):
        response = await handler(request(path, tail))
        assert response.status == 404
        assert json.loads(response.body)["error"] == "not_found"
    await found.close()


async def test_resource_server_mode_needs_no_upstream_for_its_own_document() -> None:
    found = stdio_discovery(**{"auth.mode": "resource_server", "auth.issuers": ["https://as.example.com"]})
    response = await found.protected_resource(request("/.well-known/oauth-protected-resource"))
    assert response.status == 200
    assert json.loads(response.body) == {
        "resource": "http://127.0.0.1:9000/mcp",
        "authorization_servers": ["https://as.example.com"],
        "bearer_methods_supported": ["header"],
    }
    assert response.headers["Cache-Control"] == "max-age=300"
    await found.close()


async def test_a_host_that_is_no_host_is_400() -> None:
    found = stdio_discovery(**{"auth.mode": "resource_server", "auth.issuers": ["https://as.example.com"]})
    bad = make_mocked_request("GET", "/.well-known/oauth-protected-resource", headers={"Host": 'x"y'})
    response = await found.protected_resource(bad)
    assert response.status == 400 and json.loads(response.body)["error"] == "invalid_request"
    await found.close()


async def test_a_challenge_is_rewritten_only_when_present() -> None:
    found = stdio_discovery()
    req = request("/mcp")

    class Response:
        status = 401
        headers: Any = None

    plain = Response()
    plain.headers = CIMultiDict({"Content-Type": "application/json"})
    await found.on_response_prepare(req, plain)  # type: ignore[arg-type]
    assert dict(plain.headers) == {"Content-Type": "application/json"}
    two = Response()
    two.headers = CIMultiDict([("WWW-Authenticate", 'Basic realm="x"'), ("WWW-Authenticate", "Bearer")])
    await found.on_response_prepare(req, two)  # type: ignore[arg-type]
    metadata = "http://127.0.0.1:9000/.well-known/oauth-protected-resource/mcp"
    assert two.headers.getall("WWW-Authenticate") == ['Basic realm="x"', f'Bearer resource_metadata="{metadata}"']
    assert found._named is None  # the proxy's own URL is never remembered as the upstream's
    selfish = Response()
    selfish.headers = CIMultiDict({"WWW-Authenticate": 'Bearer resource_metadata="http://127.0.0.1:9000/x"'})
    await found.on_response_prepare(req, selfish)  # type: ignore[arg-type]
    assert found._named is None  # nor anything else on the proxy's origin
    upstream = Response()
    upstream.headers = CIMultiDict({"WWW-Authenticate": 'Bearer resource_metadata="http://10.0.0.9:3000/m"'})
    await found.on_response_prepare(req, upstream)  # type: ignore[arg-type]
    assert found._named == "http://10.0.0.9:3000/m"
    assert upstream.headers["WWW-Authenticate"] == f'Bearer resource_metadata="{metadata}"'
    await found.close()


def test_the_module_names_its_well_known_paths() -> None:
    assert discovery.WELL_KNOWN_RESOURCE == "/.well-known/oauth-protected-resource"
    assert discovery.WELL_KNOWN_AUTHORIZATION_SERVER == "/.well-known/oauth-authorization-server"
    assert discovery.WELL_KNOWN_OPENID == "/.well-known/openid-configuration"
