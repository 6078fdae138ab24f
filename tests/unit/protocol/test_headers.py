"""Request-metadata headers, value encoding and x-mcp-header (proxy/protocol/headers.py)."""

from __future__ import annotations

import base64
import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.protocol import headers
from proxy.protocol.headers import (
    NAME_BEARING_METHODS,
    PARAM_HEADER_PREFIX,
    InvalidToolHeaders,
    ParamHeader,
    decode_header_value,
    encode_header_value,
    name_header_value,
    param_header_values,
    tool_param_headers,
)

from .x_mcp_header_cases import INVALID_SCHEMAS

MAX_SAFE = 2**53 - 1


def _header_safe(value: str) -> bool:
    return all(0x20 <= ord(c) <= 0x7E for c in value) and value == value.strip(" \t")


# ---------------------------------------------------------------- value encoding


@pytest.mark.parametrize(
    ("value", "encoded"),
    # The encoding examples table of 2026-07-28 streamable-http §Value Encoding.
    [
        ("us-west1", "us-west1"),
        ("Hello, 世界", "=?base64?SGVsbG8sIOS4lueVjA==?="),
        (" padded ", "=?base64?IHBhZGRlZCA=?="),
        ("line1\nline2", "=?base64?bGluZTEKbGluZTI=?="),
        ("=?base64?literal?=", "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="),
    ],
)
def test_values_are_encoded_exactly_as_the_spec_examples_show(value, encoded):
    assert encode_header_value(value) == encoded
    assert decode_header_value(encoded) == value


@pytest.mark.parametrize(
    ("value", "encoded"),
    [(42, "42"), (-7, "-7"), (0, "0"), (True, "true"), (False, "false"), ("", ""), ("a b", "a b")],
)
def test_integers_and_booleans_become_decimal_and_lowercase_words(value, encoded):
    assert encode_header_value(value) == encoded


@pytest.mark.parametrize("value", [None, 1.5, 42.0, [1], {"a": 1}])
def test_null_and_non_primitive_values_mean_omit_the_header(value):
    assert encode_header_value(value) is None


@pytest.mark.parametrize(
    "value",
    ["tab\tinside", "\ttab", "trailing ", " leading", "cr\r", "del\x7f", "nul\x00", "é", "=?base64??=", "=?base64?x?="],
)
def test_control_chars_edge_whitespace_non_ascii_and_sentinel_lookalikes_are_base64_wrapped(value):
    encoded = encode_header_value(value)
    assert encoded is not None
    assert encoded.startswith("=?base64?") and encoded.endswith("?=")
    assert base64.b64decode(encoded[len("=?base64?") : -len("?=")]).decode() == value


@pytest.mark.parametrize("value", ["=?BASE64?aGk=?=", "=?base64?", "?=", "plain", "=?base64?aGk=?= "])
def test_decoding_leaves_values_without_the_exact_lowercase_sentinel_alone(value):
    assert decode_header_value(value) == value


@pytest.mark.parametrize(
    "raw", ["=?base64?not base64!?=", "=?base64?aGk?=", "=?base64?" + base64.b64encode(b"\xff\xfe").decode() + "?="]
)
def test_decoding_rejects_a_sentinel_with_invalid_base64_or_invalid_utf8(raw):
    with pytest.raises(ValueError):
        decode_header_value(raw)


@settings(max_examples=200)
@given(st.text())
def test_any_text_round_trips_through_the_header_encoding(text):
    encoded = encode_header_value(text)
    assert encoded is not None
    assert _header_safe(encoded)
    assert decode_header_value(encoded) == text


@settings(max_examples=100)
@given(st.integers(min_value=-MAX_SAFE, max_value=MAX_SAFE) | st.booleans())
def test_integers_and_booleans_encode_to_plain_header_safe_text(value):
    encoded = encode_header_value(value)
    assert encoded is not None and _header_safe(encoded)
    assert decode_header_value(encoded) == encoded


# ---------------------------------------------------------------- Mcp-Name


@pytest.mark.parametrize(
    ("method", "params", "expected"),
    [
        ("tools/call", {"name": "get_weather", "arguments": {}}, "get_weather"),
        ("prompts/get", {"name": "greet"}, "greet"),
        ("resources/read", {"uri": "file:///projects/myapp/config.json"}, "file:///projects/myapp/config.json"),
        ("resources/read", {"uri": "file:///tmp/ü"}, "=?base64?ZmlsZTovLy90bXAvw7w=?="),
        ("tools/call", {"name": " spaced"}, "=?base64?IHNwYWNlZA==?="),
    ],
)
def test_mcp_name_mirrors_the_name_or_uri_of_name_bearing_methods(method, params, expected):
    assert name_header_value(method, params) == expected


def test_name_bearing_methods_are_the_three_the_spec_lists_and_the_tasks_extensions():
    assert NAME_BEARING_METHODS == {
        "tools/call": "name",
        "prompts/get": "name",
        "resources/read": "uri",
        "tasks/get": "taskId",
        "tasks/update": "taskId",
        "tasks/cancel": "taskId",
    }


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("tools/list", {"name": "x"}),
        ("resources/read", {"name": "x"}),
        ("tools/call", {}),
        ("tools/call", None),
        ("tools/call", ["name"]),
        ("tools/call", {"name": None}),
    ],
)
def test_mcp_name_is_absent_for_other_methods_or_missing_fields(method, params):
    assert name_header_value(method, params) is None


# ---------------------------------------------------------------- x-mcp-header validation


def test_the_spec_example_annotation_yields_one_string_header():
    schema = {
        "type": "object",
        "properties": {
            "region": {"type": "string", "description": "The region", "x-mcp-header": "Region"},
            "query": {"type": "string"},
        },
        "required": ["region", "query"],
    }
    assert tool_param_headers(schema) == (ParamHeader("Region", ("region",), "string"),)


def test_annotations_reached_through_a_chain_of_properties_are_valid_at_any_depth():
    schema = {
        "type": "object",
        "properties": {
            "target": {
                "type": "object",
                "properties": {
                    "location": {
                        "type": "object",
                        "properties": {"zone": {"type": "string", "x-mcp-header": "Zone"}},
                    },
                    "count": {"type": "integer", "x-mcp-header": "Count"},
                },
            },
            "dry_run": {"type": "boolean", "x-mcp-header": "Dry-Run"},
        },
    }
    headers = tool_param_headers(schema)
    assert {(h.name, h.path, h.type) for h in headers} == {
        ("Zone", ("target", "location", "zone"), "string"),
        ("Count", ("target", "count"), "integer"),
        ("Dry-Run", ("dry_run",), "boolean"),
    }


def test_properties_named_like_schema_keywords_are_still_plain_properties():
    schema = {
        "type": "object",
        "properties": {
            "items": {"type": "string", "x-mcp-header": "Items"},
            "anyOf": {"type": "integer", "x-mcp-header": "Any"},
            "x-mcp-header": {"type": "string"},
        },
    }
    assert {h.path for h in tool_param_headers(schema)} == {("items",), ("anyOf",)}


def test_every_rfc9110_tchar_is_allowed_in_a_header_name():
    name = "!#$%&'*+-.^_`|~09azAZ"
    assert tool_param_headers({"type": "object", "properties": {"a": {"type": "string", "x-mcp-header": name}}}) == (
        ParamHeader(name, ("a",), "string"),
    )


@pytest.mark.parametrize("schema", [None, {}, {"type": "object"}, {"type": "object", "properties": {}}, "text", []])
def test_schemas_without_annotations_yield_no_headers(schema):
    assert tool_param_headers(schema) == ()


@pytest.mark.parametrize("case", sorted(INVALID_SCHEMAS))
def test_an_invalid_annotation_makes_the_whole_tool_invalid_with_a_reason(case):
    schema = INVALID_SCHEMAS[case]
    snapshot = copy.deepcopy(schema)
    with pytest.raises(InvalidToolHeaders) as info:
        tool_param_headers(schema)
    assert str(info.value)
    assert schema == snapshot


def test_the_reason_names_the_offending_annotation():
    with pytest.raises(InvalidToolHeaders, match="Ratio"):
        tool_param_headers({"type": "object", "properties": {"r": {"type": "number", "x-mcp-header": "Ratio"}}})
    with pytest.raises(InvalidToolHeaders, match=r"(?i)region"):
        tool_param_headers(
            {
                "type": "object",
                "properties": {
                    "a": {"type": "string", "x-mcp-header": "Region"},
                    "b": {"type": "string", "x-mcp-header": "region"},
                },
            }
        )


# ---------------------------------------------------------------- header values at call time

HEADERS = (
    ParamHeader("Region", ("region",), "string"),
    ParamHeader("Zone", ("where", "zone"), "string"),
    ParamHeader("Count", ("count",), "integer"),
    ParamHeader("Dry-Run", ("dry_run",), "boolean"),
)


def test_present_arguments_become_mcp_param_headers_along_their_paths():
    arguments = {"region": "us-west1", "where": {"zone": "b"}, "count": 42, "dry_run": False, "other": "x"}
    assert param_header_values(HEADERS, arguments) == {
        PARAM_HEADER_PREFIX + "Region": "us-west1",
        PARAM_HEADER_PREFIX + "Zone": "b",
        PARAM_HEADER_PREFIX + "Count": "42",
        PARAM_HEADER_PREFIX + "Dry-Run": "false",
    }


def test_values_needing_it_are_sent_with_the_base64_sentinel():
    arguments = {"region": "Zürich", "where": {"zone": " edge "}, "count": 1}
    values = param_header_values(HEADERS, arguments)
    assert values[PARAM_HEADER_PREFIX + "Region"] == "=?base64?WsO8cmljaA==?="
    assert decode_header_value(values[PARAM_HEADER_PREFIX + "Zone"]) == " edge "
    sentinel = param_header_values(HEADERS, {"region": "=?base64?abc?="})[PARAM_HEADER_PREFIX + "Region"]
    assert sentinel != "=?base64?abc?=" and decode_header_value(sentinel) == "=?base64?abc?="


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"region": None, "where": None, "count": None, "dry_run": None},
        {"where": {"zone": None}},
        {"where": "not an object"},
        {"where": {}},
    ],
)
def test_null_or_absent_arguments_send_no_header(arguments):
    assert param_header_values(HEADERS, arguments) == {}


@pytest.mark.parametrize("arguments", [None, "x", [1, 2]])
def test_arguments_that_are_not_an_object_send_no_header(arguments):
    assert param_header_values(HEADERS, arguments) == {}


@pytest.mark.parametrize(
    ("count", "sent"),
    [(MAX_SAFE, True), (-MAX_SAFE, True), (MAX_SAFE + 1, False), (-MAX_SAFE - 1, False), (2**64, False)],
)
def test_integers_beyond_the_javascript_safe_range_are_omitted(count, sent):
    values = param_header_values(HEADERS, {"count": count})
    assert (PARAM_HEADER_PREFIX + "Count" in values) is sent
    if sent:
        assert values[PARAM_HEADER_PREFIX + "Count"] == str(count)


def test_extracting_header_values_does_not_change_the_arguments():
    arguments = {"region": "é", "where": {"zone": "z"}, "count": 3}
    snapshot = copy.deepcopy(arguments)
    param_header_values(HEADERS, arguments)
    assert arguments == snapshot


@pytest.mark.parametrize("name", ["echo", " padded ", "=?base64?x?=", "naïve", "tab\there", "x" * 300])
def test_a_name_rendered_again_is_rendered_the_same(name: str) -> None:
    first = name_header_value("tools/call", {"name": name})
    assert first == encode_header_value(name)
    assert name_header_value("tools/call", {"name": name}) == first  # from what was kept, or again


def test_the_kept_names_stay_bounded() -> None:
    for n in range(headers._RENDERED_NAMES_MAX * 2):
        assert name_header_value("prompts/get", {"name": f"p{n}"}) == f"p{n}"
    assert len(headers._RENDERED_NAMES) <= headers._RENDERED_NAMES_MAX
    assert "x" * 300 not in headers._RENDERED_NAMES
