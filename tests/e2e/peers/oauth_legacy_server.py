"""OAuth-protected legacy (2025-11-25) MCP server on the `mcp==1.30.0` SDK's resource-server support.

FastMCP with AuthSettings(issuer_url, resource_server_url, required_scopes) and a TokenVerifier of
ours (oauth_common.JwtVerifier): the SDK answers 401 with its challenge, serves the protected
resource metadata (RFC 9728) at /.well-known/oauth-protected-resource/mcp and binds each session
to the principal (client id, issuer, subject) that opened it.

    python oauth_legacy_server.py --port PORT --issuer ISSUER [--jwks URL]

Tools: whoami (the token's subject and client id, JSON), echo, confirm (asks the client through
elicitation), calls (how many tool calls this session made: the same number counting on across a
token refresh shows the session was kept). Env: OAUTH_PEER_AUDIENCES (extra accepted audiences),
OAUTH_PEER_BAD_PRM=1 (malformed metadata).
"""

from __future__ import annotations

import argparse
import logging
import sys
import weakref
from typing import Any

logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

import uvicorn  # noqa: E402
from mcp.server.auth.middleware.auth_context import get_access_token  # noqa: E402
from mcp.server.auth.settings import AuthSettings  # noqa: E402
from mcp.server.fastmcp import Context, FastMCP  # noqa: E402
from mcp.server.session import ServerSession  # noqa: E402
from oauth_common import JwtVerifier, accepted_audiences, bad_metadata_app, whoami  # noqa: E402
from pydantic import AnyHttpUrl  # noqa: E402

HOST = "127.0.0.1"
ELICIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string", "description": "Your name"}},
    "required": ["name"],
}
_calls: weakref.WeakKeyDictionary[ServerSession, int] = weakref.WeakKeyDictionary()


def build(port: int, issuer: str, jwks: str) -> Any:
    own = f"http://{HOST}:{port}/mcp"
    mcp = FastMCP(
        "oauth-legacy-server",
        host=HOST,
        port=port,
        streamable_http_path="/mcp",
        log_level="WARNING",
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(issuer),
            resource_server_url=AnyHttpUrl(own),
            required_scopes=["mcp"],
            validate_token_resource=False,  # the verifier checks the audience against its list
        ),
        token_verifier=JwtVerifier(issuer, jwks, accepted_audiences(own)),
    )

    def count(ctx: Context) -> int:
        _calls[ctx.session] = _calls.get(ctx.session, 0) + 1
        return _calls[ctx.session]

    @mcp.tool(name="whoami", description="The token's subject and client id.", structured_output=False)
    def whoami_tool(ctx: Context) -> str:
        count(ctx)
        return whoami(get_access_token())

    @mcp.tool(description="Echo the given text back.", structured_output=False)
    def echo(text: str, ctx: Context) -> str:
        count(ctx)
        return f"echo: {text}"

    @mcp.tool(description="Ask the client to confirm (elicitation), then say who asked.", structured_output=False)
    async def confirm(message: str, ctx: Context) -> str:
        count(ctx)
        who = whoami(get_access_token())
        result = await ctx.session.elicit_form(message, ELICIT_SCHEMA, related_request_id=ctx.request_id)
        name = (result.content or {}).get("name", "") if result.action == "accept" else ""
        return f"confirmed: action={result.action} name={name} caller={who}"

    @mcp.tool(description="Tool calls this session has made, this one included.", structured_output=False)
    def calls(ctx: Context) -> str:
        return str(count(ctx))

    return bad_metadata_app(mcp.streamable_http_app())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--issuer", required=True)
    parser.add_argument("--jwks", help="the issuer's JWKS (default: <issuer>/jwks)")
    ns = parser.parse_args()
    app = build(ns.port, ns.issuer, ns.jwks or ns.issuer.rstrip("/") + "/jwks")
    uvicorn.run(app, host=HOST, port=ns.port, log_config=None, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
