#!/usr/bin/env python3
"""Legacy-era MCP client running its own OAuth flow: `mcp==1.30.0` OAuthClientProvider + Streamable HTTP.

From the first 401: the challenge's resource_metadata -> protected resource metadata -> the
authorization server's metadata -> dynamic client registration -> authorize (the redirect handler
GETs the authorization URL without following the redirect; the callback handler hands back the code
and state from its Location) -> token (PKCE) -> the MCP session. Tokens live in memory only.

    oauth_legacy_client.py --url URL [--timeout S] [--args JSON]

args: steps, a list run in order on one session, each {"call": TOOL, "arguments": {...}} or
{"refresh": true} (the token is taken as expired, so the next request refreshes it first);
elicit_content (the elicitation answer, default {"name": "Ada"}).
Prints one JSON object: sessionId (and sessionIds seen on requests), steps (text / isError or
error), tokens (a hash of each access token sent, in order), grants (token requests by
grant_type), http (method, path, status, www-authenticate of each exchange), elicitations.
Exit 1 with {"error", "observed"} on failure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx
import mcp.types as types
from mcp import ClientSession
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from mcp.shared.exceptions import McpError

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
        self.session_ids: list[str] = []
        self.elicitations: list[dict[str, Any]] = []
        self.location: str | None = None
        self.phase = "connect"

    async def on_request(self, request: httpx.Request) -> None:
        if request.url.path.endswith("/token"):
            form = parse_qs(request.content.decode())
            self.grants.append(form.get("grant_type", ["?"])[0])
        auth = token_hash(request.headers.get("authorization"))
        if auth and (not self.tokens or self.tokens[-1] != auth):
            self.tokens.append(auth)
        sid = request.headers.get("mcp-session-id")
        if sid and sid not in self.session_ids:
            self.session_ids.append(sid)

    async def on_response(self, response: httpx.Response) -> None:
        self.http.append(
            {
                "method": response.request.method,
                "url": str(response.request.url),
                "status": response.status_code,
                "wwwAuthenticate": response.headers.get("www-authenticate"),
            }
        )

    async def redirect(self, authorization_url: str) -> None:
        async with httpx.AsyncClient(follow_redirects=False, timeout=10) as http:
            reply = await http.get(authorization_url)
        if reply.status_code not in (302, 303, 307):
            raise RuntimeError(f"authorize answered {reply.status_code}: {reply.text[:200]}")
        self.location = reply.headers["location"]

    async def callback(self) -> tuple[str, str | None]:
        assert self.location is not None
        query = parse_qs(urlsplit(self.location).query)
        return query["code"][0], query.get("state", [None])[0]

    async def elicitation(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.elicitations.append({"message": params.message})
        return types.ElicitResult(action="accept", content=self.args.get("elicit_content", {"name": "Ada"}))


async def run(url: str, args: dict[str, Any], obs: Observer, out: dict[str, Any]) -> None:
    provider = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="e2e legacy OAuth client",
            redirect_uris=[REDIRECT_URI],  # type: ignore[list-item]
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
        ),
        storage=MemoryStorage(),
        redirect_handler=obs.redirect,
        callback_handler=obs.callback,
    )
    http = httpx.AsyncClient(
        auth=provider,
        timeout=httpx.Timeout(30.0, read=300.0),
        event_hooks={"request": [obs.on_request], "response": [obs.on_response]},
    )
    async with http, streamable_http_client(url, http_client=http) as (read, write, get_session_id):
        async with ClientSession(read, write, elicitation_callback=obs.elicitation) as session:
            obs.phase = "initialize"
            init = await session.initialize()
            out["protocolVersion"] = init.protocolVersion
            out["sessionId"] = get_session_id()
            steps: list[dict[str, Any]] = []
            out["steps"] = steps
            for step in args.get("steps", [{"call": "whoami"}]):
                if step.get("refresh"):
                    provider.context.token_expiry_time = time.time() - 1  # taken as expired: refreshed next
                    steps.append({"refresh": True})
                    continue
                obs.phase = f"call {step['call']}"
                try:
                    result = await session.call_tool(step["call"], step.get("arguments", {}))
                    text = "".join(getattr(c, "text", "") for c in result.content)
                    steps.append({"call": step["call"], "text": text, "isError": bool(result.isError)})
                except McpError as exc:
                    steps.append(
                        {"call": step["call"], "error": {"code": exc.error.code, "message": exc.error.message}}
                    )
            out["sessionIdAtEnd"] = get_session_id()
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
        "sessionIds": obs.session_ids,
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
