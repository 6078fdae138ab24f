"""OAuth 2.1 authorization server for the e2e tests, on the `mcp` SDK's own auth server routes.

`mcp.server.auth.routes.create_auth_routes` serves the metadata (RFC 8414), /authorize, /token and
dynamic client registration (RFC 7591) and enforces PKCE (S256); the provider here is ours:

* authorize auto-approves: the redirect to redirect_uri carries the code and state at once;
* access tokens are RS256 JWTs signed with a key generated at start: iss = the issuer URL,
  sub = --user, aud = the `resource` the client asked for (RFC 8707), client_id, scope, iat, exp =
  now + --ttl, jti; refresh tokens are opaque and rotated;
* the metadata carries `jwks_uri`; GET /jwks serves the public key;
* POST /test/mint {sub, aud, ttl, client_id, scope, kid, iss, forged} (test only, loopback only)
  signs any token the tests need: expired (ttl < 0), wrong audience, another subject; with
  `forged: true` it is signed by another key under the same kid.

Run with an interpreter that has mcp (1.30 or 2.3) and PyJWT::

    python oauth_server.py --port PORT [--user alice] [--ttl 3600]

Prints ``READY <issuer>`` at start. The issuer is ``http://127.0.0.1:PORT/`` (the SDK
renders an origin-only issuer with its trailing slash; tokens carry exactly that `iss`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import secrets
import sys
import time
from typing import Any

logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

import jwt  # noqa: E402
import uvicorn  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: E402
from mcp.server.auth.provider import (  # noqa: E402
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.routes import build_metadata, create_auth_routes  # noqa: E402
from mcp.server.auth.settings import ClientRegistrationOptions, RevocationOptions  # noqa: E402
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken  # noqa: E402
from pydantic import AnyHttpUrl  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

HOST = "127.0.0.1"
SCOPES = ["mcp"]
KID = "e2e-key-1"


class Keys:
    """The signing key (its public half in the JWKS) and a second one for forged tokens."""

    def __init__(self) -> None:
        self.signing = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.forger = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwks(self) -> dict[str, Any]:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.signing.public_key()))
        return {"keys": [{**jwk, "kid": KID, "use": "sig", "alg": "RS256"}]}


class Provider:
    """In-memory OAuthAuthorizationServerProvider: auto-approving, JWT access tokens."""

    def __init__(self, issuer: str, user: str, ttl: int, keys: Keys) -> None:
        self.issuer = issuer
        self.user = user
        self.ttl = ttl
        self.keys = keys
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.refresh_tokens: dict[str, RefreshToken] = {}
        self.issued: dict[str, int] = {"authorization_code": 0, "refresh_token": 0}

    def sign(self, claims: dict[str, Any], *, forged: bool = False, kid: str = KID) -> str:
        key = self.keys.forger if forged else self.keys.signing
        return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})

    def access_token(
        self, *, sub: str, aud: str | None, client_id: str, scopes: list[str], ttl: int, iss: str | None = None
    ) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": iss or self.issuer,
            "sub": sub,
            "client_id": client_id,
            "scope": " ".join(scopes),
            "iat": now,
            "exp": now + ttl,
            "jti": secrets.token_hex(8),
        }
        if aud is not None:
            claims["aud"] = aud
        return self.sign(claims)

    def _tokens(self, client_id: str, scopes: list[str], resource: str | None, subject: str) -> OAuthToken:
        refresh = secrets.token_urlsafe(32)
        self.refresh_tokens[refresh] = RefreshToken(
            token=refresh, client_id=client_id, scopes=scopes, resource=resource, subject=subject
        )
        access = self.access_token(sub=subject, aud=resource, client_id=client_id, scopes=scopes, ttl=self.ttl)
        return OAuthToken(
            access_token=access, token_type="Bearer", expires_in=self.ttl, refresh_token=refresh, scope=" ".join(scopes)
        )

    # ---- OAuthAuthorizationServerProvider
    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        assert client_info.client_id is not None
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        code = secrets.token_urlsafe(32)
        assert client.client_id is not None
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or SCOPES,
            expires_at=time.time() + 300,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
            subject=self.user,
        )
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> AuthorizationCode | None:
        return self.codes.get(authorization_code)

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        self.codes.pop(authorization_code.code, None)
        self.issued["authorization_code"] += 1
        return self._tokens(
            authorization_code.client_id,
            authorization_code.scopes,
            authorization_code.resource,
            authorization_code.subject or self.user,
        )

    async def load_refresh_token(self, client: OAuthClientInformationFull, refresh_token: str) -> RefreshToken | None:
        token = self.refresh_tokens.get(refresh_token)
        return token if token is not None and token.client_id == client.client_id else None

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        self.refresh_tokens.pop(refresh_token.token, None)  # rotated
        self.issued["refresh_token"] += 1
        return self._tokens(
            refresh_token.client_id,
            scopes or refresh_token.scopes,
            refresh_token.resource,
            refresh_token.subject or self.user,
        )

    async def load_access_token(self, token: str) -> AccessToken | None:
        try:
            claims = jwt.decode(
                token, self.keys.signing.public_key(), algorithms=["RS256"], options={"verify_aud": False}
            )
        except jwt.PyJWTError:
            return None
        return AccessToken(
            token=token,
            client_id=claims.get("client_id", ""),
            scopes=str(claims.get("scope", "")).split(),
            expires_at=claims.get("exp"),
            subject=claims.get("sub"),
        )

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        if isinstance(token, RefreshToken):
            self.refresh_tokens.pop(token.token, None)


def build_app(port: int, user: str, ttl: int) -> Starlette:
    issuer_url = AnyHttpUrl(f"http://{HOST}:{port}")
    issuer = str(issuer_url)
    keys = Keys()
    provider = Provider(issuer, user, ttl, keys)
    registration = ClientRegistrationOptions(enabled=True, valid_scopes=SCOPES, default_scopes=SCOPES)
    revocation = RevocationOptions(enabled=False)
    jwks_uri = f"{issuer.rstrip('/')}/jwks"
    # The SDK's metadata model has no jwks_uri (its own servers verify by introspection), so the
    # metadata route is ours: the SDK's document plus the key set's address.
    metadata = {
        **build_metadata(issuer_url, None, registration, revocation).model_dump(mode="json", exclude_none=True),
        "jwks_uri": jwks_uri,
    }

    async def metadata_route(request: Request) -> Response:
        return JSONResponse(metadata, headers={"Cache-Control": "public, max-age=300"})

    async def jwks_route(request: Request) -> Response:
        return JSONResponse(keys.jwks(), headers={"Cache-Control": "public, max-age=300"})

    async def mint_route(request: Request) -> Response:
        if request.client is None or request.client.host != HOST:
            return JSONResponse({"error": "loopback only"}, status_code=403)
        spec = await request.json()
        claims = {
            "iss": spec.get("iss", issuer),
            "sub": spec.get("sub", user),
            "client_id": spec.get("client_id", "e2e-minted"),
            "scope": spec.get("scope", " ".join(SCOPES)),
            "iat": int(time.time()),
            "exp": int(time.time()) + int(spec.get("ttl", ttl)),
            "jti": secrets.token_hex(8),
        }
        if spec.get("aud") is not None:
            claims["aud"] = spec["aud"]
        token = provider.sign(claims, forged=bool(spec.get("forged")), kid=str(spec.get("kid", KID)))
        return JSONResponse({"access_token": token, "claims": claims})

    async def stats_route(request: Request) -> Response:
        return JSONResponse({"issued": provider.issued, "clients": len(provider.clients)})

    routes = [
        r
        for r in create_auth_routes(provider, issuer_url, None, registration, revocation)
        if getattr(r, "path", None) != "/.well-known/oauth-authorization-server"
    ]
    routes += [
        Route("/.well-known/oauth-authorization-server", metadata_route, methods=["GET"]),
        Route("/jwks", jwks_route, methods=["GET"]),
        Route("/test/mint", mint_route, methods=["POST"]),
        Route("/test/stats", stats_route, methods=["GET"]),
    ]
    return Starlette(routes=routes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--user", default="alice", help="the subject (`sub`) of every authorized token")
    parser.add_argument("--ttl", type=int, default=3600, help="access token lifetime in seconds")
    ns = parser.parse_args()
    config = uvicorn.Config(
        build_app(ns.port, ns.user, ns.ttl), host=HOST, port=ns.port, log_config=None, log_level="warning"
    )
    server = uvicorn.Server(config)
    print(f"READY http://{HOST}:{ns.port}/", flush=True)
    asyncio.run(server.serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
