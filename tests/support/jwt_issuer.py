"""A test authorization server's signing side: keys made with cryptography, tokens minted with
PyJWT, and its JWKS and RFC 8414 metadata served by a small aiohttp app on 127.0.0.1.

    issuer = JwtIssuer()
    server = await aiohttp_server(issuer.app); issuer.url = str(server.make_url("")).rstrip("/")
    token = issuer.mint(sub="alice", aud="http://127.0.0.1:8080/mcp")

`issuer.jwks_fetches` and `issuer.metadata_fetches` count what was fetched; `issuer.down = True`
answers 503 to everything; `issuer.cache_control` is sent with the JWKS.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
import uuid
from typing import Any

import jwt
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

JSONDict = dict[str, Any]
_RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)  # one per test run: slow to make
_RSA_OTHER = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _default_alg(key: Any) -> str:
    if isinstance(key, rsa.RSAPrivateKey):
        return "RS256"
    return "ES256" if isinstance(key, ec.EllipticCurvePrivateKey) else "EdDSA"


def public_jwk(private: Any, kid: str) -> JSONDict:
    public = private.public_key()
    if isinstance(public, rsa.RSAPublicKey):
        jwk = RSAAlgorithm.to_jwk(public, as_dict=True)
    elif isinstance(public, ec.EllipticCurvePublicKey):
        jwk = ECAlgorithm.to_jwk(public, as_dict=True)
    else:
        jwk = OKPAlgorithm.to_jwk(public, as_dict=True)
    return {**jwk, "kid": kid, "use": "sig"}


class JwtIssuer:
    def __init__(self, path: str = "") -> None:
        self.path = path  # the issuer URL's path (RFC 8414 §3.1 path insertion)
        self.url = ""  # set once served: http://127.0.0.1:port (without path)
        self.rsa = _RSA
        self.other_rsa = _RSA_OTHER  # a key the JWKS never lists (forgeries)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        self.ed = ed25519.Ed25519PrivateKey.generate()
        self.keys: dict[str, Any] = {"rsa-1": self.rsa, "ec-1": self.ec, "ed-1": self.ed}
        self.jwks_fetches = 0
        self.metadata_fetches: list[str] = []
        self.down = False
        self.cache_control: str | None = None
        self.jwks_body: bytes | None = None  # sent instead of the JWKS (malformed documents)
        self.jwks_gate: asyncio.Event | None = None  # when set, the JWKS answers once it is set
        self.jwks_requested = asyncio.Event()  # a JWKS request arrived
        self.jwks_in_metadata = True
        self.metadata_issuer: str | None = None  # what the metadata says `issuer` is (default: the issuer)
        self.app = web.Application()
        self.app.router.add_get("/jwks", self._jwks)
        self.app.router.add_get("/.well-known/{tail:.*}", self._metadata)
        self.app.router.add_get("/{prefix:.*}/.well-known/{tail:.*}", self._metadata)

    @property
    def issuer(self) -> str:
        return self.url + self.path

    @property
    def jwks_url(self) -> str:
        return self.url + "/jwks"

    def mint(
        self,
        *,
        sub: str | None = "alice",
        aud: str | list[str] | None = None,
        iss: str | None = None,
        kid: str = "rsa-1",
        key: Any = None,
        alg: str | None = None,
        lifetime_s: float = 300,
        headers: JSONDict | None = None,
        **claims: Any,
    ) -> str:
        now = int(time.time())
        payload: JSONDict = {"iss": iss or self.issuer, "iat": now, "exp": now + lifetime_s, "jti": uuid.uuid4().hex}
        if sub is not None:
            payload["sub"] = sub
        if aud is not None:
            payload["aud"] = aud
        for name, value in claims.items():
            if value is None:
                payload.pop(name, None)
            else:
                payload[name] = value
        signing = key if key is not None else self.keys.get(kid, self.rsa)
        if alg is None:
            alg = _default_alg(signing)
        return jwt.encode(payload, signing, algorithm=alg, headers={"kid": kid, **(headers or {})})

    def hs256_with_public_key(self, claims: JSONDict) -> str:
        """The algorithm-confusion forgery (RFC 8725 §2.1): HMAC keyed with the RSA public key's
        PEM. Made by hand: PyJWT itself refuses to sign it."""
        pem = self.rsa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        header = {"alg": "HS256", "kid": "rsa-1"}
        signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
        return f"{signing_input}.{b64(hmac.new(pem, signing_input.encode(), hashlib.sha256).digest())}"

    async def _jwks(self, request: web.Request) -> web.Response:
        self.jwks_fetches += 1
        self.jwks_requested.set()
        if self.jwks_gate is not None:
            await self.jwks_gate.wait()
        if self.down:
            return web.Response(status=503, text="down")
        if self.jwks_body is not None:
            return web.Response(body=self.jwks_body, content_type="application/json")
        headers = {"Cache-Control": self.cache_control} if self.cache_control else {}
        keys = [public_jwk(k, kid) for kid, k in self.keys.items()]
        return web.json_response({"keys": keys}, headers=headers)

    async def _metadata(self, request: web.Request) -> web.Response:
        self.metadata_fetches.append(request.path)
        if self.down:
            return web.Response(status=503, text="down")
        expected = {
            "/.well-known/oauth-authorization-server" + self.path,
            "/.well-known/openid-configuration" + self.path,
            self.path + "/.well-known/openid-configuration",
        }
        if request.path not in expected:
            return web.Response(status=404)
        document = {
            "issuer": self.metadata_issuer or self.issuer,
            "jwks_uri": self.jwks_url,
            "authorization_endpoint": self.issuer + "/authorize",
            "token_endpoint": self.issuer + "/token",
            "response_types_supported": ["code"],
        }
        if not self.jwks_in_metadata:
            del document["jwks_uri"]
        return web.json_response(document, headers={"Cache-Control": "no-store"})
