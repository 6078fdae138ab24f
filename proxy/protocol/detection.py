"""Which era an upstream speaks, from its answer to a `server/discover` probe (docs/translation.md §1.3-1.4).

Spec: 2026-07-28/basic/transports/streamable-http.mdx §Backward Compatibility and stdio.mdx
§Backward Compatibility: a DiscoverResult or a recognized modern error means modern; anything
else (another error, an unrecognized body, or on stdio silence) means legacy. The fallback must
not hinge on one error code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeGuard

from . import jsonrpc, meta
from .versions import LATEST_MODERN, Era, pick_modern

JSONDict = dict[str, Any]
PROBE_CLIENT_INFO = {"name": "mcp-era-proxy-probe", "version": "1"}


def probe_request(request_id: jsonrpc.RequestId, version: str = LATEST_MODERN) -> JSONDict:
    return jsonrpc.request(
        request_id,
        "server/discover",
        {"_meta": {meta.PROTOCOL_VERSION: version, meta.CLIENT_CAPABILITIES: {}, meta.CLIENT_INFO: PROBE_CLIENT_INFO}},
    )


def recognized_modern_error(error: object) -> TypeGuard[JSONDict]:
    """Errors only a 2026-07-28 server sends (policy: the spec gives no list; -32602 and -32601
    are not conclusive, legacy servers use them too)."""
    if not isinstance(error, dict):
        return False
    code, data = error.get("code"), error.get("data")
    if code == jsonrpc.UNSUPPORTED_PROTOCOL_VERSION:
        return isinstance(data, dict) and isinstance(data.get("supported"), list)
    if code == jsonrpc.MISSING_REQUIRED_CAPABILITY:
        return isinstance(data, dict) and "requiredCapabilities" in data
    return code == jsonrpc.HEADER_MISMATCH


@dataclass(frozen=True, slots=True)
class Detected:
    era: Era
    version: str | None  # the modern version to speak, when modern and one is shared
    # False: nothing answered in JSON-RPC (silence, an HTML page): legacy by default, and perhaps
    # no MCP server at all (the detector warns).
    answered: bool = True


def era_from_reply(reply: object) -> Detected:
    """Classify the probe's JSON-RPC reply (None: no JSON-RPC reply at all)."""
    if isinstance(reply, dict):
        result = reply.get("result")
        if isinstance(result, dict) and isinstance(result.get("supportedVersions"), list):
            return Detected(Era.MODERN, pick_modern(result["supportedVersions"]))
        error = reply.get("error")
        if recognized_modern_error(error):
            data = jsonrpc.obj(error.get("data"))
            return Detected(Era.MODERN, pick_modern(data.get("supported")))
    return Detected(Era.LEGACY, None, answered=reply is not None)


# Why the upstream is taken for a 2026-07-28 server (EraDetector.suspect's reason).
MODERN_REFUSAL = "initialize refused by a 2026-07-28 server"


def refused_as_modern(error: object) -> bool:
    """A legacy `initialize` refused as only a 2026-07-28 server refuses it."""
    return names_modern_versions(error) or recognized_modern_error(error)


def names_modern_versions(error: object) -> bool:
    """A legacy initialize refused with an error listing modern versions: the server moved on."""
    if not isinstance(error, dict) or not isinstance(error.get("data"), dict):
        return False
    supported = error["data"].get("supported")
    return isinstance(supported, list) and pick_modern(supported) is not None
