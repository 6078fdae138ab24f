"""CPU per request of naming the caller (proxy/auth/identity.py), in-process:

- `hash`: no issuers configured, the Authorization header hashed (what every request paid before);
- `jwt cached`: a JWT of a configured issuer, verified once, then a cache hit each request;
- `jwt verified`: a new token each request (signature check, RS256 and ES256), the cost a refresh pays.

    .venv/bin/python -m bench.identity --rounds 20000

The JWKS is served by a small aiohttp app on 127.0.0.1 (fetched once). Times are process CPU
(time.process_time) over `rounds` identifications, per identification.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from proxy.auth.identity import Identifier
from proxy.auth.tokens import TokenVerifier
from proxy.config import load_settings
from tests.support.jwt_issuer import JwtIssuer

AUD = "https://mcp.example.com/mcp"


def request(token: str) -> Any:
    return make_mocked_request("POST", "/mcp", headers={"Host": "mcp.example.com", "Authorization": f"Bearer {token}"})


async def per_call_us(identifier: Identifier, requests: list[Any]) -> float:
    started = time.process_time()
    for req in requests:
        await identifier.identify(req)
    return (time.process_time() - started) / len(requests) * 1e6


async def main(rounds: int) -> None:
    issuer = JwtIssuer()
    runner = web.AppRunner(issuer.app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    issuer.url = f"http://127.0.0.1:{port}"
    common = {"upstream.url": "http://127.0.0.1:9/mcp", "auth.public_url": AUD}
    plain = Identifier(load_settings(None, **common), None)
    settings = load_settings(None, **common, **{"auth.issuers": [issuer.issuer], "auth.jwks_url": issuer.jwks_url})
    verifier = TokenVerifier(settings.auth)
    verifying = Identifier(settings, verifier)
    try:
        token = issuer.mint(aud=AUD, lifetime_s=3600)
        await verifying.identify(request(token))  # the JWKS fetched, the token cached
        same = [request(token) for _ in range(rounds)]
        rows = {
            "hash (no issuers)": await per_call_us(plain, same),
            "jwt cached (verified once)": await per_call_us(verifying, same),
        }
        fresh = max(rounds // 20, 100)
        for kid, label in (("rsa-1", "RS256"), ("ec-1", "ES256")):
            minted = [request(issuer.mint(aud=AUD, kid=kid, lifetime_s=3600)) for _ in range(fresh)]
            rows[f"jwt verified ({label}, new token each)"] = await per_call_us(verifying, minted)
    finally:
        await verifier.close()
        await runner.cleanup()
    print("| caller named by | CPU µs / request |\n|---|---|")
    for label, us in rows.items():
        print(f"| {label} | {us:.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20000)
    asyncio.run(main(parser.parse_args().rounds))
