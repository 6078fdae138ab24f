"""The requests the fault and tampering tests make through the balancer, over raw HTTP (so they
see the status, the JSON-RPC error and its data, and a hang as a hang), and how each ended."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from tests.support import legacy_client, modern_client
from tests.support.mcp_client import Endpoint, answer_to
from tests.support.raw_http_client import Hung, Reply

ELICIT = {"name": "elicit", "arguments": {"message": "who?"}}  # both SDK servers have this tool
ASKING = {"elicitation": {"form": {}}}  # a modern client's capabilities: it can answer elicitations
ANSWER = {"action": "accept", "content": {"name": "Ada"}}
_ids = itertools.count(1)


def next_id() -> int:
    return next(_ids)


@dataclass
class Outcome:
    """How one request ended: `ok`, `lost` (404: the session is gone), `error` (a JSON-RPC error),
    `hung` (no end of reply within the deadline) or `broken` (no usable reply)."""

    kind: str
    status: int = 0
    message: dict[str, Any] | None = None
    detail: str = ""

    @property
    def error(self) -> dict[str, Any]:
        assert self.message is not None and "error" in self.message, self
        error: dict[str, Any] = self.message["error"]
        return error

    @property
    def result(self) -> dict[str, Any]:
        assert self.message is not None and "result" in self.message, self
        result: dict[str, Any] = self.message["result"]
        return result


def outcome(send: Any, request_id: int) -> Outcome:
    """Send (a callable returning a Reply) and classify what came back."""
    try:
        reply: Reply = send()
    except Hung as exc:
        return Outcome("hung", detail=str(exc)[:300])
    except OSError as exc:
        return Outcome("broken", detail=f"{type(exc).__name__}: {exc}")
    if reply.status == 404:
        return Outcome("lost", 404, detail=reply.body[:300].decode(errors="replace"))
    message = answer_to(reply, request_id)
    if message is None:
        return Outcome("broken", reply.status, detail=f"no answer to {request_id}: {reply.body[:300]!r}")
    return Outcome("error" if "error" in message else "ok", reply.status, message)


def legacy_call(ep: Endpoint, session: str, name: str = "echo", arguments: Any = None) -> Outcome:
    rid = next_id()
    params = {"name": name, "arguments": {"text": "hi"} if arguments is None else arguments}
    return outcome(lambda: legacy_client.call(ep, session, rid, "tools/call", params), rid)


def modern_call(ep: Endpoint, params: dict[str, Any], capabilities: dict[str, Any] | None = None) -> Outcome:
    rid = next_id()
    return outcome(lambda: modern_client.call(ep, rid, "tools/call", params, capabilities), rid)


def ask(ep: Endpoint) -> tuple[str, dict[str, Any]]:
    """Start an eliciting modern call: its requestState and input requests (the call is parked)."""
    first = modern_call(ep, ELICIT, ASKING)
    assert first.kind == "ok", first
    result = first.result
    assert result.get("resultType") == "input_required", result
    assert isinstance(result.get("requestState"), str) and result["inputRequests"], result
    return result["requestState"], result["inputRequests"]


def answer(ep: Endpoint, state: str, requests: dict[str, Any]) -> Outcome:
    """The retry of the eliciting call with the user's answer to every input request."""
    params = {**ELICIT, "inputResponses": dict.fromkeys(requests, ANSWER), "requestState": state}
    return modern_call(ep, params, ASKING)


def flipped(token: str, at: int) -> str:
    """`token` with one character changed (still in the base64url alphabet)."""
    char = token[at]
    return token[:at] + ("B" if char == "A" else "A") + token[at + 1 :]
