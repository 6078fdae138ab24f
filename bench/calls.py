"""One-off JSON-RPC requests of the benchmark: the checks that a scenario answers correctly before it
is loaded, and the legacy session a legacy-client scenario's wrk script carries (urllib, no asyncio)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from bench.harness import say

LEGACY = "2025-11-25"
MODERN = "2026-07-28"
ACCEPT = "application/json, text/event-stream"
CAPS_KEY = "io.modelcontextprotocol/clientCapabilities"
VERSION_KEY = "io.modelcontextprotocol/protocolVersion"


def post(url: str, message: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
    """POST one JSON-RPC message; (status, headers, the reply message or None). JSON or SSE."""
    request = urllib.request.Request(
        url,
        data=json.dumps(message).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Accept": ACCEPT, **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, reply_headers, body = response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        status, reply_headers, body = exc.code, exc.headers, exc.read()
    text = body.decode(errors="replace")
    if "text/event-stream" in (reply_headers.get("Content-Type") or ""):
        messages = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
        finals = [m for m in messages if "result" in m or "error" in m]
        return status, reply_headers, finals[-1] if finals else None
    return status, reply_headers, json.loads(text) if text.strip() else None


def modern_headers(method: str, name: str | None = None) -> dict[str, str]:
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    if name is not None:
        headers["Mcp-Name"] = name
    return headers


def modern_call(url: str, tool: str = "echo", arguments: dict[str, Any] | None = None) -> tuple[int, Any]:
    params = {"name": tool, "arguments": arguments or {"message": "hi"}, "_meta": {VERSION_KEY: MODERN, CAPS_KEY: {}}}
    status, _, reply = post(
        url, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}, modern_headers("tools/call", tool)
    )
    return status, reply


def modern_list(url: str, request_id: int = 1) -> tuple[int, Any]:
    params = {"_meta": {VERSION_KEY: MODERN, CAPS_KEY: {}}}
    message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/list", "params": params}
    status, _, reply = post(url, message, modern_headers("tools/list"))
    return status, reply


def legacy_session(url: str) -> str:
    """initialize, then notifications/initialized; the session id."""
    params = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "bench", "version": "1.0.0"}}
    status, headers, reply = post(url, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params})
    session = headers.get("Mcp-Session-Id")
    if status != 200 or not session or not isinstance(reply, dict) or "result" not in reply:
        raise RuntimeError(f"initialize at {url} failed: HTTP {status} {reply}")
    say(f"  initialize -> HTTP {status}, session {session[:12]}..., {short(reply)}")
    status, _, _ = post(
        url,
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"Mcp-Session-Id": session, "MCP-Protocol-Version": LEGACY},
    )
    if status not in (200, 202):
        raise RuntimeError(f"notifications/initialized at {url}: HTTP {status}")
    return session


def legacy_call(url: str, session: str, tool: str = "echo", arguments: dict[str, Any] | None = None) -> tuple[int, Any]:
    params = {"name": tool, "arguments": arguments or {"message": "hi"}}
    status, _, reply = post(
        url,
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params},
        {"Mcp-Session-Id": session, "MCP-Protocol-Version": LEGACY},
    )
    return status, reply


def short(value: Any, limit: int = 220) -> str:
    text = json.dumps(value, separators=(",", ":"))
    return text if len(text) <= limit else text[:limit] + "..."


def expect_echo(label: str, status: int, reply: Any) -> None:
    """The echo reply must carry the text 'hi' (server-everything says 'Echo: hi')."""
    say(f"  check {label}: tools/call -> HTTP {status} {short(reply)}")
    content = (reply or {}).get("result", {}).get("content") if isinstance(reply, dict) else None
    text = content[0].get("text", "") if isinstance(content, list) and content else ""
    if status != 200 or "hi" not in text or reply.get("id") != 1:
        raise RuntimeError(f"{label} did not answer the echo correctly: HTTP {status} {reply}")
