"""Generated hostile input: JSON values, JSON-RPC envelopes, `_meta`, headers and raw bodies.

Each strategy mixes what real clients send with what attackers send (wrong types, control
characters, deep nesting, huge numbers, non-UTF-8 bytes), so one property covers both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.protocol import meta
from proxy.protocol.versions import LEGACY_VERSIONS, MODERN_VERSIONS

VERSIONS = (*MODERN_VERSIONS, *LEGACY_VERSIONS)
METHODS = (
    "initialize",
    "notifications/initialized",
    "ping",
    "server/discover",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
    "subscriptions/listen",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/roots/list_changed",
    "tasks/get",
)

# Text that stresses every codec on the way: controls, separators, non-BMP, RTL, quotes.
nasty_text = st.one_of(
    st.text(max_size=24),
    st.sampled_from(["", " ", "\x00", "\r\n", "\u2028", "\ufeff", "💥", "a\tb", '"', "\\", "%00", "../../etc"]),
    st.text(alphabet=st.characters(codec="utf-8", categories=("Cc", "Zs", "So", "Lo")), max_size=8),
)
big_ints = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**53, 2**63, -(2**63) - 1, 2**64, 10**20]),
)
scalars = st.one_of(st.none(), st.booleans(), big_ints, st.floats(allow_nan=False, allow_infinity=False), nasty_text)
json_values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(nasty_text, inner, max_size=4)),
    max_leaves=12,
)


def nested(depth: int, leaf: Any = 1) -> Any:
    value: Any = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"a": value}
    return value


deep_values = st.integers(min_value=60, max_value=1200).map(nested)
request_ids = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63),
    st.text(max_size=12),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False),
    st.just({}),
    st.just([1]),
)
# One value of each JSON type, empty and not (an integer and a fraction): what a member of a message
# holds when it is of the wrong type.
EVERY_JSON_TYPE: tuple[Any, ...] = (None, False, True, 0, 7, 1.5, "", "text", [], [1, "a"], {}, {"a": 1})
# The members of a request, and of a client's answer: each may come of any JSON type.
REQUEST_MEMBERS = ("jsonrpc", "id", "method", "params")
ANSWER_MEMBERS = ("jsonrpc", "id", "result", "error")
any_json_type = st.one_of(st.sampled_from(EVERY_JSON_TYPE), json_values)
methods = st.one_of(
    st.sampled_from(METHODS),
    nasty_text,
    st.sampled_from(["tools/call\x00", "tools/\ncall", " ping"]),
    any_json_type.filter(lambda value: not isinstance(value, str)),  # a method that is no string at all
)
extension_ids = st.one_of(
    st.sampled_from(
        [
            "io.modelcontextprotocol/ui",
            "io.modelcontextprotocol/skills",
            "io.modelcontextprotocol/tasks",
            "com.example/x",
        ]
    ),
    nasty_text,
)
# What a client may put in `capabilities.extensions`: maps of settings objects (or of anything),
# maps past the proxy's bound, and values that are no map at all.
extension_maps = st.one_of(
    st.dictionaries(extension_ids, st.dictionaries(nasty_text, json_values, max_size=3), max_size=6),
    st.dictionaries(extension_ids, json_values, max_size=6),
    st.integers(min_value=60, max_value=200).map(lambda n: {f"com.example/e{i}": {} for i in range(n)}),
    json_values,
)
capabilities = st.one_of(
    st.just({}),
    st.just({"roots": {}, "sampling": {}, "elicitation": {"form": {}, "url": {}}}),
    st.dictionaries(st.sampled_from(["roots", "sampling", "elicitation", "tasks", "x"]), json_values, max_size=3),
    extension_maps.map(lambda extensions: {"extensions": extensions}),
    json_values,
)


@st.composite
def envelope_meta(draw: st.DrawFn) -> Any:
    """A `_meta` object as a modern client sends it, with each member possibly wrong."""
    out: dict[str, Any] = {}
    if draw(st.booleans()):
        out[meta.PROTOCOL_VERSION] = draw(st.one_of(st.sampled_from(VERSIONS), json_values))
    if draw(st.booleans()):
        out[meta.CLIENT_CAPABILITIES] = draw(capabilities)
    if draw(st.booleans()):
        out[meta.CLIENT_INFO] = draw(st.one_of(st.just({"name": "h", "version": "1"}), json_values))
    if draw(st.booleans()):
        out[meta.LOG_LEVEL] = draw(st.one_of(st.sampled_from(meta.LOG_LEVELS), json_values))
    if draw(st.booleans()):
        out["progressToken"] = draw(st.one_of(st.text(max_size=8), big_ints, json_values))
    if draw(st.booleans()):
        out[draw(nasty_text)] = draw(json_values)
    return draw(st.one_of(st.just(out), st.just(out), json_values))


@st.composite
def params(draw: st.DrawFn, method: str | None = None, deep: bool = True) -> Any:
    out: dict[str, Any] = {}
    if draw(st.booleans()):
        out["_meta"] = draw(envelope_meta())
    if method in ("tools/call", "prompts/get") or draw(st.booleans()):
        out["name"] = draw(st.one_of(st.sampled_from(["echo", "add", "test_simple_text"]), json_values))
    if draw(st.booleans()):
        out["arguments"] = draw(st.one_of(json_values, deep_values) if deep else json_values)
    if draw(st.booleans()):
        out["uri"] = draw(st.one_of(st.just("test://static/resource/1"), json_values))
    if draw(st.booleans()):
        out["requestState"] = draw(st.one_of(st.text(max_size=40), json_values, st.just("a.b"), st.just("." * 5000)))
    if draw(st.booleans()):
        out["inputResponses"] = draw(st.one_of(st.dictionaries(nasty_text, json_values, max_size=3), json_values))
    if draw(st.booleans()):
        out["requestId"] = draw(request_ids)
    if draw(st.booleans()):
        out["cursor"] = draw(json_values)
    if draw(st.booleans()):
        out[draw(nasty_text)] = draw(json_values)
    return draw(st.one_of(st.just(out), st.just(out), st.just(out), json_values))


@st.composite
def messages(draw: st.DrawFn) -> Any:
    """One JSON-RPC message (request, notification, response) with any member possibly wrong."""
    method = draw(methods)
    out: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        out["jsonrpc"] = "2.0"
    else:
        out["jsonrpc"] = draw(st.one_of(st.just("1.0"), json_values))
    kind = draw(st.sampled_from(["request", "request", "notification", "result", "error"]))
    if kind != "notification":
        out["id"] = draw(request_ids)
    if kind in ("request", "notification"):
        out["method"] = method
        if draw(st.integers(0, 4)):
            out["params"] = draw(params(method if isinstance(method, str) else None))
    elif kind == "result":
        out["result"] = draw(json_values)
    else:
        out["error"] = draw(st.one_of(st.just({"code": -32000, "message": "x"}), json_values))
    if draw(st.integers(0, 6)) == 0:
        out[draw(nasty_text)] = draw(json_values)
    return out


bodies = st.one_of(
    messages(),
    st.lists(messages(), max_size=4),
    json_values,
    deep_values,
)


def examples(strategy: st.SearchStrategy[Any], count: int) -> list[Any]:
    """`count` values drawn from `strategy`, the same ones every run: for the suites that send
    them to a proxy served in the test's own event loop, where a hypothesis test cannot run."""
    drawn: list[Any] = []

    @settings(max_examples=count, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(value: Any) -> None:
        drawn.append(value)

    collect()
    return drawn


class _Text(str):
    """JSON text already written (by `encode`)."""


def encode(value: Any) -> bytes:
    """`value` as JSON, however deep it nests (json.dumps stops at Python's recursion limit, and
    deep_values go past it)."""
    out: list[str] = []
    pending: list[Any] = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, _Text):
            out.append(item)
        elif isinstance(item, dict):
            parts: list[Any] = [_Text("{")]
            for index, (key, member) in enumerate(item.items()):
                parts += [_Text(("," if index else "") + json.dumps(key) + ":"), member]
            pending += reversed([*parts, _Text("}")])
        elif isinstance(item, list):
            parts = [_Text("[")]
            for index, member in enumerate(item):
                parts += [_Text(",")] if index else []
                parts.append(member)
            pending += reversed([*parts, _Text("]")])
        else:
            out.append(json.dumps(item))
    return "".join(out).encode()


def mistyped(message: dict[str, Any], members: tuple[str, ...]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(what changed, `message` with one of `members` set to a value of each JSON type): every
    member of every type, where a generated run may miss some. A string method is left out: that
    is its right type, and `methods` draws every kind of string."""
    for member in members:
        for value in EVERY_JSON_TYPE:
            if member == "method" and isinstance(value, str):
                continue
            yield f"{member}={json.dumps(value)}", {**message, member: value}
