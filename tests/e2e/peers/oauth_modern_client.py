#!/usr/bin/env python3
"""Modern-era (2026-07-28) MCP client running its own OAuth flow: `mcp==2.3.0` Client + OAuthClientProvider.

The same flow as oauth_legacy_client.py (challenge -> protected resource metadata -> authorization
server metadata -> dynamic registration -> authorize without following the redirect -> token with
PKCE), then 2026-07-28 requests (no initialize). In-memory tokens.

    oauth_modern_client.py --url URL [--timeout S] [--args JSON]

args: steps as in oauth_legacy_client.py ({"call": TOOL, "arguments": {...}} | {"refresh": true});
during_elicitation: "refresh" (the token is taken as expired while answering, so the retry carrying
the answer goes with a refreshed token); elicit_content (default {"name": "Ada"}).
Prints one JSON object: steps, tokens (hash of each access token sent, in order), grants, http,
elicitations, retries (the tools/call POSTs carrying inputResponses: token hash and status).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import warnings
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

warnings.filterwarnings("ignore", category=MCPDeprecationWarning)
REDIRECT_URI = "http://127.0.0.1:9/callback"  # never contacted: the Location is read, not followed


class MemoryStorage(TokenStorage):
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


def token_hash(header: str | None) -> str | None:
    return hashlib.sha256(header.encode()).hexdigest()[:12] if header else None


class Observer:
    def __init__(self, args: dict[str, Any]) -> None:
        self.args = args
        self.http: list[dict[str, Any]] = []
        self.tokens: list[str] = []
        self.grants: list[str] = []
        self.retries: list[dict[str, Any]] = []
        self.elicitations: list[dict[str, Any]] = []
        self.location: str | None = None
        self.provider: OAuthClientProvider | None = None
        self.phase = "connect"

    async def on_request(self, request: httpx2.Request) -> None:
        if request.url.path.endswith("/token"):
            self.grants.append(parse_qs(request.content.decode()).get("grant_type", ["?"])[0])
        auth = token_hash(request.headers.get("authorization"))
        if auth and (not self.tokens or self.tokens[-1] != auth):
            self.tokens.append(auth)
        if request.method == "POST" and b"inputResponses" in request.content:
            request.extensions["oauth_retry"] = entry = {"token": auth, "status": None}
            self.retries.append(entry)

    async def on_response(self, response: httpx2.Response) -> None:
        entry = response.request.extensions.get("oauth_retry")
        if entry is not None:
            entry["status"] = response.status_code
        self.http.append(
            {
                "method": response.request.method,
                "url": str(response.request.url),
                "status": response.status_code,
                "wwwAuthenticate": response.headers.get("www-authenticate"),
            }
        )

    async def redirect(self, authorization_url: str) -> None:
        async with httpx2.AsyncClient(follow_redirects=False, timeout=10) as http:
            reply = await http.get(authorization_url)
        if reply.status_code not in (302, 303, 307):
            raise RuntimeError(f"authorize answered {reply.status_code}: {reply.text[:200]}")
        self.location = reply.headers["location"]

    async def callback(self) -> AuthorizationCodeResult:
        assert self.location is not None
        query = parse_qs(urlsplit(self.location).query)
        return AuthorizationCodeResult(
            code=query["code"][0], state=query.get("state", [None])[0], iss=query.get("iss", [None])[0]
        )

    async def elicitation(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.elicitations.append({"message": getattr(params, "message", None)})
        if self.args.get("during_elicitation") == "refresh" and self.provider is not None:
            self.provider.context.token_expiry_time = time.time() - 1  # the retry goes with a refreshed token
        return types.ElicitResult(action="accept", content=self.args.get("elicit_content", {"name": "Ada"}))


async def run(url: str, args: dict[str, Any], obs: Observer, out: dict[str, Any]) -> None:
    provider = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="e2e modern OAuth client",
            redirect_uris=[REDIRECT_URI],  # type: ignore[list-item]
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
        ),
        storage=MemoryStorage(),
        redirect_handler=obs.redirect,
        callback_handler=obs.callback,
    )
    obs.provider = provider
    http = httpx2.AsyncClient(
        auth=provider,
        timeout=httpx2.Timeout(30.0, read=300.0),
        event_hooks={"request": [obs.on_request], "response": [obs.on_response]},
    )
    async with http:
        client = Client(
            streamable_http_client(url, http_client=http),
            mode="2026-07-28",
            elicitation_callback=obs.elicitation,
            client_info=types.Implementation(name="oauth-modern-client", version="2.3.0"),
        )
        async with client:
            out["protocolVersion"] = client.protocol_version
            steps: list[dict[str, Any]] = []
            out["steps"] = steps
            for step in args.get("steps", [{"call": "whoami"}]):
                if step.get("refresh"):
                    provider.context.token_expiry_time = time.time() - 1
                    steps.append({"refresh": True})
                    continue
                obs.phase = f"call {step['call']}"
                try:
                    result = await client.call_tool(step["call"], step.get("arguments", {}))
                    text = "".join(getattr(c, "text", "") or "" for c in result.content)
                    steps.append({"call": step["call"], "text": text, "isError": bool(result.is_error)})
                except MCPError as exc:
                    steps.append({"call": step["call"], "error": {"code": exc.code, "message": exc.message}})
            obs.phase = "closing"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--args", default="{}")
    ns = parser.parse_args()
    args = json.loads(ns.args)
    obs = Observer(args)
    out: dict[str, Any] = {}

    async def bounded() -> None:
        with anyio.fail_after(ns.timeout):
            await run(ns.url, args, obs, out)

    observed = lambda: {  # noqa: E731
        **out,
        "http": obs.http,
        "tokens": obs.tokens,
        "grants": obs.grants,
        "retries": obs.retries,
        "elicitations": obs.elicitations,
    }
    try:
        anyio.run(bounded)
    except BaseException as exc:  # report, never a traceback only
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}", "phase": obs.phase, "observed": observed()}))
        return 1
    print(json.dumps(observed()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
