"""JWT access-token verification (proxy/auth/tokens.py) against a JWKS served on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from proxy.auth import tokens
from proxy.auth.discovery import Discovery
from proxy.auth.identity import InvalidToken, KeysUnavailable
from proxy.auth.tokens import TokenVerifier, max_age, same_url
from proxy.config import AuthConfig, load_settings
from tests.integration.conftest import closed_port_url
from tests.support.jwt_issuer import JwtIssuer

AUD = "https://mcp.example.com/mcp"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def issuer(aiohttp_server: Any) -> JwtIssuer:
    issuer = JwtIssuer()
    server = await aiohttp_server(issuer.app)
    issuer.url = str(server.make_url("")).rstrip("/")
    return issuer


@pytest.fixture
def monotonic() -> Clock:
    return Clock()


def config(issuer: JwtIssuer, **fields: Any) -> AuthConfig:
    return AuthConfig(**{"issuers": [issuer.issuer], "jwks_url": issuer.jwks_url, **fields})


@pytest.fixture
async def verifier(issuer: JwtIssuer, monotonic: Clock) -> AsyncIterator[TokenVerifier]:
    verifier = TokenVerifier(config(issuer), monotonic=monotonic)
    yield verifier
    await verifier.close()


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


async def refused(verifier: TokenVerifier, token: str, audience: str = AUD) -> str:
    with pytest.raises(InvalidToken) as caught:
        await verifier.verify(token, audience)
    return str(caught.value)


# ------------------------------------------------------------ accepted


@pytest.mark.parametrize("kid", ["rsa-1", "ec-1", "ed-1"])
async def test_a_token_of_each_key_type_verifies(issuer: JwtIssuer, verifier: TokenVerifier, kid: str) -> None:
    token = issuer.mint(aud=AUD, kid=kid, client_id="app-1", scope="tools.read tools.call")
    verified = await verifier.verify(token, AUD)
    assert (verified.issuer, verified.subject, verified.client_id) == (issuer.issuer, "alice", "app-1")
    assert verified.scopes == {"tools.read", "tools.call"}


async def test_azp_names_the_client_when_client_id_is_absent(issuer: JwtIssuer, verifier: TokenVerifier) -> None:
    verified = await verifier.verify(issuer.mint(aud=AUD, azp="app-2"), AUD)
    assert verified.client_id == "app-2"
    assert (await verifier.verify(issuer.mint(aud=AUD), AUD)).client_id is None


async def test_scp_lists_are_scopes_too(issuer: JwtIssuer, verifier: TokenVerifier) -> None:
    assert (await verifier.verify(issuer.mint(aud=AUD, scp=["a", "b"]), AUD)).scopes == {"a", "b"}


async def test_an_audience_list_holding_ours_and_a_trailing_slash_are_accepted(
    issuer: JwtIssuer, verifier: TokenVerifier
) -> None:
    await verifier.verify(issuer.mint(aud=["https://other.example", AUD]), AUD)
    await verifier.verify(issuer.mint(aud=AUD + "/"), AUD)


async def test_an_issuer_differing_only_by_a_trailing_slash_is_the_issuer(
    issuer: JwtIssuer, verifier: TokenVerifier
) -> None:
    verified = await verifier.verify(issuer.mint(aud=AUD, iss=issuer.issuer + "/"), AUD)
    assert verified.issuer == issuer.issuer  # as configured: one issuer, one identity


async def test_expiry_within_the_leeway_is_accepted(issuer: JwtIssuer, verifier: TokenVerifier) -> None:
    await verifier.verify(issuer.mint(aud=AUD, lifetime_s=-10), AUD)  # leeway 30 s


# ------------------------------------------------------------ refused


async def test_an_expired_token_is_refused(issuer: JwtIssuer, verifier: TokenVerifier) -> None:
    assert await refused(verifier, issuer.mint(aud=AUD, lifetime_s=-120)) == "the token expired"


async def test_a_token_not_yet_valid_is_refused(issuer: JwtIssuer, verifier: TokenVerifier) -> None:
    token = issuer.mint(aud=AUD, nbf=int(time.time()) + 600)
    assert await refused(verifier, token) == "the token is not valid yet"


async def test_a_token_for_another_audience_is_refused(issuer: JwtIssuer, verifier: TokenVerifier) -> None:
    reason = await refused(verifier, issuer.mint(aud="https://other.example/mcp"))
    assert reason == f"the token's audience is not {AUD}"
    assert await refused(verifier, issuer.mint(aud=None)) == "the token has no aud claim"


async def test_a_token_of_an_issuer_not_configured_is_refused(issuer: JwtIssuer, verifier: TokenVerifier) -> None:
    assert "issuer is not trusted" in await refused(verifier, issuer.mint(aud=AUD, iss="https://evil.example"))


async def test_a_forged_signature_is_refused(issuer: JwtIssuer, verifier: TokenVerifier) -> None:
    forged = issuer.mint(aud=AUD, key=issuer.other_rsa)  # kid rsa-1, another key
    assert await refused(verifier, forged) == "the token's signature does not verify"
    good = issuer.mint(aud=AUD)
    head, payload, signature = good.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["sub"] = "mallory"
    altered = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    assert await refused(verifier, f"{head}.{altered}.{signature}") == "the token's signature does not verify"


async def test_hs256_signed_with_the_public_key_is_refused(issuer: JwtIssuer, verifier: TokenVerifier) -> None:
    """The classic algorithm confusion (RFC 8725 §2.1): the public key used as an HMAC secret."""
    payload = {"iss": issuer.issuer, "sub": "alice", "aud": AUD, "exp": int(time.time()) + 300}
    token = issuer.hs256_with_public_key(payload)
    assert await refused(verifier, token) == "the token's algorithm 'HS256' is not accepted"


async def test_alg_none_is_refused(issuer: JwtIssuer, verifier: TokenVerifier) -> None:
    payload = {"iss": issuer.issuer, "sub": "alice", "aud": AUD, "exp": int(time.time()) + 300}
    token = jwt.encode(payload, None, algorithm="none")
    assert await refused(verifier, token) == "the token's algorithm 'none' is not accepted"


async def test_an_algorithm_the_key_cannot_carry_is_refused(issuer: JwtIssuer, verifier: TokenVerifier) -> None:
    """An ES256 token naming the RSA key's kid: the key's kty does not fit the algorithm."""
    token = issuer.mint(aud=AUD, kid="rsa-1", key=issuer.ec, alg="ES256")
    assert "key id is not among" in await refused(verifier, token)


async def test_an_algorithm_not_configured_is_refused(issuer: JwtIssuer, monotonic: Clock) -> None:
    verifier = TokenVerifier(config(issuer, algorithms=["ES256"]), monotonic=monotonic)
    try:
        assert "'RS256' is not accepted" in await refused(verifier, issuer.mint(aud=AUD))
    finally:
        await verifier.close()


@pytest.mark.parametrize(
    ("claim", "reason"), [("sub", "the token has no sub claim"), ("exp", "the token has no exp claim")]
)
async def test_a_token_without_a_required_claim_is_refused(
    issuer: JwtIssuer, verifier: TokenVerifier, claim: str, reason: str
) -> None:
    token = issuer.mint(aud=AUD, sub=None) if claim == "sub" else issuer.mint(aud=AUD, exp=None)
    assert await refused(verifier, token) == reason


async def test_an_empty_subject_is_refused(issuer: JwtIssuer, verifier: TokenVerifier) -> None:
    assert await refused(verifier, issuer.mint(aud=AUD, sub="")) == "the token has no subject"


@pytest.mark.parametrize("token", ["opaque", "a.b.c", "x" * 40 + ".." + "y", "eyJhbGciOiJSUzI1NiJ9.e30"])
async def test_what_is_not_a_jwt_is_refused_as_malformed(verifier: TokenVerifier, token: str) -> None:
    assert "well-formed" in await refused(verifier, token) or "algorithm" in await refused(verifier, token)


# ------------------------------------------------------------ keys and caches


async def test_a_jwks_serves_many_tokens_with_one_fetch_and_verified_tokens_skip_the_signature(
    issuer: JwtIssuer, verifier: TokenVerifier, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded = 0
    real = jwt.decode

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal decoded
        decoded += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(tokens.jwt, "decode", counting)
    many = [issuer.mint(aud=AUD, sub=f"user-{i}") for i in range(5)]
    for token in many:
        await verifier.verify(token, AUD)
    assert issuer.jwks_fetches == 1 and decoded == 5
    for token in many * 3:
        await verifier.verify(token, AUD)
    assert decoded == 5  # a repeated token is a lookup
    with pytest.raises(InvalidToken):  # the cache is per audience: another one checks again
        await verifier.verify(many[0], "https://elsewhere.example/mcp")
    assert decoded == 6


async def test_a_cached_token_expires_with_the_token(issuer: JwtIssuer, aiohttp_server: Any) -> None:
    wall = Clock()
    wall.now = time.time()
    verifier = TokenVerifier(config(issuer), clock=wall)
    try:
        token = issuer.mint(aud=AUD, lifetime_s=60)
        await verifier.verify(token, AUD)
        assert verifier.cached(token, AUD) is not None
        wall.now += 60 + 30 + 1  # past exp and the leeway
        assert verifier.cached(token, AUD) is None
    finally:
        await verifier.close()


async def test_the_token_cache_is_bounded(
    issuer: JwtIssuer, verifier: TokenVerifier, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokens, "TOKEN_CACHE_MAX", 3)
    minted = [issuer.mint(aud=AUD, sub=f"u{i}") for i in range(5)]
    for token in minted:
        await verifier.verify(token, AUD)
    assert [verifier.cached(t, AUD) is not None for t in minted] == [False, False, True, True, True]


async def test_a_flood_of_unknown_kids_fetches_the_jwks_at_most_once_per_interval(
    issuer: JwtIssuer, verifier: TokenVerifier, monotonic: Clock
) -> None:
    await verifier.verify(issuer.mint(aud=AUD), AUD)
    assert issuer.jwks_fetches == 1
    monotonic.now += tokens.UNKNOWN_KID_REFETCH_S  # the first unknown kid may refetch
    flood = [issuer.mint(aud=AUD, kid=uuid.uuid4().hex, key=issuer.rsa) for _ in range(200)]
    results = await asyncio.gather(*(verifier.verify(t, AUD) for t in flood), return_exceptions=True)
    assert all(isinstance(r, InvalidToken) for r in results)
    for token in flood[:50]:  # and one after another, too
        await refused(verifier, token)
    assert issuer.jwks_fetches == 2
    monotonic.now += tokens.UNKNOWN_KID_REFETCH_S - 1
    await refused(verifier, flood[0])
    assert issuer.jwks_fetches == 2
    monotonic.now += 1
    await refused(verifier, flood[0])
    assert issuer.jwks_fetches == 3


async def test_a_rotated_key_is_found_by_refetching(
    issuer: JwtIssuer, verifier: TokenVerifier, monotonic: Clock
) -> None:
    await verifier.verify(issuer.mint(aud=AUD), AUD)
    rotated = ec.generate_private_key(ec.SECP256R1())
    issuer.keys["ec-2"] = rotated
    monotonic.now += tokens.UNKNOWN_KID_REFETCH_S
    verified = await verifier.verify(issuer.mint(aud=AUD, kid="ec-2", key=rotated), AUD)
    assert verified.subject == "alice" and issuer.jwks_fetches == 2


async def test_cold_concurrent_verifications_share_one_fetch(issuer: JwtIssuer, verifier: TokenVerifier) -> None:
    minted = [issuer.mint(aud=AUD, sub=f"u{i}") for i in range(20)]
    await asyncio.gather(*(verifier.verify(t, AUD) for t in minted))
    assert issuer.jwks_fetches == 1


async def test_the_jwks_is_refetched_after_its_max_age_bounded_by_the_config(
    issuer: JwtIssuer, monotonic: Clock
) -> None:
    issuer.cache_control = "public, max-age=60"
    verifier = TokenVerifier(config(issuer, metadata_max_age_s=300), monotonic=monotonic)
    try:
        await verifier.verify(issuer.mint(aud=AUD), AUD)
        monotonic.now += 59
        await verifier.verify(issuer.mint(aud=AUD), AUD)
        assert issuer.jwks_fetches == 1
        monotonic.now += 1
        await verifier.verify(issuer.mint(aud=AUD), AUD)
        assert issuer.jwks_fetches == 2
        issuer.cache_control = "max-age=86400"  # more than the bound: the bound wins
        monotonic.now += 60
        await verifier.verify(issuer.mint(aud=AUD), AUD)
        assert issuer.jwks_fetches == 3
        monotonic.now += 299
        await verifier.verify(issuer.mint(aud=AUD), AUD)
        assert issuer.jwks_fetches == 3
        monotonic.now += 1
        await verifier.verify(issuer.mint(aud=AUD), AUD)
        assert issuer.jwks_fetches == 4
    finally:
        await verifier.close()


async def test_an_unreachable_jwks_makes_keys_unavailable(issuer: JwtIssuer, verifier: TokenVerifier) -> None:
    issuer.down = True
    with pytest.raises(KeysUnavailable):
        await verifier.verify(issuer.mint(aud=AUD), AUD)


@pytest.mark.parametrize(
    "body", [b"not json", b"[1, 2]", b'{"keys": "none"}', b'{"keys": []}', b'{"pad": "' + b"x" * (1 << 20) + b'"}']
)
async def test_a_malformed_or_empty_jwks_verifies_nothing(
    issuer: JwtIssuer, verifier: TokenVerifier, body: bytes
) -> None:
    issuer.jwks_body = body
    # No keys at all is the issuer's outage (503), not the token's fault (401).
    with pytest.raises(KeysUnavailable):
        await verifier.verify(issuer.mint(aud=AUD), AUD)


async def test_a_caller_that_goes_away_leaves_the_fetch_to_the_others(
    issuer: JwtIssuer, verifier: TokenVerifier
) -> None:
    issuer.jwks_gate = asyncio.Event()
    first = asyncio.create_task(verifier.verify(issuer.mint(aud=AUD), AUD))
    second = asyncio.create_task(verifier.verify(issuer.mint(aud=AUD, sub="bob"), AUD))
    async with asyncio.timeout(5):
        await issuer.jwks_requested.wait()
    first.cancel()
    issuer.jwks_gate.set()
    async with asyncio.timeout(5):
        assert (await second).subject == "bob"
    with pytest.raises(asyncio.CancelledError):
        await first
    assert issuer.jwks_fetches == 1


async def test_a_closed_port_makes_keys_unavailable(issuer: JwtIssuer, monotonic: Clock) -> None:
    verifier = TokenVerifier(AuthConfig(issuers=[issuer.issuer], jwks_url=closed_port_url()), monotonic=monotonic)
    try:
        with pytest.raises(KeysUnavailable):
            await verifier.verify(issuer.mint(aud=AUD), AUD)
    finally:
        await verifier.close()


async def test_stale_keys_still_verify_while_the_jwks_is_down(
    issuer: JwtIssuer, verifier: TokenVerifier, monotonic: Clock
) -> None:
    await verifier.verify(issuer.mint(aud=AUD), AUD)
    issuer.down = True
    monotonic.now += 300 + 1  # past the default bound: stale
    await verifier.verify(issuer.mint(aud=AUD), AUD)
    assert issuer.jwks_fetches == 2  # it did try
    monotonic.now += tokens.STALE_KEYS_GRACE_S
    with pytest.raises(KeysUnavailable):
        await verifier.verify(issuer.mint(aud=AUD), AUD)


@pytest.fixture
async def discovered(aiohttp_server: Any, monotonic: Clock) -> AsyncIterator[Any]:
    """`await discovered(issuer)`: a verifier finding the issuer's JWKS through its metadata, which
    the proxy's Discovery fetches (as in the app)."""
    made: list[Any] = []

    async def build(issuer: JwtIssuer) -> TokenVerifier:
        server = await aiohttp_server(issuer.app)
        issuer.url = str(server.make_url("")).rstrip("/")
        settings = load_settings(None, **{"upstream.url": "http://127.0.0.1:9/mcp", "auth.issuers": [issuer.issuer]})
        discovery = Discovery(settings, lambda host: True)
        verifier = TokenVerifier(settings.auth, monotonic=monotonic, issuer_metadata=discovery.issuer_metadata)
        made.extend([verifier, discovery])
        return verifier

    yield build
    for closable in made:
        await closable.close()


async def test_keys_come_from_the_issuers_metadata_with_path_insertion(discovered: Any) -> None:
    issuer = JwtIssuer(path="/tenant-1")
    verifier = await discovered(issuer)
    await verifier.verify(issuer.mint(aud=AUD), AUD)
    await verifier.verify(issuer.mint(aud=AUD, sub="bob"), AUD)
    assert issuer.metadata_fetches == ["/.well-known/oauth-authorization-server/tenant-1"]
    assert issuer.jwks_fetches == 1


async def test_metadata_naming_another_issuer_is_not_used(discovered: Any) -> None:
    issuer = JwtIssuer()
    issuer.metadata_issuer = "https://impostor.example"
    verifier = await discovered(issuer)
    with pytest.raises(KeysUnavailable, match=r"names issuer 'https://impostor\.example'"):
        await verifier.verify(issuer.mint(aud=AUD), AUD)
    assert issuer.jwks_fetches == 0


async def test_metadata_without_a_jwks_uri_or_unreachable_makes_keys_unavailable(discovered: Any) -> None:
    issuer = JwtIssuer()
    verifier = await discovered(issuer)
    issuer.down = True
    with pytest.raises(KeysUnavailable, match="metadata cannot be had"):
        await verifier.verify(issuer.mint(aud=AUD), AUD)
    issuer.down = False
    issuer.jwks_in_metadata = False
    with pytest.raises(KeysUnavailable, match="no jwks_uri"):
        await verifier.verify(issuer.mint(aud=AUD), AUD)


# ------------------------------------------------------------ helpers


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, 300.0), ("max-age=60", 60.0), ("public, max-age=999", 300.0), ("no-store", 0.0), ("private", 300.0)],
)
def test_max_age(header: str | None, expected: float) -> None:
    assert max_age(header, 300.0) == expected


def test_same_url() -> None:
    assert same_url("https://a.example", "https://a.example/")
    assert not same_url("https://a.example", "https://a.example.evil")
