"""Who the caller is (proxy/auth/identity.py): identity header, verified (issuer, subject), hash."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request

from proxy.auth.identity import SUBJECT_PREFIX, Identifier, bearer_token, unverified_claims
from proxy.auth.tokens import TokenVerifier
from proxy.config import Settings, load_settings
from proxy.errors import ProxyError
from proxy.metrics import Metrics
from proxy.state.sessions import principal_of
from tests.support.jwt_issuer import JwtIssuer

HOST = "proxy.example:8080"
RESOURCE = f"http://{HOST}/mcp"  # what the request names: the default audience
METADATA = f"http://{HOST}/.well-known/oauth-protected-resource/mcp"


@pytest.fixture
async def issuer(aiohttp_server: Any) -> JwtIssuer:
    issuer = JwtIssuer()
    server = await aiohttp_server(issuer.app)
    issuer.url = str(server.make_url("")).rstrip("/")
    return issuer


def settings_for(issuer: JwtIssuer | None, **overrides: Any) -> Settings:
    auth = {"auth.issuers": [issuer.issuer], "auth.jwks_url": issuer.jwks_url} if issuer else {}
    return load_settings(None, **{"upstream.url": "http://127.0.0.1:9/mcp", **auth, **overrides})


@pytest.fixture
async def make() -> AsyncIterator[Any]:
    verifiers: list[TokenVerifier] = []

    def build(settings: Settings) -> Identifier:
        verifier = TokenVerifier(settings.auth) if settings.auth.issuers else None
        if verifier is not None:
            verifiers.append(verifier)
        return Identifier(settings, verifier)

    yield build
    for verifier in verifiers:
        await verifier.close()


def request(authorization: str | None = None, **headers: str) -> Any:
    all_headers = {"Host": HOST, **headers}
    if authorization is not None:
        all_headers["Authorization"] = authorization
    return make_mocked_request("POST", "/mcp", headers=all_headers)


async def refusal(identifier: Identifier, req: Any) -> ProxyError:
    with pytest.raises(ProxyError) as caught:
        await identifier.identify(req)
    return caught.value


def test_bearer_token() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer   abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None


async def test_a_refreshed_token_of_the_same_subject_is_the_same_caller(issuer: JwtIssuer, make: Any) -> None:
    identifier = make(settings_for(issuer))
    first = await identifier.identify(request("Bearer " + issuer.mint(aud=RESOURCE)))
    refreshed = await identifier.identify(request("Bearer " + issuer.mint(aud=RESOURCE, kid="ec-1")))
    other = await identifier.identify(request("Bearer " + issuer.mint(aud=RESOURCE, sub="bob")))
    assert first.principal == refreshed.principal != other.principal
    assert first.principal.startswith(SUBJECT_PREFIX)
    assert first.token is not None and first.token.subject == "alice"


async def test_the_client_is_part_of_the_caller_when_configured(issuer: JwtIssuer, make: Any) -> None:
    plain = make(settings_for(issuer))
    with_client = make(settings_for(issuer, **{"auth.client_in_identity": True}))
    a, b = issuer.mint(aud=RESOURCE, client_id="app-a"), issuer.mint(aud=RESOURCE, client_id="app-b")
    assert (await plain.identify(request("Bearer " + a))).principal == (
        await plain.identify(request("Bearer " + b))
    ).principal
    assert (await with_client.identify(request("Bearer " + a))).principal != (
        await with_client.identify(request("Bearer " + b))
    ).principal


async def test_opaque_tokens_and_foreign_jwts_keep_the_header_hash(issuer: JwtIssuer, make: Any) -> None:
    identifier = make(settings_for(issuer))
    for header in ("Bearer opaque-token", "Bearer " + issuer.mint(aud=RESOURCE, iss="https://other-as.example")):
        identity = await identifier.identify(request(header))
        assert identity.principal == principal_of(header) and identity.token is None
    assert (await identifier.identify(request())).principal == ""
    assert issuer.jwks_fetches == 0  # nothing of ours to verify


async def test_without_issuers_every_token_keeps_the_header_hash(issuer: JwtIssuer, make: Any) -> None:
    header = "Bearer " + issuer.mint(aud=RESOURCE)
    assert (await make(settings_for(None)).identify(request(header))).principal == principal_of(header)


async def test_the_identity_header_wins_over_the_token(issuer: JwtIssuer, make: Any) -> None:
    identifier = make(settings_for(issuer, **{"security.identity_header": "X-User"}))
    identity = await identifier.identify(request("Bearer " + issuer.mint(aud=RESOURCE), **{"X-User": "carol"}))
    assert identity.principal == principal_of("carol")


@pytest.mark.parametrize(
    ("claims", "description"),
    [
        ({"lifetime_s": -120}, "the token expired"),
        ({"aud": "https://elsewhere.example/mcp"}, f"the token's audience is not {RESOURCE}"),
        ({"kid": "rsa-1", "key": "forged"}, "the token's signature does not verify"),
    ],
)
async def test_in_passthrough_a_bad_token_of_a_configured_issuer_is_refused_with_a_challenge(
    issuer: JwtIssuer, make: Any, claims: dict[str, Any], description: str
) -> None:
    claims = {"aud": RESOURCE, **claims}
    if claims.get("key") == "forged":
        claims["key"] = issuer.other_rsa
    error = await refusal(make(settings_for(issuer)), request("Bearer " + issuer.mint(**claims)))
    assert error.status == 401
    assert error.headers["WWW-Authenticate"] == (
        f'Bearer error="invalid_token", error_description="{description}", resource_metadata="{METADATA}"'
    )


async def test_the_configured_audience_and_public_url_decide_the_audience(issuer: JwtIssuer, make: Any) -> None:
    public = make(settings_for(issuer, **{"auth.public_url": "https://mcp.example.com/mcp"}))
    await public.identify(request("Bearer " + issuer.mint(aud="https://mcp.example.com/mcp")))
    error = await refusal(public, request("Bearer " + issuer.mint(aud=RESOURCE)))
    assert (
        'resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/mcp"'
        in (error.headers["WWW-Authenticate"])
    )
    audience = make(settings_for(issuer, **{"auth.audience": "api://mcp"}))
    await audience.identify(request("Bearer " + issuer.mint(aud="api://mcp")))


async def test_resource_server_refuses_a_request_without_a_token(issuer: JwtIssuer, make: Any) -> None:
    identifier = make(settings_for(issuer, **{"auth.mode": "resource_server"}))
    for req in (request(), request("Basic dXNlcjpwYXNz"), request("Bearer opaque")):
        error = await refusal(identifier, req)
        assert error.status == 401
        header = error.headers["WWW-Authenticate"]
        if req.headers.get("Authorization") == "Bearer opaque":
            assert 'error="invalid_token"' in header
        else:
            assert header == f'Bearer resource_metadata="{METADATA}"'  # RFC 6750 §3.1: no error code


async def test_resource_server_wants_the_required_scopes(issuer: JwtIssuer, make: Any) -> None:
    identifier = make(
        settings_for(issuer, **{"auth.mode": "resource_server", "auth.required_scopes": ["mcp:tools", "mcp:read"]})
    )
    error = await refusal(identifier, request("Bearer " + issuer.mint(aud=RESOURCE, scope="mcp:read")))
    assert error.status == 403
    assert error.headers["WWW-Authenticate"] == (
        'Bearer error="insufficient_scope", error_description="the token lacks the scopes mcp:tools", '
        f'scope="mcp:read mcp:tools", resource_metadata="{METADATA}"'
    )
    ok = await identifier.identify(request("Bearer " + issuer.mint(aud=RESOURCE, scope="mcp:read mcp:tools x")))
    assert ok.token is not None


async def test_keys_unavailable_is_a_503_not_a_401(issuer: JwtIssuer, make: Any) -> None:
    issuer.down = True
    for mode in ("passthrough", "resource_server"):
        identifier = make(settings_for(issuer, **{"auth.mode": mode}))
        error = await refusal(identifier, request("Bearer " + issuer.mint(aud=RESOURCE)))
        assert error.status == 503 and "WWW-Authenticate" not in error.headers


async def test_each_check_is_counted_by_result(issuer: JwtIssuer) -> None:
    metrics = Metrics()
    settings = settings_for(issuer, **{"auth.mode": "resource_server", "auth.required_scopes": ["mcp:tools"]})
    verifier = TokenVerifier(settings.auth)
    identifier = Identifier(settings, verifier, metrics=metrics)
    token = issuer.mint(aud=RESOURCE, scope="mcp:tools")
    try:
        await identifier.identify(request("Bearer " + token))  # verified
        await identifier.identify(request("Bearer " + token))  # cached
        await refusal(identifier, request("Bearer " + issuer.mint(aud="https://elsewhere/mcp")))  # invalid
        await refusal(identifier, request())  # missing
        await refusal(identifier, request("Bearer " + issuer.mint(aud=RESOURCE, scope="other")))  # scope
    finally:
        await verifier.close()

    def count(result: str) -> float:
        return metrics.registry.get_sample_value("mcp_era_proxy_token_checks_total", {"result": result}) or 0.0

    # The scope refusal's token was verified first: two signatures checked.
    assert [count(r) for r in ("verified", "cached", "invalid", "missing", "insufficient_scope")] == [2, 1, 1, 1, 1]
    assert count("keys_unavailable") == 0


@pytest.mark.parametrize(
    ("overrides", "headers"),
    [
        ({}, {}),
        ({}, {"authorization": "Bearer opaque"}),
        ({}, {"authorization": ""}),
        ({"security.identity_header": "X-User"}, {"X-User": "carol", "authorization": "Bearer opaque"}),
        ({"security.identity_header": "X-User"}, {"authorization": "Bearer opaque"}),
    ],
)
async def test_without_a_verifier_the_identity_is_known_without_awaiting(
    make: Any, overrides: dict[str, str], headers: dict[str, str]
) -> None:
    identifier = make(settings_for(None, **overrides))
    authorization = headers.pop("authorization", None)
    req = request(authorization, **headers)
    assert identifier.unverified(req) == await identifier.identify(req)


async def test_with_a_verifier_or_as_resource_server_the_identity_is_awaited(issuer: JwtIssuer, make: Any) -> None:
    assert make(settings_for(issuer)).unverified(request()) is None
    assert make(settings_for(issuer, **{"auth.mode": "resource_server"})).unverified(request("Bearer x")) is None


def test_unverified_claims_only_of_a_jws_shape() -> None:
    assert unverified_claims("opaque-token") is None
    assert unverified_claims("a.b.c") is None
    body = base64.urlsafe_b64encode(b'{"iss":"x"}').rstrip(b"=").decode()
    assert unverified_claims(f"h.{body}.s") == {"iss": "x"}
    listed = base64.urlsafe_b64encode(b"[1]").rstrip(b"=").decode()
    assert unverified_claims(f"h.{listed}.s") is None
