#!/usr/bin/env python3
"""Modern-era MCP test client: a scenario driver built on the PyPI package ``mcp==2.3.0``.

That SDK is dual-era; this driver uses it as a 2026-07-28 client: ``Client(transport,
mode="2026-07-28")`` (adopts the version directly, NO ``server/discover`` is sent) or, for the
``discover`` scenario (or ``--args '{"mode": "auto"}'``), ``mode="auto"`` (probes
``server/discover``, falls back to ``initialize`` on a legacy server). The client declares
sampling, elicitation and roots capabilities (via callbacks) in every request's ``_meta``, runs
ONE scenario and prints ONE JSON object with the raw observations on the last line of stdout.
It does not judge pass/fail.

    modern_client.py --url URL --scenario NAME [--timeout SECONDS] [--args JSON]

Exit status 0 after printing the observations; on any exception it prints
``{"error": "<type>: <message>", "phase": ..., "observed": {...}}`` and exits 1.

Every output object (except ``raw``) also carries these generic observations:
  scenario, mode, protocolVersion, connectedVia ("server/discover" | "initialize" |
                 "adopted" = version pinned, no handshake on the wire), serverInfo,
  callbacks      every client callback invocation in order (sampling, elicitation,
                 list_roots, logging, progress),
  notifications  every server notification / transport exception seen by message_handler
                 (listen-stream change notifications included; acks are consumed by the SDK),
  http           every HTTP exchange in request order: method, rpc (JSON-RPC method, or
                 "result"/"error" for a POSTed response), rpcId, the request's
                 MCP-Protocol-Version / Mcp-Method / Mcp-Name / Mcp-Param-* / Mcp-Session-Id
                 headers, selected request-body facts (inputResponses keys, requestState,
                 progressToken, logLevel), status, contentType, and ``messages``: a summary
                 of every JSON-RPC message in the response body (JSON or SSE), plus
                 ``bodyEnd`` ("eof" | "closed-early" | None while still open).

Scenarios (args with defaults) and their specific output keys:
  discover      (explicit=true unless connected via initialize) negotiatedDiscover, rawDiscover,
                supportedVersions, capabilities, serverInfo, instructions, ttlMs, cacheScope, resultType
  tools         (tool=echo, arguments={"text":"hi"}) tools, listHints, result
  progress      (tool=progress, arguments, expect_progress=0) progress [[p,total,msg]], result
  elicitation   (tool=elicit, arguments={"message":"who?"}) elicitAction, elicitations, result,
                rounds (per tools/call POST: id, inputResponses/requestState sent and received),
                requestStateEchoedExact   -- sampling / roots / multi report rounds the same way
  sampling      (tool=sample, arguments={"prompt":"hello"}) samplings
  roots         (tool=roots) listRootsCalls
  multi         (tool=multi) callbackTypes
  logging       (level=warning as _meta io.modelcontextprotocol/logLevel, tool=log, expect_logs=0,
                set_level=false) logs [[level,logger,data]], result
  list_changed  (trigger_tool=add_tool, trigger_arguments={}) toolsBefore, ack, subscriptionId,
                listChangedArrived, toolsAfter, toolsAfterFromWire, events, listChangedNotifications
  subscribe     (uri=test://watched, trigger_tool=touch, trigger_arguments={"uri":uri},
                quiet_window=1, second_filter={"toolsListChanged":true}) ack, updateArrived, events,
                updates, secondAck, secondEvents, updateAfterResubscribe
  prompts       (prompt=greet, prompt_arguments={"name":"alice"}) prompts, listHints, messages
  completion    (prompt=greet | resource_uri, argument={"name":"name","value":"al"}) values, total, hasMore
  resources     (uri=test://static) resources, resourceTemplates, listHints, contents, readHints
  cancel        (tool=slow, arguments={"seconds":10}, after=0.5, cancel_on_progress=true,
                check_tool=cancelled_count, check_arguments={}, check_delay=0.3) cancelled,
                cancelReason, elapsed, cancelledPostStatus, cancelledPostBodyEnd,
                cancelNotificationPosted, progress, checkResult/checkText or checkError
  raw           (request: JSON value or string, headers (null value removes a default),
                auto_headers=false, http_method=POST, read_window=wait) request, status, headers,
                contentType, bodyComplete, body | events | text   -- no SDK client involved

Common args: mode (default "2026-07-28"; "auto" for discover), wait (bounded wait for an
expected notification, default 5 s, capped by --timeout), cache (default true: the SDK's
default ttlMs-honouring response cache; false disables it), elicit_action / elicit_content /
sample_text (callback answers).

Run with the interpreter that has mcp 2.3.0 installed
(~/.cache/mcp-era-proxy/venvs/mcp2/bin/python).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import mcp_types as types
from driver_cli import drive
from mcp import Client
from mcp.client.caching import CacheConfig
from mcp.client.session import ClientRequestContext
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import Subscription, SubscriptionLost
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp_types import LOG_LEVEL_META_KEY, SERVER_INFO_META_KEY

warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

DEFAULT_TIMEOUT = 20.0
DEFAULT_WAIT = 5.0  # bounded wait for an expected notification (also capped by --timeout)
MODERN_VERSION = "2026-07-28"
PROGRESS_LINE = "DRIVER-PROGRESS"  # on stderr at each progress notification (tests/support/sdk_drivers.py)
ROOTS = ["file:///tmp/root-a", "file:///tmp/root-b"]


def dump(model: Any) -> Any:
    """JSON-able, wire-faithful form of a pydantic model: only fields that were actually set
    (parsed from the wire), so defaults such as ``resultType="complete"`` do not appear unless
    the peer sent them."""
    if model is None:
        return None
    if hasattr(model, "model_dump"):
        return model.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return model


def tool_result(result: types.CallToolResult) -> dict[str, Any]:
    wire = dump(result)
    return {
        "content": wire.get("content", []),
        "isError": bool(result.is_error),
        "structuredContent": result.structured_content,
        "resultType": wire.get("resultType"),  # None = absent on the wire
        "_meta": wire.get("_meta"),
    }


def text_of(result: types.CallToolResult) -> str:
    return "".join(getattr(c, "text", "") or "" for c in result.content)


def cache_hints(result: Any) -> dict[str, Any]:
    """The 2026 envelope fields of a (cacheable) result, as sent by the peer."""
    wire = dump(result) or {}
    return {k: wire.get(k) for k in ("resultType", "ttlMs", "cacheScope", "nextCursor", "_meta") if k in wire}


def describe_exc(exc: BaseException) -> str:
    if isinstance(exc, MCPError):
        return f"MCPError: [{exc.code}] {exc.message}"
    return f"{type(exc).__name__}: {exc}"


def error_json(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, MCPError):
        return {"code": exc.code, "message": exc.message, "data": exc.data}
    return {"exception": describe_exc(exc)}


# ----------------------------------------------------------------------------- wire parsing
def parse_sse(data: bytes) -> list[dict[str, Any]]:
    """Split an event-stream body into events: {"event", "id", "data"(parsed JSON or text)}."""
    events: list[dict[str, Any]] = []
    text = data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        ev: dict[str, Any] = {}
        lines: list[str] = []
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data":
                lines.append(value)
            elif field in ("event", "id", "retry"):
                ev[field] = value
        if lines:
            raw = "\n".join(lines)
            try:
                ev["data"] = json.loads(raw)
            except ValueError:
                ev["data"] = raw
        if ev:
            events.append(ev)
    return events


def summarize_message(msg: Any) -> dict[str, Any]:
    """Compact summary of one JSON-RPC message seen in a response body."""
    if not isinstance(msg, dict):
        return {"unparsed": str(msg)[:200]}
    out: dict[str, Any] = {}
    if "id" in msg:
        out["id"] = msg["id"]
    if "method" in msg:
        out["method"] = msg["method"]
        params = msg.get("params") or {}
        if isinstance(params, dict):
            meta = params.get("_meta") or {}
            if isinstance(meta, dict) and meta.get("io.modelcontextprotocol/subscriptionId") is not None:
                out["subscriptionId"] = meta["io.modelcontextprotocol/subscriptionId"]
            if msg["method"] == "notifications/subscriptions/acknowledged":
                out["notifications"] = params.get("notifications")
            if msg["method"] == "notifications/resources/updated":
                out["uri"] = params.get("uri")
            if msg["method"] == "notifications/progress":
                out["progressToken"] = params.get("progressToken")
                out["progress"] = params.get("progress")
            if msg["method"] == "notifications/message":
                out["level"] = params.get("level")
    elif "error" in msg:
        err = msg.get("error") or {}
        out["error"] = {"code": err.get("code"), "message": err.get("message"), "data": err.get("data")}
    elif "result" in msg:
        result = msg.get("result")
        if isinstance(result, dict):
            out["resultKeys"] = sorted(result)
            out["resultType"] = result.get("resultType")  # None = absent
            for key in ("ttlMs", "cacheScope", "requestState"):
                if key in result:
                    out[key] = result[key]
            if isinstance(result.get("inputRequests"), dict):
                out["inputRequests"] = {
                    k: (v.get("method") if isinstance(v, dict) else None) for k, v in result["inputRequests"].items()
                }
        else:
            out["result"] = result
    return out


class TeeStream(httpx2.AsyncByteStream):
    """Wraps a response byte stream and copies every chunk into the trace entry."""

    def __init__(self, inner: Any, entry: dict[str, Any], bump: Callable[[], None]) -> None:
        self._inner = inner
        self._entry = entry
        self._bump = bump

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._entry["_body"].extend(chunk)
            self._bump()
            yield chunk
        self._entry["bodyEnd"] = "eof"

    async def aclose(self) -> None:
        if self._entry.get("bodyEnd") is None:
            self._entry["bodyEnd"] = "closed-early"
        await self._inner.aclose()
        self._bump()


def body_messages(entry: dict[str, Any]) -> list[dict[str, Any]] | None:
    body = bytes(entry.get("_body") or b"")
    if not body:
        return None
    ctype = (entry.get("contentType") or "").lower()
    if entry.get("contentEncoding"):
        return [{"unparsed": f"content-encoding {entry['contentEncoding']}"}]
    if ctype.startswith("text/event-stream"):
        out = []
        for ev in parse_sse(body):
            if "data" in ev:
                item = summarize_message(ev["data"])
                if ev.get("id"):
                    item["sseId"] = ev["id"]
                out.append(item)
        return out
    try:
        parsed = json.loads(body)
    except ValueError:
        return [{"unparsed": body.decode("utf-8", "replace")[:300]}]
    return [summarize_message(m) for m in (parsed if isinstance(parsed, list) else [parsed])]


# ----------------------------------------------------------------------------- observer
class Observer:
    """Collects everything the client sees; lets scenarios wait (bounded) for conditions."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.args = args
        self.callbacks: list[dict[str, Any]] = []
        self.notifications: list[dict[str, Any]] = []
        self.http: list[dict[str, Any]] = []
        self.phase = "connect"
        self._changed = anyio.Event()

    # ---- change signalling -------------------------------------------------
    def bump(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until predicate() is true or timeout seconds pass; return predicate()."""
        with anyio.move_on_after(timeout):
            while True:
                changed = self._changed
                if predicate():
                    return True
                await changed.wait()
        return predicate()

    # ---- Client callbacks -------------------------------------------------
    async def sampling(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        self.callbacks.append({"type": "sampling", "requestId": context.request_id, "params": dump(params)})
        self.bump()
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=self.args.get("sample_text", "sampled-by-client")),
            model="test-model",
            stop_reason="endTurn",
        )

    async def elicitation(self, context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.callbacks.append({"type": "elicitation", "requestId": context.request_id, "params": dump(params)})
        self.bump()
        action = self.args.get("elicit_action", "accept")
        if action == "accept":
            return types.ElicitResult(action="accept", content=self.args.get("elicit_content", {"name": "Ada"}))
        return types.ElicitResult(action=action)

    async def list_roots(self, context: ClientRequestContext) -> types.ListRootsResult:
        self.callbacks.append({"type": "list_roots", "requestId": context.request_id})
        self.bump()
        return types.ListRootsResult(roots=[types.Root(uri=uri) for uri in ROOTS])  # type: ignore[arg-type]

    async def logging(self, params: types.LoggingMessageNotificationParams) -> None:
        self.callbacks.append({"type": "logging", "level": params.level, "logger": params.logger, "data": params.data})
        self.bump()

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.callbacks.append({"type": "progress", "progress": progress, "total": total, "message": message})
        print(f"{PROGRESS_LINE} {progress}", file=sys.stderr, flush=True)  # the call runs: for a watching test
        self.bump()

    async def message_handler(self, message: Any) -> None:
        if isinstance(message, Exception):
            self.notifications.append({"exception": describe_exc(message)})
        else:
            params = getattr(message, "params", None)
            self.notifications.append({"method": getattr(message, "method", None), "params": dump(params)})
        self.bump()

    # ---- HTTP tracing (httpx2 event hooks) --------------------------------
    # One entry per HTTP request, in the order requests were sent; the response hook fills in
    # status/headers when the response headers arrive and tees the body into the entry.
    async def on_request(self, request: httpx2.Request) -> None:
        h = request.headers
        entry: dict[str, Any] = {
            "method": request.method,
            "status": None,
            "reqProtocolVersion": h.get("mcp-protocol-version"),
            "reqMcpMethod": h.get("mcp-method"),
            "reqMcpName": h.get("mcp-name"),
        }
        params_headers = {k: v for k, v in h.items() if k.lower().startswith("mcp-param-")}
        if params_headers:
            entry["reqParamHeaders"] = params_headers
        if h.get("mcp-session-id"):
            entry["reqSessionId"] = h.get("mcp-session-id")
        if h.get("last-event-id"):
            entry["lastEventId"] = h.get("last-event-id")
        if request.method == "POST":
            try:
                body = json.loads(request.content)
                if "method" in body:
                    entry["rpc"] = body["method"]
                    if "id" in body:
                        entry["rpcId"] = body["id"]
                    params = body.get("params") or {}
                    meta = params.get("_meta") or {}
                    if "inputResponses" in params:
                        entry["inputResponses"] = sorted((params.get("inputResponses") or {}).keys())
                    if "requestState" in params:
                        entry["requestState"] = params["requestState"]
                    if "progressToken" in meta:
                        entry["progressToken"] = meta["progressToken"]
                    if LOG_LEVEL_META_KEY in meta:
                        entry["logLevel"] = meta[LOG_LEVEL_META_KEY]
                    if "io.modelcontextprotocol/protocolVersion" in meta:
                        entry["metaProtocolVersion"] = meta["io.modelcontextprotocol/protocolVersion"]
                else:
                    entry["rpc"] = "error" if "error" in body else "result"
                    entry["rpcId"] = body.get("id")
            except Exception:
                entry["rpc"] = "?"
        entry["_body"] = bytearray()
        entry["bodyEnd"] = None
        request.extensions["modern_client_trace"] = entry
        self.http.append(entry)

    async def on_response(self, response: httpx2.Response) -> None:
        entry = response.request.extensions.get("modern_client_trace")
        if entry is None:
            return
        entry["status"] = response.status_code
        entry["contentType"] = response.headers.get("content-type")
        if response.headers.get("content-encoding"):
            entry["contentEncoding"] = response.headers.get("content-encoding")
        if response.headers.get("mcp-session-id"):
            entry["respSessionId"] = response.headers.get("mcp-session-id")
        response.stream = TeeStream(response.stream, entry, self.bump)
        self.bump()

    def http_report(self) -> list[dict[str, Any]]:
        out = []
        for entry in self.http:
            item = {k: v for k, v in entry.items() if (not k.startswith("_") and v is not None) or k == "status"}
            msgs = body_messages(entry)
            if msgs is not None:
                item["messages"] = msgs
            out.append(item)
        return out

    def common(self) -> dict[str, Any]:
        return {"callbacks": self.callbacks, "notifications": self.notifications, "http": self.http_report()}

    # ---- derived ----------------------------------------------------------
    def input_required_rounds(self, rpc: str = "tools/call") -> list[dict[str, Any]]:
        """Per POST of `rpc`: the id, inputResponses keys and requestState sent, and what came back."""
        rounds = []
        for entry in self.http:
            if entry.get("rpc") != rpc:
                continue
            final = [m for m in (body_messages(entry) or []) if "resultKeys" in m or "error" in m]
            got = final[-1] if final else {}
            rounds.append(
                {
                    "rpcId": entry.get("rpcId"),
                    "sentInputResponses": entry.get("inputResponses"),
                    "sentRequestState": entry.get("requestState"),
                    "gotResultType": got.get("resultType"),
                    "gotInputRequests": got.get("inputRequests"),
                    "gotRequestState": got.get("requestState"),
                    "gotError": got.get("error"),
                }
            )
        return rounds


def state_echo_exact(rounds: list[dict[str, Any]]) -> bool | None:
    """Did every round that received a requestState send it back byte-exact on the next round?"""
    checks = [
        rounds[i + 1]["sentRequestState"] == rounds[i]["gotRequestState"]
        for i in range(len(rounds) - 1)
        if rounds[i].get("gotRequestState") is not None
    ]
    return all(checks) if checks else None


# ----------------------------------------------------------------------------- listen helper
def event_json(event: Any) -> dict[str, Any]:
    data = dataclasses.asdict(event) if dataclasses.is_dataclass(event) else {"repr": repr(event)}
    return {"type": type(event).__name__, **data}


@asynccontextmanager
async def open_listen(client: Client, obs: Observer, **flt: Any) -> AsyncIterator[dict[str, Any]]:
    """Open subscriptions/listen (entering waits for the ack) and pump its events into a record."""
    obs.phase = f"subscriptions/listen {flt}"
    async with client.listen(**flt) as sub:
        rec: dict[str, Any] = {
            "filter": flt,
            "subscriptionId": sub.subscription_id,
            "honored": dump(sub.honored),
            "events": [],
            "end": None,
        }

        async def pump(s: Subscription) -> None:
            try:
                async for ev in s:
                    rec["events"].append(event_json(ev))
                    obs.bump()
                rec["end"] = "ended"
            except SubscriptionLost as exc:
                rec["end"] = f"lost: {exc}"
            obs.bump()

        async with anyio.create_task_group() as tg:
            tg.start_soon(pump, sub)
            try:
                yield rec
            finally:
                tg.cancel_scope.cancel()


# ----------------------------------------------------------------------------- scenarios
Scenario = Callable[[Client, Observer, dict[str, Any], float], Awaitable[dict[str, Any]]]


async def call(client: Client, obs: Observer, name: str, arguments: dict[str, Any] | None, **kw: Any):
    obs.phase = f"tools/call {name}"
    return await client.call_tool(name, arguments, **kw)


async def sc_discover(client, obs, args, wait):
    session = client.session
    out: dict[str, Any] = {"negotiatedDiscover": dump(session.discover_result)}
    if session.initialize_result is not None:
        out["initializeResult"] = dump(session.initialize_result)
    raw: dict[str, Any] | None = None
    # An explicit probe on a session that fell back to initialize would re-stamp the transport's
    # cached MCP-Protocol-Version (the later DELETE then carries 2026-07-28): off by default there.
    if args.get("explicit", session.initialize_result is None):
        obs.phase = "server/discover (explicit)"
        try:
            raw = await session.send_discover(args.get("discover_version", MODERN_VERSION))
        except MCPError as exc:
            out["explicitDiscoverError"] = error_json(exc)
    src = raw if raw is not None else (out["negotiatedDiscover"] or {})
    meta = src.get("_meta") or {}
    out.update(
        {
            "supportedVersions": src.get("supportedVersions"),
            "capabilities": src.get("capabilities"),
            "serverInfo": meta.get(SERVER_INFO_META_KEY, src.get("serverInfo")),
            "instructions": src.get("instructions"),
            "ttlMs": src.get("ttlMs"),
            "cacheScope": src.get("cacheScope"),
            "resultType": src.get("resultType"),
            "rawDiscover": raw,
        }
    )
    return out


async def sc_tools(client, obs, args, wait):
    obs.phase = "tools/list"
    tools = await client.list_tools()
    result = await call(client, obs, args.get("tool", "echo"), args.get("arguments", {"text": "hi"}))
    return {"tools": [t.name for t in tools.tools], "listHints": cache_hints(tools), "result": tool_result(result)}


async def sc_progress(client, obs, args, wait):
    result = await call(
        client, obs, args.get("tool", "progress"), args.get("arguments"), progress_callback=obs.progress
    )
    expect = int(args.get("expect_progress", 0))
    if expect:
        await obs.wait_for(lambda: sum(c["type"] == "progress" for c in obs.callbacks) >= expect, wait)
    progress = [[c["progress"], c["total"], c["message"]] for c in obs.callbacks if c["type"] == "progress"]
    return {"progress": progress, "result": tool_result(result)}


def mrtr_report(obs: Observer, result: types.CallToolResult) -> dict[str, Any]:
    rounds = obs.input_required_rounds()
    return {"result": tool_result(result), "rounds": rounds, "requestStateEchoedExact": state_echo_exact(rounds)}


async def sc_elicitation(client, obs, args, wait):
    result = await call(client, obs, args.get("tool", "elicit"), args.get("arguments", {"message": "who?"}))
    seen = [c["params"] for c in obs.callbacks if c["type"] == "elicitation"]
    return {"elicitAction": args.get("elicit_action", "accept"), "elicitations": seen, **mrtr_report(obs, result)}


async def sc_sampling(client, obs, args, wait):
    result = await call(client, obs, args.get("tool", "sample"), args.get("arguments", {"prompt": "hello"}))
    seen = [c["params"] for c in obs.callbacks if c["type"] == "sampling"]
    return {"samplings": seen, **mrtr_report(obs, result)}


async def sc_roots(client, obs, args, wait):
    result = await call(client, obs, args.get("tool", "roots"), args.get("arguments"))
    calls = sum(c["type"] == "list_roots" for c in obs.callbacks)
    return {"listRootsCalls": calls, **mrtr_report(obs, result)}


async def sc_multi(client, obs, args, wait):
    result = await call(client, obs, args.get("tool", "multi"), args.get("arguments"))
    return {"callbackTypes": [c["type"] for c in obs.callbacks], **mrtr_report(obs, result)}


async def sc_logging(client, obs, args, wait):
    level = args.get("level", "warning")
    out: dict[str, Any] = {"level": level}
    if args.get("set_level"):  # optional: the deprecated logging/setLevel as well
        obs.phase = f"logging/setLevel {level}"
        try:
            out["setLevelResult"] = dump(await client.set_logging_level(level))
        except MCPError as exc:
            out["setLevelError"] = error_json(exc)
    meta = {LOG_LEVEL_META_KEY: level} if level is not None else None
    result = await call(client, obs, args.get("tool", "log"), args.get("arguments"), meta=meta)
    expect = int(args.get("expect_logs", 0))
    if expect:
        await obs.wait_for(lambda: sum(c["type"] == "logging" for c in obs.callbacks) >= expect, wait)
    logs = [[c["level"], c["logger"], c["data"]] for c in obs.callbacks if c["type"] == "logging"]
    out.update({"logs": logs, "result": tool_result(result)})
    return out


async def sc_list_changed(client, obs, args, wait):
    trigger = args.get("trigger_tool", "add_tool")

    def tools_list_http() -> int:
        return sum(h.get("rpc") == "tools/list" for h in obs.http)

    obs.phase = "tools/list (before)"
    before = [t.name for t in (await client.list_tools()).tools]
    out: dict[str, Any] = {"triggerTool": trigger, "toolsBefore": before}
    async with open_listen(client, obs, tools_list_changed=True) as rec:
        out["ack"] = rec["honored"]
        out["subscriptionId"] = rec["subscriptionId"]
        if trigger:
            out["triggerResult"] = tool_result(await call(client, obs, trigger, args.get("trigger_arguments", {})))
            obs.phase = "wait tools list_changed event"
            out["listChangedArrived"] = await obs.wait_for(
                lambda: any(e["type"] == "ToolsListChanged" for e in rec["events"]), wait
            )
        else:
            out["listChangedArrived"] = None
        obs.phase = "tools/list (after)"
        http_before = tools_list_http()
        out["toolsAfter"] = [t.name for t in (await client.list_tools()).tools]
        out["toolsAfterFromWire"] = tools_list_http() > http_before  # False = served from the SDK cache
        out["events"] = list(rec["events"])
        out["listenEnd"] = rec["end"]
    out["listChangedNotifications"] = sum(
        n.get("method") == "notifications/tools/list_changed" for n in obs.notifications
    )
    return out


def second_listen_filter(args: dict[str, Any]) -> dict[str, Any]:
    flt = args.get("second_filter", {"toolsListChanged": True})
    names = {
        "toolsListChanged": "tools_list_changed",
        "promptsListChanged": "prompts_list_changed",
        "resourcesListChanged": "resources_list_changed",
        "resourceSubscriptions": "resource_subscriptions",
    }
    return {names.get(k, k): v for k, v in flt.items()}


async def sc_subscribe(client, obs, args, wait):
    uri = args.get("uri", "test://watched")
    trigger = args.get("trigger_tool", "touch")
    trigger_args = args.get("trigger_arguments", {"uri": uri})
    quiet = float(args.get("quiet_window", 1.0))

    def updates() -> list[dict[str, Any]]:
        return [
            n
            for n in obs.notifications
            if n.get("method") == "notifications/resources/updated" and (n.get("params") or {}).get("uri") == uri
        ]

    out: dict[str, Any] = {"uri": uri, "triggerTool": trigger}
    async with open_listen(client, obs, resource_subscriptions=[uri]) as rec:
        out["ack"] = rec["honored"]
        out["subscriptionId"] = rec["subscriptionId"]
        if trigger:
            out["triggerResult"] = tool_result(await call(client, obs, trigger, trigger_args))
            obs.phase = "wait resources/updated"
            out["updateArrived"] = await obs.wait_for(
                lambda: any(e["type"] == "ResourceUpdated" for e in rec["events"]), wait
            )
        else:
            out["updateArrived"] = None
        out["events"] = list(rec["events"])
    if out["updateArrived"]:
        # The listen stream's reader saw it; the SDK hands it to message_handler on a task of its
        # own, which may run later: count it before the second listen, not during it.
        await obs.wait_for(lambda: len(updates()) >= 1, wait)
    out["updates"] = [n["params"] for n in updates()]

    # A closed listen ends at the server a moment later (through a balancer, once the close has
    # reached the replica holding it): what "stops when it closes" is checked after that moment.
    await anyio.sleep(float(args.get("close_settle_s", 0.5)))
    flt = second_listen_filter(args)
    before = len(updates())
    async with open_listen(client, obs, **flt) as rec2:
        out["secondFilter"] = flt
        out["secondAck"] = rec2["honored"]
        out["secondSubscriptionId"] = rec2["subscriptionId"]
        if trigger:
            out["secondTriggerResult"] = tool_result(await call(client, obs, trigger, trigger_args))
            obs.phase = f"quiet window {quiet}s on a listen without {uri}"
            await anyio.sleep(quiet)  # observation window, not synchronisation
        out["secondEvents"] = list(rec2["events"])
    out["updateAfterResubscribe"] = (len(updates()) > before or bool(out["secondEvents"])) if trigger else None
    return out


async def sc_prompts(client, obs, args, wait):
    obs.phase = "prompts/list"
    prompts = await client.list_prompts()
    name = args.get("prompt", "greet")
    obs.phase = f"prompts/get {name}"
    got = await client.get_prompt(name, args.get("prompt_arguments", {"name": "alice"}))
    wire = dump(got)
    return {
        "prompts": [p.name for p in prompts.prompts],
        "listHints": cache_hints(prompts),
        "description": got.description,
        "messages": [dump(m) for m in got.messages],
        "resultType": wire.get("resultType"),
    }


async def sc_completion(client, obs, args, wait):
    if args.get("resource_uri"):
        ref: Any = types.ResourceTemplateReference(type="ref/resource", uri=args["resource_uri"])
    else:
        ref = types.PromptReference(type="ref/prompt", name=args.get("prompt", "greet"))
    argument = args.get("argument", {"name": "name", "value": "al"})
    obs.phase = "completion/complete"
    res = await client.complete(ref, argument, args.get("context_arguments"))
    return {
        "ref": dump(ref),
        "argument": argument,
        "values": res.completion.values,
        "total": res.completion.total,
        "hasMore": res.completion.has_more,
        "resultType": dump(res).get("resultType"),
    }


async def sc_resources(client, obs, args, wait):
    obs.phase = "resources/list"
    resources = await client.list_resources()
    obs.phase = "resources/templates/list"
    templates = await client.list_resource_templates()
    uri = args.get("uri", "test://static")
    obs.phase = f"resources/read {uri}"
    read = await client.read_resource(uri)
    return {
        "resources": [str(r.uri) for r in resources.resources],
        "resourceTemplates": [t.uri_template for t in templates.resource_templates],
        "listHints": cache_hints(resources),
        "uri": uri,
        "contents": [dump(c) for c in read.contents],
        "readHints": cache_hints(read),
    }


async def sc_cancel(client, obs, args, wait):
    """Abandon a tools/call client-side. At 2026-07-28 the SDK's streamable-HTTP transport turns
    the dispatcher's courtesy notifications/cancelled into aborting that request's own POST
    (closing the response stream); nothing else is sent."""
    tool = args.get("tool", "slow")
    # Cancelled at its first progress (it runs upstream then); the deadline only bounds a call that
    # never reports any (a short one could fire before a loaded machine even got the call upstream).
    after = float(args.get("after", wait))
    on_progress = bool(args.get("cancel_on_progress", True))
    out: dict[str, Any] = {"tool": tool, "after": after}
    reason: list[str] = []
    scope = anyio.CancelScope(deadline=anyio.current_time() + after)

    async def progress(p: float, total: float | None, message: str | None) -> None:
        await obs.progress(p, total, message)
        if on_progress and not scope.cancel_called:
            reason.append("progress")
            scope.cancel()

    check = args.get("check_tool", "cancelled_count")
    if check:  # the server's count before, so a run against a server that saw others is judged alone
        out["checkBefore"] = text_of(await call(client, obs, check, args.get("check_arguments", {})))
    start = time.monotonic()
    result = None
    with scope:
        result = await call(client, obs, tool, args.get("arguments", {"seconds": 10}), progress_callback=progress)
    out["elapsed"] = round(time.monotonic() - start, 3)
    out["cancelled"] = scope.cancelled_caught
    out["cancelReason"] = (reason[0] if reason else "timer") if scope.cancelled_caught else None
    out["result"] = tool_result(result) if result is not None else None
    posts = [h for h in obs.http if h.get("rpc") == "tools/call" and h.get("rpcId") is not None]
    post = posts[-1] if posts else None
    if post is not None and scope.cancelled_caught:
        # the transport aborts the POST in its own task; wait (bounded) until the body is closed
        obs.phase = "wait for the cancelled POST to close"
        await obs.wait_for(lambda: post.get("bodyEnd") is not None, min(wait, 2.0))
    out["cancelledPostStatus"] = post.get("status") if post else None
    out["cancelledPostBodyEnd"] = post.get("bodyEnd") if post else None
    out["cancelNotificationPosted"] = any(h.get("rpc") == "notifications/cancelled" for h in obs.http)
    out["progress"] = [[c["progress"], c["total"], c["message"]] for c in obs.callbacks if c["type"] == "progress"]
    if check:
        # The server notices the cancellation on its own time: its count is read until it moves
        # (bounded by `wait`), the last reading reported either way.
        with anyio.move_on_after(wait):
            while True:
                try:
                    res = await call(client, obs, check, args.get("check_arguments", {}))
                except MCPError as exc:
                    out["checkError"] = error_json(exc)
                    break
                out["checkResult"] = tool_result(res)
                out["checkText"] = text_of(res)
                if out["checkText"] != out.get("checkBefore"):
                    break
                await anyio.sleep(0.1)
    return out


SCENARIOS: dict[str, Scenario] = {
    "discover": sc_discover,
    "tools": sc_tools,
    "progress": sc_progress,
    "elicitation": sc_elicitation,
    "sampling": sc_sampling,
    "roots": sc_roots,
    "multi": sc_multi,
    "logging": sc_logging,
    "list_changed": sc_list_changed,
    "subscribe": sc_subscribe,
    "prompts": sc_prompts,
    "completion": sc_completion,
    "resources": sc_resources,
    "cancel": sc_cancel,
    "raw": None,  # type: ignore[dict-item]  # handled by run_raw (no SDK client)
}


# ----------------------------------------------------------------------------- raw
async def run_raw(url: str, args: dict[str, Any], timeout: float, out: dict[str, Any], obs: Observer) -> None:
    """POST one hand-written JSON-RPC message through plain httpx2; record status, headers, body."""
    request = args.get("request")
    if request is None:
        raise ValueError("raw scenario needs args.request")
    headers: dict[str, str] = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    if args.get("auto_headers") and isinstance(request, dict):
        params = request.get("params") or {}
        headers["mcp-protocol-version"] = MODERN_VERSION
        if "method" in request:
            headers["mcp-method"] = request["method"]
        name = (params.get("name") or params.get("uri")) if isinstance(params, dict) else None
        if isinstance(name, str):
            headers["mcp-name"] = name
    for k, v in (args.get("headers") or {}).items():
        if v is None:
            headers.pop(k.lower(), None)
        else:
            headers[k.lower()] = str(v)
    content = request.encode() if isinstance(request, str) else json.dumps(request).encode()
    method = args.get("http_method", "POST")
    # leave headroom under the overall --timeout so an open SSE stream is reported, not a timeout
    read_window = min(float(args.get("read_window", args.get("wait", DEFAULT_WAIT))), timeout * 0.8)
    want_id = request.get("id") if isinstance(request, dict) else None
    out["request"] = {"method": method, "headers": headers, "body": request}
    obs.phase = f"raw {method}"
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(10.0, read=timeout)) as http:
        async with http.stream(method, url, content=content if method != "GET" else None, headers=headers) as resp:
            out["status"] = resp.status_code
            out["headers"] = dict(resp.headers)
            ctype = (resp.headers.get("content-type") or "").lower()
            out["contentType"] = resp.headers.get("content-type")
            body = bytearray()
            complete = False
            obs.phase = "raw read body"
            with anyio.move_on_after(read_window):
                async for chunk in resp.aiter_bytes():
                    body.extend(chunk)
                    if ctype.startswith("text/event-stream") and want_id is not None:
                        if any(
                            isinstance(ev.get("data"), dict)
                            and ev["data"].get("id") == want_id
                            and ("result" in ev["data"] or "error" in ev["data"])
                            for ev in parse_sse(bytes(body))
                        ):
                            complete = True
                            break
                else:
                    complete = True
            out["bodyComplete"] = complete
            if ctype.startswith("text/event-stream"):
                out["events"] = parse_sse(bytes(body))
            else:
                try:
                    out["body"] = json.loads(body) if body else None
                except ValueError:
                    out["body"] = None
                    out["text"] = body.decode("utf-8", "replace")[:2000]


# ----------------------------------------------------------------------------- driver
STDIO_PREFIX = "stdio:"


def stdio_errlog(spec: dict[str, Any]) -> Any:
    """Where the server process's stderr goes: the spec's `errlog` file, or this driver's stderr."""
    return open(spec["errlog"], "a") if spec.get("errlog") else sys.stderr


def transport(url: str, http_client: httpx2.AsyncClient) -> Any:
    """Streamable HTTP to `url`, or the stdio server process a `stdio:{json}` URL describes
    (``mcp.client.stdio.stdio_client``)."""
    if url.startswith(STDIO_PREFIX):
        spec = json.loads(url[len(STDIO_PREFIX) :])
        params = StdioServerParameters(
            command=spec["command"], args=spec.get("args", []), env=spec.get("env"), cwd=spec.get("cwd")
        )
        errlog = stdio_errlog(spec)
        return stdio_client(params, errlog=errlog)
    return streamable_http_client(url, http_client=http_client)


async def run(url: str, scenario: str, args: dict[str, Any], timeout: float, obs: Observer, out: dict[str, Any]):
    wait = min(float(args.get("wait", DEFAULT_WAIT)), timeout)
    with anyio.fail_after(timeout):
        if scenario == "raw":
            await run_raw(url, args, timeout, out, obs)
            return
        mode = args.get("mode", "auto" if scenario == "discover" else MODERN_VERSION)
        out["mode"] = mode
        http_client = httpx2.AsyncClient(
            timeout=httpx2.Timeout(30.0, read=300.0),  # the SDK's defaults; --timeout bounds the run
            event_hooks={"request": [obs.on_request], "response": [obs.on_response]},
        )
        async with http_client:
            client = Client(
                transport(url, http_client),
                mode=mode,
                sampling_callback=obs.sampling,
                elicitation_callback=obs.elicitation,
                list_roots_callback=obs.list_roots,
                logging_callback=obs.logging,
                message_handler=obs.message_handler,
                client_info=types.Implementation(name="modern-client-peer", version="2.3.0"),
                cache=CacheConfig() if args.get("cache", True) else None,
            )
            obs.phase = f"connect (mode={mode})"
            async with client:
                session = client.session
                out["protocolVersion"] = client.protocol_version
                if session.initialize_result is not None:
                    out["connectedVia"] = "initialize"
                elif any(h.get("rpc") == "server/discover" for h in obs.http):
                    out["connectedVia"] = "server/discover"
                else:
                    out["connectedVia"] = "adopted"
                out["serverInfo"] = dump(client.server_info)
                out.update(await SCENARIOS[scenario](client, obs, args, wait))
                obs.phase = "closing client"
            obs.phase = "closed"


def main() -> int:
    return drive(
        __doc__,
        SCENARIOS,
        DEFAULT_TIMEOUT,
        Observer,
        run,
        describe=describe_exc,
        observed=lambda scenario, obs: obs.common() if scenario != "raw" else {},
        error_data=lambda leaf: error_json(leaf) if isinstance(leaf, MCPError) else None,
    )


if __name__ == "__main__":
    sys.exit(main())
