"""Shared by the OAuth-protected e2e servers (mcp 1.30 and 2.3): a JWT TokenVerifier and the switches.

The verifier checks what a resource server must (MCP authorization, "Token Handling"; RFC 8707):
the signature against the authorization server's JWKS, `iss`, `exp` and that `aud` names a
resource it accepts, its own URL and whatever OAUTH_PEER_AUDIENCES (comma-separated) adds (the
proxy's public URL when the proxy fronts this server with the same tokens).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import anyio
import jwt
from mcp.server.auth.provider import AccessToken

logger = logging.getLogger("oauth-peer")


def accepted_audiences(own_url: str) -> list[str]:
    extra = [a.strip() for a in os.environ.get("OAUTH_PEER_AUDIENCES", "").split(",") if a.strip()]
    return [own_url, *extra]


class JwtVerifier:
    def __init__(self, issuer: str, jwks_url: str, audiences: list[str]) -> None:
        self.issuer = issuer
        self.audiences = audiences
        self._jwks = jwt.PyJWKClient(jwks_url, cache_keys=True, lifespan=300)

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            # PyJWKClient fetches with urllib (blocking): off the event loop.
            key = await anyio.to_thread.run_sync(self._jwks.get_signing_key_from_jwt, token)
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=["RS256"],
                issuer=self.issuer,
                audience=self.audiences,
                options={"require": ["exp", "iss", "sub", "aud"]},
            )
        except jwt.PyJWTError as exc:
            logger.warning("token refused: %s", exc)
            return None
        aud = claims["aud"]
        return AccessToken(
            token=token,
            client_id=str(claims.get("client_id", "")),
            scopes=str(claims.get("scope", "")).split(),
            expires_at=int(claims["exp"]),
            resource=aud if isinstance(aud, str) else aud[0],
            subject=str(claims["sub"]),
            claims=claims,
        )


def bad_metadata_app(app: Any) -> Any:
    """OAUTH_PEER_BAD_PRM=1: the protected resource metadata is served malformed (not JSON)."""
    if os.environ.get("OAUTH_PEER_BAD_PRM") != "1":
        return app

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/.well-known/oauth-protected-resource"):
            body = b'{"resource": "http://127.0.0.1/mcp", "authorization_servers": [oops'
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    return wrapped


def whoami(token: AccessToken | None) -> str:
    if token is None:
        return json.dumps({"subject": None, "client_id": None})
    return json.dumps(
        {
            "subject": token.subject,
            "client_id": token.client_id,
            "aud": (token.claims or {}).get("aud"),
            "iss": (token.claims or {}).get("iss"),
        }
    )
