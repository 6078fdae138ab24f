"""Legacy client → modern upstream: the request half and the reply half, as pure functions.

The proxy holds the legacy session itself; every request it forwards becomes a complete,
stateless 2026-07-28 request. docs/translation.md §3.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import downgrade, jsonrpc, meta
from .capabilities import describe_required, legacy_server_capabilities, missing_input_capability
from .headers import (
    METHOD_HEADER,
    NAME_HEADER,
    PROTOCOL_VERSION_HEADER,
    InvalidToolHeaders,
    ParamHeader,
    name_header_value,
    param_header_values,
    tool_param_headers,
)
from .methods import INPUT_REQUEST_METHODS, INPUT_REQUIRED_METHODS, LIST_CHANGED
from .versions import negotiate_legacy, pick_modern

JSONDict = dict[str, Any]

# Legacy fields without a modern counterpart (tasks are not bridged).
_LEGACY_ONLY_PARAMS = ("task",)


@dataclass(slots=True)  # not frozen: made for every request, and frozen fields cost a call each
class ClientProfile:
    """What a modern upstream must be told about the legacy client on every request."""

    modern_version: str
    capabilities: JSONDict
    client_info: JSONDict | None
    log_level: str | None = None


# ---------------------------------------------------------------- initialize


class InitializeRefused(ValueError):
    """The upstream offers no modern version we speak."""


def initialize_result(discover: JSONDict, requested_version: object, proxy_info: JSONDict) -> tuple[str, str, JSONDict]:
    """Answer a legacy `initialize` from the upstream's DiscoverResult.

    Returns (legacy version, modern version, InitializeResult).
    """
    modern = pick_modern(discover.get("supportedVersions"))
    if modern is None:
        raise InitializeRefused(
            f"upstream supports {discover.get('supportedVersions')!r}, none of which this proxy speaks"
        )
    legacy = negotiate_legacy(requested_version)
    server_info = (meta.meta_of(discover) or {}).get(meta.SERVER_INFO)
    if not (isinstance(server_info, dict) and "name" in server_info and "version" in server_info):
        server_info = proxy_info
    result: JSONDict = {
        "protocolVersion": legacy,
        "capabilities": legacy_server_capabilities(discover.get("capabilities"), legacy),
        "serverInfo": downgrade.implementation(server_info, legacy),
    }
    if isinstance(discover.get("instructions"), str):
        result["instructions"] = discover["instructions"]
    return legacy, modern, result


# ---------------------------------------------------------------- request half


def request_meta(profile: ClientProfile, base: object = None) -> JSONDict:
    """The request `_meta`: the caller's own keys kept, the envelope keys set from the profile."""
    out = dict(base) if isinstance(base, dict) else {}
    out.pop(meta.RELATED_TASK, None)
    out[meta.PROTOCOL_VERSION] = profile.modern_version
    out[meta.CLIENT_CAPABILITIES] = profile.capabilities
    if profile.client_info is not None:
        out[meta.CLIENT_INFO] = profile.client_info
    else:
        out.pop(meta.CLIENT_INFO, None)
    if profile.log_level is not None:
        out[meta.LOG_LEVEL] = profile.log_level
    else:
        out.pop(meta.LOG_LEVEL, None)
    return out


def to_upstream(
    message: JSONDict,
    upstream_id: jsonrpc.RequestId,
    profile: ClientProfile,
    *,
    input_responses: JSONDict | None = None,
    request_state: str | None = None,
) -> JSONDict:
    """Rewrite a legacy request into a complete modern one under a proxy-minted id."""
    params = message.get("params")
    params = dict(params) if isinstance(params, dict) else {}
    for key in _LEGACY_ONLY_PARAMS:
        params.pop(key, None)
    params["_meta"] = request_meta(profile, params.get("_meta"))
    if input_responses is not None:
        params["inputResponses"] = input_responses
    if request_state is not None:
        params["requestState"] = request_state
    out = dict(message)  # every other member kept as it came
    out["id"] = upstream_id
    out["params"] = params
    return out


def upstream_headers(
    message: JSONDict, modern_version: str, param_headers: tuple[ParamHeader, ...] = ()
) -> dict[str, str]:
    """The request-metadata headers a modern server validates against the body."""
    method = message["method"]
    headers = {PROTOCOL_VERSION_HEADER: modern_version, METHOD_HEADER: method}
    params = message.get("params")
    name = name_header_value(method, params)
    if name is not None:
        headers[NAME_HEADER] = name
    if param_headers and isinstance(params, dict):
        headers.update(param_header_values(param_headers, params.get("arguments")))
    return headers


# ---------------------------------------------------------------- reply half


@dataclass(frozen=True, slots=True)
class Complete:
    result: JSONDict


@dataclass(frozen=True, slots=True)
class InputRequired:
    input_requests: JSONDict
    request_state: str | None


@dataclass(frozen=True, slots=True)
class Invalid:
    reason: str


def classify_result(method: str, result: object) -> Complete | InputRequired | Invalid:
    """Sort a modern result by `resultType` (missing means complete, basic/index.mdx §ResultType)."""
    if not isinstance(result, dict):
        return Invalid("result is not an object")
    kind = result.get("resultType", "complete")
    if kind == "complete":
        return Complete(result)
    if kind == "input_required":
        if method not in INPUT_REQUIRED_METHODS:
            return Invalid(f"input_required is not allowed on {method}")
        requests = result.get("inputRequests")
        state = result.get("requestState")
        if requests is not None and not isinstance(requests, dict):
            return Invalid("inputRequests is not an object")
        if state is not None and not isinstance(state, str):
            return Invalid("requestState is not a string")
        if requests is None and state is None:
            return Invalid("input_required carries neither inputRequests nor requestState")
        return InputRequired(requests or {}, state)
    return Invalid(f"unsupported resultType {kind!r}")


def result_to_downstream(method: str, result: JSONDict, legacy_version: str) -> JSONDict:
    out = dict(result)
    out.pop("resultType", None)  # the modern result's envelope, which no legacy result has
    out.pop("ttlMs", None)
    out.pop("cacheScope", None)
    result_meta = out.get("_meta")
    if isinstance(result_meta, dict) and meta.SERVER_INFO in result_meta:
        result_meta = {k: v for k, v in result_meta.items() if k != meta.SERVER_INFO}
        if result_meta:
            out["_meta"] = result_meta
        else:
            out.pop("_meta")
    return downgrade.result(method, out, legacy_version)


def error_to_downstream(method: str, error: JSONDict) -> JSONDict:
    """Map a modern error to what the legacy revision defines (docs/translation.md §3.5 error table)."""
    code = error.get("code")
    if code == jsonrpc.INVALID_PARAMS and method == "resources/read" and _looks_not_found(error):
        return {**error, "code": jsonrpc.RESOURCE_NOT_FOUND}
    return error


def _looks_not_found(error: JSONDict) -> bool:
    # 2026-07-28 merged "resource not found" into -32602; the data.uri hint or the message
    # is all that tells them apart (docs/translation.md §8.9: heuristic by nature).
    data = error.get("data")
    if isinstance(data, dict) and "uri" in data:
        return True
    message = error.get("message")
    return isinstance(message, str) and "not found" in message.lower()


def notification_to_downstream(notification: JSONDict, legacy_version: str, log_level: str | None) -> JSONDict | None:
    """A request-scoped notification from the upstream stream, as the legacy client sees it."""
    method = notification.get("method")
    params = notification.get("params")
    if method == "notifications/message":
        level = params.get("level") if isinstance(params, dict) else None
        return notification if meta.level_passes(level, log_level) else None
    if method == "notifications/progress" and isinstance(params, dict):
        adjusted = downgrade.progress_params(params, legacy_version)
        return notification if adjusted is params else {**notification, "params": adjusted}
    return notification


def strip_subscription_id(notification: JSONDict) -> JSONDict:
    """Listen-stream notification → GET-stream notification (no `subscriptionId`)."""
    params = notification.get("params")
    note_meta = meta.meta_of(params)
    if note_meta is None or meta.SUBSCRIPTION_ID not in note_meta:
        return notification
    assert isinstance(params, dict)
    rest = {k: v for k, v in note_meta.items() if k != meta.SUBSCRIPTION_ID}
    new_params = {k: v for k, v in params.items() if k != "_meta"}
    if rest:
        new_params["_meta"] = rest
    out = {k: v for k, v in notification.items() if k != "params"}
    if new_params:
        out["params"] = new_params
    return out


# ---------------------------------------------------------------- input requests (MRTR)


class InputRequestRejected(ValueError):
    """The upstream asked for something this client never declared (an upstream bug)."""


def input_request_to_downstream(request: object, legacy_version: str, modern_caps: JSONDict) -> tuple[str, JSONDict]:
    """One `inputRequests` entry → (method, params) of a legacy server-to-client request."""
    if not isinstance(request, dict) or request.get("method") not in INPUT_REQUEST_METHODS:
        raise InputRequestRejected(f"unsupported input request {request!r:.120}")
    method = request["method"]
    params = request.get("params")
    params = dict(params) if isinstance(params, dict) else {}
    params.pop("task", None)
    missing = missing_input_capability(method, params, modern_caps)
    if missing is not None:
        raise InputRequestRejected(f"client did not declare {describe_required(missing)}")
    if method == "elicitation/create":
        return method, downgrade.elicitation_params(params, legacy_version)
    if method == "sampling/createMessage":
        return method, downgrade.sampling_params(params, legacy_version)
    return method, params


def input_response_from_downstream(request: JSONDict, reply: JSONDict, legacy_version: str) -> JSONDict | None:
    """A legacy client's JSON-RPC reply to `request` (the upstream's input request, as it was
    before any downgrade) → the `inputResponses` value; None means abort the call.

    MRTR has no slot for a failed input request (docs/translation.md §8.3). Policy: a failed elicitation
    reads as the user cancelling; a failed sampling or roots request aborts the call.
    """
    method = request.get("method")
    result = reply.get("result")
    if isinstance(result, dict):
        if method == "elicitation/create" and "content" in result:
            params = jsonrpc.params_of(request)
            content = downgrade.elicitation_content(params.get("requestedSchema"), result["content"], legacy_version)
            if content is not result["content"]:
                return {**result, "content": content}
        return result
    if method == "elicitation/create":
        return {"action": "cancel"}
    return None


# ---------------------------------------------------------------- tools/list and x-mcp-header


@dataclass(slots=True)
class ToolsPage:
    result: JSONDict
    headers: dict[str, tuple[ParamHeader, ...]] = field(default_factory=dict)
    rejected: list[tuple[str, str]] = field(default_factory=list)


def screen_tools(result: JSONDict) -> ToolsPage:
    """Withhold tools with invalid `x-mcp-header` annotations and collect the valid ones.

    An HTTP client must exclude such tools (streamable-http.mdx §Schema Extension); as the
    HTTP client of the upstream, the proxy does exactly that and reports what it dropped.
    """
    tools = result.get("tools")
    if not isinstance(tools, list):
        return ToolsPage(result)
    page = ToolsPage(result)
    kept: list[Any] = []
    for tool in tools:
        if not isinstance(tool, dict):
            kept.append(tool)
            continue
        try:
            headers = tool_param_headers(tool.get("inputSchema"))
        except InvalidToolHeaders as exc:
            page.rejected.append((str(tool.get("name")), str(exc)))
            continue
        if headers and isinstance(tool.get("name"), str):
            page.headers[tool["name"]] = headers
        kept.append(tool)
    if page.rejected:
        page.result = {**result, "tools": kept}
    return page


# ---------------------------------------------------------------- subscriptions


def listen_filter(server_caps: object, subscriptions: frozenset[str] | set[str], list_changes: bool) -> JSONDict:
    """The upstream `subscriptions/listen` filter for one legacy session (docs/translation.md §3.7)."""
    caps = server_caps if isinstance(server_caps, dict) else {}
    notifications: JSONDict = {}
    if list_changes:
        for key, (kind, _) in LIST_CHANGED.items():
            entry = caps.get(kind)
            if isinstance(entry, dict) and entry.get("listChanged"):
                notifications[key] = True
    if subscriptions:
        notifications["resourceSubscriptions"] = sorted(subscriptions)
    return notifications


def gap_notifications(filter_: JSONDict) -> list[JSONDict]:
    """After a lost listen stream nothing can be replayed: tell the client to refetch."""
    out: list[JSONDict] = []
    for key, (_, method) in LIST_CHANGED.items():
        if filter_.get(key):
            out.append(jsonrpc.notification(method))
    for uri in filter_.get("resourceSubscriptions", ()):
        out.append(jsonrpc.notification("notifications/resources/updated", {"uri": uri}))
    return out
