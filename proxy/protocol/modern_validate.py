"""Validation of an incoming 2026-07-28 request, exactly as a modern server must do it.

docs/translation.md §4.1 and 2026-07-28/basic/transports/streamable-http.mdx §Server Validation. An
ordered ladder; the first failing rung decides. Pure: it sees the decoded body and the
relevant request headers (lower-cased names, every value received), never a socket.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from . import jsonrpc, meta
from .capabilities import extensions_problem
from .headers import (
    METHOD_HEADER,
    NAME_BEARING_METHODS,
    NAME_HEADER,
    PARAM_HEADER_PREFIX,
    PROTOCOL_VERSION_HEADER,
    ParamHeader,
    decode_header_value,
)
from .status import Rejection
from .versions import MODERN_VERSIONS

JSONDict = dict[str, Any]


class Headers(Protocol):
    """The request's headers as validation reads them: every value received under a lower-cased
    name, or None. A dict keyed by lower-cased names is one; so is `HeaderLookup` over a
    case-insensitive multidict (aiohttp's request headers), which looks up only the few names asked
    for instead of copying every header first."""

    def get(self, name: str, /) -> Sequence[str] | None: ...


class HeaderLookup:
    """`Headers` over any object with a case-insensitive `getall(name, default=...)` (multidict)."""

    __slots__ = ("get",)

    get: Callable[[str], Sequence[str] | None]

    def __init__(self, headers: Any) -> None:
        # The multidict's own method, its default bound: a lookup runs no Python code of the proxy.
        self.get = functools.partial(headers.getall, default=None)


# Methods 2026-07-28 removed: a modern server answers them 404 / -32601 (basic/versioning.mdx).
REMOVED_METHODS = frozenset(
    {
        "initialize",
        "ping",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
        "tasks/list",
        "tasks/result",
    }
)
# Which server capability backs a method (absent capability → method not found).
BACKING_CAPABILITY = {
    "tools/list": "tools",
    "tools/call": "tools",
    "prompts/list": "prompts",
    "prompts/get": "prompts",
    "resources/list": "resources",
    "resources/templates/list": "resources",
    "resources/read": "resources",
    "completion/complete": "completions",
}


@dataclass(slots=True)  # not frozen: made for every request, and frozen fields cost a call each
class ModernRequest:
    message: JSONDict
    method: str
    version: str
    capabilities: JSONDict
    client_info: JSONDict | None
    log_level: str | None


_VERSION_META = meta.PROTOCOL_VERSION
_CAPABILITIES_META = meta.CLIENT_CAPABILITIES
_LEVEL_META = meta.LOG_LEVEL
_INFO_META = meta.CLIENT_INFO
_LEVELS = meta.LOG_LEVELS
_VERSION_KEY = PROTOCOL_VERSION_HEADER.lower()
_METHOD_KEY = METHOD_HEADER.lower()
_NAME_KEY = NAME_HEADER.lower()


def _single(headers: Headers, name: str) -> str | Rejection | None:
    return _one_of(headers.get(name.lower()), name)


def _one_of(values: Sequence[str] | None, name: str) -> str | Rejection | None:
    """The one value of header `name` (None: absent); a Rejection if it came more than once."""
    if not values:
        return None
    if len(values) > 1:
        return _mismatch(f"header {name} appears more than once")
    return values[0]


def _mismatch(text: str) -> Rejection:
    return Rejection(jsonrpc.HEADER_MISMATCH, f"Header mismatch: {text}")


def validate_request(
    body: JSONDict, headers: Headers, param_headers: Callable[[str], tuple[ParamHeader, ...]] | None = None
) -> ModernRequest | Rejection:
    """Check one modern JSON-RPC request (its kind already known to be "request"). `param_headers`:
    the Mcp-Param-* headers a tool declares, by its name (None: none is checked here)."""
    method = body["method"]
    params: Any = body.get("params")
    request_meta: Any
    # Read in place: only an object takes a string key, so params and its _meta are objects
    # wherever version is a string below; whatever is absent or of another type is refused.
    try:
        request_meta = params["_meta"]
        version = request_meta[_VERSION_META]
        capabilities = request_meta[_CAPABILITIES_META]
    except (TypeError, KeyError):
        request_meta = version = capabilities = None
    if not isinstance(version, str) or not isinstance(capabilities, dict):
        return Rejection(
            jsonrpc.INVALID_PARAMS,
            f"params._meta must carry {meta.PROTOCOL_VERSION!r} (string) and {meta.CLIENT_CAPABILITIES!r} (object)",
        )
    # Headers mirror the body; both must be present and agree. A header sent once (as it must be)
    # is unpacked in place; only one absent or repeated goes through _one_of.
    values = headers.get(_VERSION_KEY)
    try:
        (header_version,) = values  # type: ignore[misc]
    except (TypeError, ValueError):
        header_version = _one_of(values, PROTOCOL_VERSION_HEADER)
    values = headers.get(_METHOD_KEY)
    try:
        (header_method,) = values  # type: ignore[misc]
    except (TypeError, ValueError):
        header_method = _one_of(values, METHOD_HEADER)
    if header_version != version or header_method != method:  # both agree (the body's are strings): no rung fails
        if isinstance(header_version, Rejection):
            return header_version
        if isinstance(header_method, Rejection):
            return header_method
        if header_version is None:
            return _mismatch(f"missing {PROTOCOL_VERSION_HEADER} header")
        if header_method is None:
            return _mismatch(f"missing {METHOD_HEADER} header")
        if header_version != version:
            return _mismatch(f"{PROTOCOL_VERSION_HEADER} {header_version!r} does not match body {version!r}")
        return _mismatch(f"{METHOD_HEADER} {header_method!r} does not match body method {method!r}")
    field = NAME_BEARING_METHODS.get(method)
    if field is not None:
        values = headers.get(_NAME_KEY)
        try:
            (header_name,) = values  # type: ignore[misc]
        except (TypeError, ValueError):  # absent or repeated: refused either way
            refused = _one_of(values, NAME_HEADER)
            if isinstance(refused, Rejection):
                return refused
            return _mismatch(f"missing {NAME_HEADER} header (required for {method})")
        try:
            decoded = decode_header_value(header_name)
        except ValueError as exc:
            return _mismatch(f"{NAME_HEADER}: {exc}")
        if decoded != params.get(field):
            return _mismatch(f"{NAME_HEADER} {decoded!r} does not match body {field} {params.get(field)!r}")
    if version not in MODERN_VERSIONS:
        return Rejection(
            jsonrpc.UNSUPPORTED_PROTOCOL_VERSION,
            f"Unsupported protocol version: {version}",
            {"supported": list(MODERN_VERSIONS), "requested": version},
        )
    level = request_meta.get(_LEVEL_META)
    if level is not None and level not in _LEVELS:
        return Rejection(jsonrpc.INVALID_PARAMS, f"unknown log level {level!r}")
    wrong_extensions = extensions_problem(capabilities)
    if wrong_extensions is not None:
        return Rejection(jsonrpc.INVALID_PARAMS, f"params._meta[{meta.CLIENT_CAPABILITIES!r}]: {wrong_extensions}")
    if param_headers is not None and method == "tools/call":
        name = params.get("name")
        specs = param_headers(name) if isinstance(name, str) else None
        if specs:  # a tool that declares none has nothing to check
            problem = _check_param_headers(specs, params.get("arguments"), headers)
            if problem is not None:
                return problem
    client_info = request_meta.get(_INFO_META)
    return ModernRequest(
        body,
        method,
        version,
        capabilities,
        client_info if isinstance(client_info, dict) else None,
        level,  # None or one of LOG_LEVELS, a string (checked above)
    )


def _check_param_headers(specs: tuple[ParamHeader, ...], arguments: object, headers: Headers) -> Rejection | None:
    for spec in specs:
        value: Any = arguments
        for step in spec.path:
            value = value.get(step) if isinstance(value, dict) else None
        name = PARAM_HEADER_PREFIX + spec.name
        received = _single(headers, name)
        if isinstance(received, Rejection):
            return received
        if value is None:
            if received is not None:
                return _mismatch(f"{name} sent but the argument is absent")
            continue
        if received is None:
            return _mismatch(f"missing {name} header for argument {'.'.join(spec.path)}")
        try:
            decoded = decode_header_value(received)
        except ValueError as exc:
            return _mismatch(f"{name}: {exc}")
        if not _same_value(decoded, value):
            return _mismatch(f"{name} {decoded!r} does not match the argument value {value!r}")
    return None


def _same_value(header: str, value: object) -> bool:
    if isinstance(value, bool):
        return header == ("true" if value else "false")
    if isinstance(value, (int, float)):
        try:
            return float(header) == float(value)  # compared numerically: "42.0" equals 42
        except ValueError:
            return False
    return header == value


def method_problem(method: str, server_capabilities: JSONDict | None) -> Rejection | None:
    """Method-level check (-32601 travels with HTTP 404): methods 2026-07-28 removed, and, given
    the upstream's capabilities, methods it does not back."""
    if method in REMOVED_METHODS or method.startswith("tasks/"):
        return Rejection(jsonrpc.METHOD_NOT_FOUND, f"Method not found: {method}")
    if server_capabilities is None:
        return None
    return unbacked_method(method, server_capabilities)


def unbacked_method(method: str, server_capabilities: JSONDict) -> Rejection | None:
    """The second half of method_problem, for a method already known not to be removed."""
    capability = BACKING_CAPABILITY.get(method)
    if capability is not None and capability not in server_capabilities:
        return Rejection(jsonrpc.METHOD_NOT_FOUND, f"Method not found: {method} (the server has no {capability})")
    return None
