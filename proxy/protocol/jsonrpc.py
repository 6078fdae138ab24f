"""JSON-RPC 2.0 envelope: codec, message kinds, error codes and builders.

Messages are plain dicts so that fields the proxy does not understand survive untouched.
"""

from __future__ import annotations

import base64
import json
import math
import re
from typing import Any, Literal

import orjson

JSONDict = dict[str, Any]
RequestId = str | int

# Standard JSON-RPC codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# MCP codes.
RESOURCE_NOT_FOUND = -32002  # legacy revisions; 2026-07-28 folded it into INVALID_PARAMS
HEADER_MISMATCH = -32020
MISSING_REQUIRED_CAPABILITY = -32021
UNSUPPORTED_PROTOCOL_VERSION = -32022
URL_ELICITATION_REQUIRED = -32042  # legacy only
# Proxy codes, from the implementation-defined range both eras leave free (-32000..-32019).
UPSTREAM_UNAVAILABLE = -32010
UPSTREAM_TIMEOUT = -32011
UPSTREAM_INVALID = -32012
LIMIT_EXCEEDED = -32013
SHUTTING_DOWN = -32014  # the proxy stopped before the call finished: retry it (elsewhere)

Kind = Literal["request", "notification", "response", "invalid"]


class DecodeError(ValueError):
    """The bytes are not JSON."""


class TooDeep(DecodeError):
    """The bytes are JSON nested deeper than a decoder goes (orjson stops at 1024 levels): what
    the edges refuse as too deep (-32600, docs/translation.md §7.24), not as unreadable."""


# orjson reads integers beyond 64 bits (above 2**64-1, or below -2**63: 19 digits already) as
# floats and refuses to write them; a run of 19 digits (possibly inside a string: harmless) routes
# the message through the exact stdlib codec. Found by mapping digits to "0" and everything else to
# " " (C speed, ~10x faster than a regex).
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= i <= 0x39 else 0x20 for i in range(256))
_LONG_RUN = b"0" * 19
# An escape of a UTF-16 surrogate: only then can the stdlib codec have produced a lone one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def decode(data: bytes | str) -> Any:
    try:
        if isinstance(data, str):
            data = data.encode()
        if _LONG_RUN in data.translate(_DIGITS_AS_ZERO):  # (no length check first: most bodies are longer)
            return _decode_exact(data)
        return orjson.loads(data)
    except RecursionError as exc:
        raise TooDeep(str(exc)) from None
    except (orjson.JSONDecodeError, ValueError) as exc:
        where = getattr(exc, "pos", None)
        if isinstance(where, int) and isinstance(data, bytes) and _nesting_at(data, where) >= _DECODER_DEPTH:
            raise TooDeep(str(exc)) from None
        raise DecodeError(str(exc)) from None


# How deep orjson reads (its limit, not said by its API: its message for it differs between its
# releases, so the depth where it stopped is counted here instead).
_DECODER_DEPTH = 1024


def _nesting_at(data: bytes, position: int) -> int:
    """How many arrays and objects are open at `position` of `data` (strings skipped): where a
    decoder stopped, whether it stopped for depth. Run only for bodies it refused."""
    depth = 0
    in_string = escaped = False
    for byte in data[: position + 1]:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return depth


def _decode_exact(raw: bytes) -> Any:
    """The stdlib codec held to what orjson accepts, so that a long number cannot smuggle in what
    the proxy refuses otherwise: UTF-8 only (json.loads would guess UTF-16 or -32, and skip a BOM),
    no NaN or Infinity (nor a float that overflows to one), no lone surrogate."""
    value = json.loads(raw.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite_float)
    if _SURROGATE_ESCAPE.search(raw) is not None and _holds_lone_surrogate(value):
        raise ValueError("a string holds a lone UTF-16 surrogate")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise ValueError(f"number {text[:40]} is infinity when parsed as double")
    return number


def _holds_lone_surrogate(value: Any) -> bool:
    """Whether a string anywhere in `value` (member names too) holds a surrogate code point: after
    json.loads only a lone one can remain (a valid pair became one character). Iterative, for depth."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if not item.isascii() and not _encodable(item):
                return True
        elif isinstance(item, dict):
            pending.extend(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def encode(message: Any) -> bytes:
    try:
        return orjson.dumps(message)
    except TypeError:
        return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()


def canonical(value: Any) -> bytes:
    """`value` with its member names sorted, for keys and digests: the same value always gives the
    same bytes. orjson, or the stdlib codec for what orjson cannot write (integers beyond 64 bits,
    nesting beyond 254 levels), which a key must never fail on."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# The types decoded JSON gives a valid request id, tried first (by identity: no bool) before the
# full check, which also takes their subclasses.
_ID_TYPES = (int, str)


def is_request_id(value: object) -> bool:
    # bool is an int subclass in Python but never a valid id; floats are not allowed either.
    return type(value) in _ID_TYPES or (isinstance(value, int | str) and type(value) is not bool)


def kind(message: object) -> Kind:
    """Classify one decoded JSON value as a JSON-RPC message kind. It runs several times per
    request: the usual id (an int or a str) is checked inline, not by a call."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return "invalid"
    if "method" in message:
        if not isinstance(message["method"], str):
            return "invalid"
        params = message.get("params")
        if params is not None and not isinstance(params, dict):
            return "invalid"
        if "id" not in message:
            return "notification"
        request_id = message["id"]
        return "request" if type(request_id) in _ID_TYPES or is_request_id(request_id) else "invalid"
    if "error" not in message:
        if "result" not in message:
            return "invalid"
        request_id = message.get("id")
        return "response" if type(request_id) in _ID_TYPES or is_request_id(request_id) else "invalid"
    if "result" in message or not is_error_object(message["error"]):
        return "invalid"
    # An error reply may omit its id (or carry null) when the request's id was unreadable.
    request_id = message.get("id")
    return "response" if request_id is None or is_request_id(request_id) else "invalid"


def is_error_object(error: object) -> bool:
    """A JSON-RPC error object: an integer code and a message."""
    if not isinstance(error, dict):
        return False
    code = error.get("code")
    return (type(code) is int or (isinstance(code, int) and type(code) is not bool)) and isinstance(
        error.get("message"), str
    )


def obj(value: object) -> JSONDict:
    """`value` if it is a JSON object, else an empty one: for reading optional members."""
    return value if isinstance(value, dict) else {}


def params_of(message: JSONDict) -> JSONDict:
    """A message's params when they are an object (a request's may be absent), else {}."""
    params = message.get("params")  # obj() inlined: read for most requests, more than once
    return params if isinstance(params, dict) else {}


def id_of(message: object) -> RequestId | None:
    """The id of a message if it is a readable request id, for error replies."""
    if isinstance(message, dict):
        value = message.get("id")
        if type(value) in _ID_TYPES or is_request_id(value):
            return value
    return None


def error_object(code: int, message: str, data: Any = None) -> JSONDict:
    error: JSONDict = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return error


def error_response(request_id: RequestId | None, code: int, message: str, data: Any = None) -> JSONDict:
    """An error reply. The id is omitted only when the request's id could not be read."""
    reply: JSONDict = {"jsonrpc": "2.0"}
    if request_id is not None:
        reply["id"] = request_id
    reply["error"] = error_object(code, message, data)
    return reply


def result_response(request_id: RequestId, result: JSONDict) -> JSONDict:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def request(request_id: RequestId, method: str, params: JSONDict | None = None) -> JSONDict:
    message: JSONDict = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def notification(method: str, params: JSONDict | None = None) -> JSONDict:
    message: JSONDict = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    return message


# Tokens and ids the proxy hands out are base64url without padding.
def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def unb64url(text: str) -> bytes:
    """Strict base64url: any byte outside the alphabet, or a non-canonical form, is refused."""
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (ValueError, TypeError) as exc:
        raise ValueError(str(exc)) from None
    if b64url(raw) != text:
        raise ValueError("non-canonical base64url")
    return raw
