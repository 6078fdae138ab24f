"""Minimal MCP clients of both eras over raw HTTP (tests/support/raw_http_client.py), for suites that need
to see exactly what came back: status, headers, framing, whether the connection closed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from proxy.protocol import meta
from proxy.protocol.sse import Decoder
from proxy.protocol.versions import LATEST_LEGACY, LATEST_MODERN
from tests.support.answers import assert_holds
from tests.support.raw_http_client import Reply, build, exchange

ACCEPT = "application/json, text/event-stream"


def modern_headers(method: str, name: str | None = None) -> list[tuple[str, bytes | str]]:
    """The headers a 2026-07-28 request carries beside its body."""
    headers: list[tuple[str, bytes | str]] = [("Mcp-Protocol-Version", LATEST_MODERN), ("Mcp-Method", method)]
    if name is not None:
        headers.append(("Mcp-Name", name))
    return headers


def messages_of(reply: Reply) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a reply, JSON body or SSE stream."""
    if reply.content_type == "application/json" and reply.body:
        value = json.loads(reply.body)
        return value if isinstance(value, list) else [value]
    if reply.content_type == "text/event-stream":
        return [json.loads(e.data) for e in Decoder().feed(reply.body + b"\n\n") if e.data.startswith("{")]
    return []


def answer_to(reply: Reply, request_id: Any) -> dict[str, Any] | None:
    """The response to `request_id` in the reply, if any."""
    for message in messages_of(reply):
        if message.get("id") == request_id and ("result" in message or "error" in message):
            return message
    return None


@dataclass
class Endpoint:
    url: str
    timeout: float = 30.0
    authorization: str | None = None  # sent with every request when set (the caller's identity)

    @property
    def port(self) -> int:
        port = urlsplit(self.url).port
        assert port is not None
        return port

    @property
    def path(self) -> str:
        return urlsplit(self.url).path

    def post(self, body: Any, headers: list[tuple[str, bytes | str]] | None = None, when: Any = None) -> Reply:
        raw = json.dumps(body).encode()
        base: list[tuple[str, bytes | str]] = [("Content-Type", "application/json"), ("Accept", ACCEPT)]
        if self.authorization is not None:
            base.append(("Authorization", self.authorization))
        request = build("POST", self.path, [*base, *(headers or [])], raw)
        return exchange(self.port, request, timeout=self.timeout, when=when)

    def get(self, path: str) -> Reply:
        return exchange(self.port, build("GET", path, []), timeout=self.timeout)

    # ---------------------------------------------------------------- 2026-07-28

    def modern(
        self,
        request_id: Any,
        method: str,
        params: dict[str, Any] | None = None,
        capabilities: dict[str, Any] | None = None,
        when: Any = None,
    ) -> Reply:
        envelope = {meta.PROTOCOL_VERSION: LATEST_MODERN, meta.CLIENT_CAPABILITIES: capabilities or {}}
        params = dict(params or {})
        envelope.update(params.pop("_meta", {}))
        body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**params, "_meta": envelope}}
        name = params.get("name")
        return self.post(body, modern_headers(method, name if isinstance(name, str) else None), when)

    # ---------------------------------------------------------------- legacy

    def initialize(self, capabilities: dict[str, Any] | None = None) -> Reply:
        params = {
            "protocolVersion": LATEST_LEGACY,
            "capabilities": capabilities or {},
            "clientInfo": {"name": "t", "version": "1"},
        }
        return self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params})

    def open_session(self, capabilities: dict[str, Any] | None = None) -> str:
        reply = self.initialize(capabilities)
        assert_holds(reply, "initialize")
        session = reply.header("mcp-session-id")
        assert reply.status == 200 and session, f"initialize failed: HTTP {reply.status} {reply.body[:400]!r}"
        done = self.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, [("Mcp-Session-Id", session)])
        assert done.status == 202, done
        return session

    def legacy(
        self, session: str, request_id: Any, method: str, params: dict[str, Any] | None = None, when: Any = None
    ) -> Reply:
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            body["params"] = params
        return self.post(body, [("Mcp-Session-Id", session), ("Mcp-Protocol-Version", LATEST_LEGACY)], when)

    def delete(self, session: str) -> Reply:
        return exchange(self.port, build("DELETE", self.path, [("Mcp-Session-Id", session)]), timeout=self.timeout)

    def metrics(self) -> str:
        return self.get("/metrics").body.decode()


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when none)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        series, _, label_text = head.partition("{")
        if series != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(value)
    return total
