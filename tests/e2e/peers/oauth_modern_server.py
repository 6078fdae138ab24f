"""OAuth-protected modern (2026-07-28) MCP server on the `mcp==2.3.0` SDK's resource-server support.

MCPServer with AuthSettings(issuer_url, resource_server_url, required_scopes) and a TokenVerifier
of ours (oauth_common.JwtVerifier): the SDK answers 401 with its challenge and serves the protected
resource metadata (RFC 9728) at /.well-known/oauth-protected-resource/mcp. Modern-only on /mcp (as
modern_server.py): `initialize` or a POST without MCP-Protocol-Version 2026-07-28 gets 400 -32022,
GET and DELETE 405, so a legacy client reaches it only translated.

    python oauth_modern_server.py --port PORT --issuer ISSUER [--jwks URL]

Tools: whoami (the token's subject and client id, JSON), echo, confirm (an elicitation round:
InputRequiredResult with a requestState, which the SDK binds to the token's principal, then the
answer with who asked). Env: OAUTH_PEER_AUDIENCES (extra accepted
audiences), OAUTH_PEER_BAD_PRM=1 (malformed metadata).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from typing import Any

logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

import uvicorn  # noqa: E402
from mcp.server.auth.middleware.auth_context import get_access_token  # noqa: E402
from mcp.server.auth.settings import AuthSettings  # noqa: E402
from mcp.server.mcpserver import Context, MCPServer  # noqa: E402
from mcp.server.transport_security import TransportSecuritySettings  # noqa: E402
from mcp.shared.exceptions import MCPDeprecationWarning  # noqa: E402
from mcp_types import ElicitRequest, ElicitRequestFormParams, ElicitResult, InputRequiredResult  # noqa: E402
from oauth_common import JwtVerifier, accepted_audiences, bad_metadata_app, whoami  # noqa: E402
from pydantic import AnyHttpUrl  # noqa: E402

warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

HOST = "127.0.0.1"
MODERN_VERSION = "2026-07-28"
ELICIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string", "description": "Your name"}},
    "required": ["name"],
}


def build(port: int, issuer: str, jwks: str) -> Any:
    own = f"http://{HOST}:{port}/mcp"
    mcp = MCPServer(
        "oauth-modern-server",
        version="1.0.0",
        log_level="WARNING",
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(issuer),
            resource_server_url=AnyHttpUrl(own),
            required_scopes=["mcp"],
            validate_token_resource=False,  # the verifier checks the audience against its list
        ),
        token_verifier=JwtVerifier(issuer, jwks, accepted_audiences(own)),
    )

    @mcp.tool(name="whoami", description="The token's subject and client id.", structured_output=False)
    def whoami_tool() -> str:
        return whoami(get_access_token())

    @mcp.tool(description="Echo the given text back.", structured_output=False)
    def echo(text: str) -> str:
        return f"echo: {text}"

    @mcp.tool(description="Ask the client to confirm (elicitation), then say who asked.", structured_output=False)
    async def confirm(message: str, ctx: Context) -> str | InputRequiredResult:
        responses = ctx.input_responses or {}
        if "confirm" not in responses or not ctx.request_state:
            # The round's requestState: the SDK seals it and binds it to the token's principal.
            params = ElicitRequestFormParams(message=message, requested_schema=ELICIT_SCHEMA)
            state = json.dumps({"asked": message})
            return InputRequiredResult(input_requests={"confirm": ElicitRequest(params=params)}, request_state=state)
        answer = responses["confirm"]
        action = answer.action if isinstance(answer, ElicitResult) else "missing"
        name = (answer.content or {}).get("name", "") if isinstance(answer, ElicitResult) and action == "accept" else ""
        return f"confirmed: action={action} name={name} caller={whoami(get_access_token())}"

    app = mcp.streamable_http_app(
        streamable_http_path="/mcp",
        host=HOST,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    return bad_metadata_app(_modern_only(app))


def _modern_only(app: Any) -> Any:
    """Refuse legacy traffic on /mcp (the metadata routes stay open to every GET).

    A request without credentials goes on to the SDK, which answers 401 first, as a server whose
    authorization wraps its whole endpoint does."""

    async def guard(scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = dict(scope.get("headers", []))
        if scope["type"] != "http" or scope["path"] != "/mcp" or b"authorization" not in headers:
            await app(scope, receive, send)
            return
        if scope["method"] in ("GET", "DELETE"):
            await _send(send, 405, {"error": "method not allowed"})
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        version = headers.get(b"mcp-protocol-version", b"").decode("latin-1") or None
        try:
            decoded = json.loads(body)
        except ValueError:
            decoded = None
        initialize = isinstance(decoded, dict) and decoded.get("method") == "initialize"
        if initialize or version != MODERN_VERSION:
            error = {"code": -32022, "message": "Unsupported protocol version", "data": {"supported": [MODERN_VERSION]}}
            req_id = decoded.get("id") if isinstance(decoded, dict) else None
            await _send(send, 400, {"jsonrpc": "2.0", "id": req_id, "error": error})
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, replay, send)

    return guard


async def _send(send: Any, status: int, payload: Any) -> None:
    data = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--issuer", required=True)
    parser.add_argument("--jwks", help="the issuer's JWKS (default: <issuer>/jwks)")
    ns = parser.parse_args()
    app = build(ns.port, ns.issuer, ns.jwks or ns.issuer.rstrip("/") + "/jwks")
    uvicorn.run(app, host=HOST, port=ns.port, log_config=None, log_level="warning", lifespan="on")
    return 0


if __name__ == "__main__":
    sys.exit(main())
