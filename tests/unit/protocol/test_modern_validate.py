"""The validation ladder a 2026-07-28 server applies to an incoming request (proxy/protocol/modern_validate.py;
docs/translation.md §4.1, §8.17; 2026-07-28/basic/transports/streamable-http.mdx §Server Validation)."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest
from multidict import CIMultiDict

from proxy.protocol import jsonrpc, meta
from proxy.protocol.headers import ParamHeader
from proxy.protocol.modern_validate import HeaderLookup, ModernRequest, method_problem, validate_request
from proxy.protocol.status import Rejection
from proxy.protocol.versions import LATEST_LEGACY, LATEST_MODERN, MODERN_VERSIONS

# The body field each name-bearing method mirrors into Mcp-Name (streamable-http §Standard Request Headers).
NAME_FIELD = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
REGION = ParamHeader("Region", ("region",), "string")
HELLO = "Hello, 世界"
HELLO_B64 = "=?base64?SGVsbG8sIOS4lueVjA==?="
NOT_UTF8_B64 = "=?base64?" + base64.b64encode(b"\xff\xfe").decode() + "?="


def _body(
    method: str = "tools/list",
    params: dict[str, Any] | None = None,
    extra_meta: dict[str, Any] | None = None,
    version: str = LATEST_MODERN,
) -> dict[str, Any]:
    envelope = {meta.PROTOCOL_VERSION: version, meta.CLIENT_CAPABILITIES: {}, **(extra_meta or {})}
    return jsonrpc.request(1, method, {**(params or {}), "_meta": envelope})


def _call(arguments: object = None, name: str = "get_weather", extra_meta: dict[str, Any] | None = None) -> dict:
    params: dict[str, Any] = {"name": name}
    if arguments is not None:
        params["arguments"] = arguments
    return _body("tools/call", params, extra_meta)


def _headers(body: dict[str, Any], changes: dict[str, list[str] | None] | None = None) -> dict[str, list[str]]:
    """The headers a conforming client sends for `body` (plain values), then `changes` (None removes)."""
    params = body["params"]
    out = {"mcp-protocol-version": [params["_meta"][meta.PROTOCOL_VERSION]], "mcp-method": [body["method"]]}
    field = NAME_FIELD.get(body["method"])
    if field is not None and field in params:
        out["mcp-name"] = [params[field]]
    for name, values in (changes or {}).items():
        if values is None:
            out.pop(name, None)
        else:
            out[name] = values
    return out


def _mismatch(text: str) -> Rejection:
    return Rejection(jsonrpc.HEADER_MISMATCH, f"Header mismatch: {text}")


def _rejected(result: object) -> Rejection:
    assert isinstance(result, Rejection), result
    return result


def _accepted(result: object) -> ModernRequest:
    assert isinstance(result, ModernRequest), result
    return result


# ---------------------------------------------------------------- the returned request


def test_a_conforming_request_is_returned_with_its_method_version_and_capabilities():
    caps = {"sampling": {}, "elicitation": {"form": {}}}
    body = _body("tools/list", {"cursor": "c"}, {meta.CLIENT_CAPABILITIES: caps})
    request = _accepted(validate_request(body, _headers(body)))
    assert request == ModernRequest(body, "tools/list", LATEST_MODERN, caps, None, None)
    assert request.message is body


def test_client_info_is_kept_when_it_is_an_object():
    info = {"name": "ExampleClient", "version": "1.0.0"}
    body = _body(extra_meta={meta.CLIENT_INFO: info})
    assert _accepted(validate_request(body, _headers(body))).client_info == info


@pytest.mark.parametrize("info", ["ExampleClient", ["ExampleClient"], 1, None])
def test_client_info_that_is_not_an_object_is_dropped(info):
    body = _body(extra_meta={meta.CLIENT_INFO: info})
    assert _accepted(validate_request(body, _headers(body))).client_info is None


@pytest.mark.parametrize("level", meta.LOG_LEVELS)
def test_every_known_log_level_is_returned(level):
    body = _body(extra_meta={meta.LOG_LEVEL: level})
    assert _accepted(validate_request(body, _headers(body))).log_level == level


def test_validation_does_not_change_the_body():
    body = _call({"region": "us-west1"}, extra_meta={meta.LOG_LEVEL: "info"})
    snapshot = copy.deepcopy(body)
    validate_request(body, _headers(body, {"mcp-param-region": ["us-west1"]}), lambda name: (REGION,))
    assert body == snapshot


# ---------------------------------------------------------------- row 6: the _meta envelope


@pytest.mark.parametrize(
    "params",
    [
        None,
        {},
        {"_meta": "not an object"},
        {"_meta": {}},
        {"_meta": {meta.CLIENT_CAPABILITIES: {}}},
        {"_meta": {meta.PROTOCOL_VERSION: LATEST_MODERN}},
        {"_meta": {meta.PROTOCOL_VERSION: 20260728, meta.CLIENT_CAPABILITIES: {}}},
        {"_meta": {meta.PROTOCOL_VERSION: None, meta.CLIENT_CAPABILITIES: {}}},
        {"_meta": {meta.PROTOCOL_VERSION: LATEST_MODERN, meta.CLIENT_CAPABILITIES: None}},
        {"_meta": {meta.PROTOCOL_VERSION: LATEST_MODERN, meta.CLIENT_CAPABILITIES: []}},
        {"_meta": {meta.PROTOCOL_VERSION: LATEST_MODERN, meta.CLIENT_CAPABILITIES: "sampling"}},
        # Neither params nor its _meta may be anything but an object, whatever it holds.
        ["_meta"],
        "_meta",
        7,
        {"_meta": [meta.PROTOCOL_VERSION, meta.CLIENT_CAPABILITIES]},
        {"_meta": meta.PROTOCOL_VERSION},
        {"_meta": None},
    ],
)
def test_a_missing_or_mistyped_protocol_version_or_client_capabilities_is_invalid_params(params):
    body = jsonrpc.request(1, "tools/list", params)
    headers = {"mcp-protocol-version": [LATEST_MODERN], "mcp-method": ["tools/list"]}
    rejection = _rejected(validate_request(body, headers))
    assert (rejection.code, rejection.status) == (jsonrpc.INVALID_PARAMS, 400)
    assert rejection == Rejection(
        jsonrpc.INVALID_PARAMS,
        f"params._meta must carry {meta.PROTOCOL_VERSION!r} (string) and {meta.CLIENT_CAPABILITIES!r} (object)",
    )


def test_the_meta_envelope_is_checked_before_any_header():
    body = jsonrpc.request(1, "tools/call", {"name": "get_weather"})
    assert _rejected(validate_request(body, {})).code == jsonrpc.INVALID_PARAMS


# ---------------------------------------------------------------- row 7: standard headers


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("mcp-protocol-version", "MCP-Protocol-Version"),
        ("mcp-method", "Mcp-Method"),
        ("mcp-name", "Mcp-Name"),
    ],
)
def test_a_standard_header_sent_twice_is_a_header_mismatch(header, name):
    body = _call({})
    value = _headers(body)[header][0]
    rejection = _rejected(validate_request(body, _headers(body, {header: [value, value]})))
    assert rejection == _mismatch(f"header {name} appears more than once")
    assert rejection.status == 400


@pytest.mark.parametrize(
    ("changes", "text"),
    [
        ({"mcp-protocol-version": None}, "missing MCP-Protocol-Version header"),
        ({"mcp-protocol-version": []}, "missing MCP-Protocol-Version header"),
        ({"mcp-method": None}, "missing Mcp-Method header"),
        ({"mcp-method": []}, "missing Mcp-Method header"),
        ({"mcp-protocol-version": None, "mcp-method": None}, "missing MCP-Protocol-Version header"),
    ],
)
def test_a_missing_protocol_version_or_method_header_is_a_header_mismatch(changes, text):
    body = _body()
    rejection = _rejected(validate_request(body, _headers(body, changes)))
    assert rejection == _mismatch(text)
    assert rejection.status == 400


def test_a_duplicated_header_is_reported_before_a_missing_one():
    body = _body()
    changes = {"mcp-protocol-version": None, "mcp-method": ["tools/list", "tools/list"]}
    assert _rejected(validate_request(body, _headers(body, changes))) == _mismatch(
        "header Mcp-Method appears more than once"
    )


@pytest.mark.parametrize("header_version", [LATEST_LEGACY, "2026-07-29", LATEST_MODERN + " "])
def test_a_version_header_that_disagrees_with_the_body_is_a_header_mismatch(header_version):
    body = _body()
    rejection = _rejected(validate_request(body, _headers(body, {"mcp-protocol-version": [header_version]})))
    assert rejection == _mismatch(f"MCP-Protocol-Version {header_version!r} does not match body {LATEST_MODERN!r}")
    assert rejection.status == 400


@pytest.mark.parametrize("header_method", ["prompts/list", "Tools/List", "tools/list/"])
def test_a_method_header_that_disagrees_with_the_body_is_a_header_mismatch_values_being_case_sensitive(
    header_method,
):
    body = _body("tools/list")
    rejection = _rejected(validate_request(body, _headers(body, {"mcp-method": [header_method]})))
    assert rejection == _mismatch(f"Mcp-Method {header_method!r} does not match body method 'tools/list'")
    assert rejection.status == 400


def test_header_names_are_matched_case_insensitively():
    body = _call({"region": "us-west1"})
    pairs = [
        ("mcp-PROTOCOL-version", LATEST_MODERN),
        ("MCP-METHOD", "tools/call"),
        ("mcp-name", "get_weather"),
        ("MCP-PARAM-REGION", "us-west1"),
    ]
    assert isinstance(validate_request(body, HeaderLookup(CIMultiDict(pairs)), lambda name: (REGION,)), ModernRequest)


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("tools/call", {"name": "get_weather", "arguments": {}}),
        ("prompts/get", {"name": "greet"}),
        ("resources/read", {"uri": "file:///projects/myapp/config.json"}),
    ],
)
def test_a_name_bearing_method_without_mcp_name_is_a_header_mismatch(method, params):
    body = _body(method, params)
    rejection = _rejected(validate_request(body, _headers(body, {"mcp-name": None})))
    assert rejection == _mismatch(f"missing Mcp-Name header (required for {method})")
    assert rejection.status == 400


@pytest.mark.parametrize(
    ("method", "params", "field"),
    [
        ("tools/call", {"name": "get_weather"}, "name"),
        ("prompts/get", {"name": "get_weather"}, "name"),
        ("resources/read", {"uri": "get_weather"}, "uri"),
    ],
)
def test_an_mcp_name_that_disagrees_with_the_name_or_uri_is_a_header_mismatch(method, params, field):
    body = _body(method, params)
    rejection = _rejected(validate_request(body, _headers(body, {"mcp-name": ["get_forecast"]})))
    assert rejection == _mismatch(f"Mcp-Name 'get_forecast' does not match body {field} 'get_weather'")
    assert rejection.status == 400


def test_an_mcp_name_for_a_call_without_a_name_is_a_header_mismatch():
    body = _body("tools/call", {"arguments": {}})
    rejection = _rejected(validate_request(body, _headers(body, {"mcp-name": ["x"]})))
    assert rejection == _mismatch("Mcp-Name 'x' does not match body name None")


@pytest.mark.parametrize(
    ("method", "params", "header"),
    [
        ("tools/call", {"name": HELLO}, HELLO_B64),
        ("prompts/get", {"name": " padded "}, "=?base64?IHBhZGRlZCA=?="),
        ("resources/read", {"uri": "file:///données/é.txt"}, "=?base64?ZmlsZTovLy9kb25uw6llcy/DqS50eHQ=?="),
        ("tools/call", {"name": "=?base64?literal?="}, "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="),
    ],
)
def test_a_base64_sentinel_mcp_name_is_decoded_before_the_comparison(method, params, header):
    body = _body(method, params)
    assert isinstance(validate_request(body, _headers(body, {"mcp-name": [header]})), ModernRequest)


def test_a_base64_sentinel_mcp_name_that_decodes_to_another_name_is_a_header_mismatch():
    body = _body("tools/call", {"name": "Hello"})
    rejection = _rejected(validate_request(body, _headers(body, {"mcp-name": [HELLO_B64]})))
    assert rejection == _mismatch(f"Mcp-Name {HELLO!r} does not match body name 'Hello'")


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("=?base64?not base64!?=", "not base64!"),
        ("=?base64?SGk?=", "SGk"),  # missing padding
        (NOT_UTF8_B64, "\ufffd"),  # valid base64 of bytes that are not UTF-8
        ("=?base64?literal?=", "=?base64?literal?="),  # a sentinel look-alike the client had to encode
    ],
)
def test_an_mcp_name_sentinel_with_invalid_base64_or_utf8_is_a_header_mismatch(header, name):
    body = _body("tools/call", {"name": name})
    rejection = _rejected(validate_request(body, _headers(body, {"mcp-name": [header]})))
    assert rejection.code == jsonrpc.HEADER_MISMATCH
    assert rejection.status == 400
    assert rejection.message.startswith("Header mismatch: Mcp-Name: invalid base64 header value")


def test_methods_without_a_name_field_need_no_mcp_name():
    body = _body("resources/list")
    assert "mcp-name" not in _headers(body)
    assert isinstance(validate_request(body, _headers(body)), ModernRequest)


# ---------------------------------------------------------------- row 8: the version


@pytest.mark.parametrize("version", ["2099-01-01", LATEST_LEGACY, "2026-7-28", ""])
def test_a_version_the_proxy_does_not_speak_is_unsupported_with_the_supported_list(version):
    body = _body(version=version)
    rejection = _rejected(validate_request(body, _headers(body)))
    assert rejection == Rejection(
        jsonrpc.UNSUPPORTED_PROTOCOL_VERSION,
        f"Unsupported protocol version: {version}",
        {"supported": list(MODERN_VERSIONS), "requested": version},
    )
    assert rejection.status == 400
    assert rejection.data["supported"] == [LATEST_MODERN]


def test_header_checks_come_before_the_version_check():
    body = _body(version="2099-01-01")
    rejection = _rejected(validate_request(body, _headers(body, {"mcp-method": None})))
    assert rejection == _mismatch("missing Mcp-Method header")


# ---------------------------------------------------------------- row 9: the log level


@pytest.mark.parametrize("level", ["verbose", "INFO", "", 3, ["info"], {"level": "info"}])
def test_an_unknown_log_level_is_invalid_params(level):
    body = _body(extra_meta={meta.LOG_LEVEL: level})
    rejection = _rejected(validate_request(body, _headers(body)))
    assert rejection == Rejection(jsonrpc.INVALID_PARAMS, f"unknown log level {level!r}")
    assert rejection.status == 400


def test_the_version_check_comes_before_the_log_level_check():
    body = _body(extra_meta={meta.LOG_LEVEL: "verbose"}, version="2099-01-01")
    assert _rejected(validate_request(body, _headers(body))).code == jsonrpc.UNSUPPORTED_PROTOCOL_VERSION


@pytest.mark.parametrize(
    "extensions", ["io.modelcontextprotocol/ui", ["io.modelcontextprotocol/ui"], {"com.example/x": True}]
)
def test_malformed_declared_extensions_are_invalid_params(extensions):
    body = _body(extra_meta={meta.CLIENT_CAPABILITIES: {"extensions": extensions}})
    rejection = _rejected(validate_request(body, _headers(body)))
    assert rejection.code == jsonrpc.INVALID_PARAMS and rejection.status == 400
    assert "capabilities.extensions" in rejection.message


def test_declared_extensions_are_kept_on_the_request_as_sent():
    caps = {"extensions": {"io.modelcontextprotocol/ui": {"mimeTypes": ["text/html;profile=mcp-app"]}}}
    body = _body(extra_meta={meta.CLIENT_CAPABILITIES: caps})
    request = validate_request(body, _headers(body))
    assert isinstance(request, ModernRequest) and request.capabilities == caps


# ---------------------------------------------------------------- row 10: Mcp-Param-* headers


def _check(
    arguments: object, param_headers: dict[str, list[str]], specs: tuple[ParamHeader, ...] = (REGION,)
) -> ModernRequest | Rejection:
    body = _call(arguments)
    return validate_request(body, _headers(body, dict(param_headers)), lambda name: specs)


def test_the_tool_annotations_are_looked_up_by_the_called_tool_name():
    asked: list[str] = []

    def lookup(name: str) -> tuple[ParamHeader, ...]:
        asked.append(name)
        return (REGION,)

    body = _call({"region": "us-west1"}, name="execute_sql")
    assert isinstance(validate_request(body, _headers(body, {"mcp-param-region": ["us-west1"]}), lookup), ModernRequest)
    assert asked == ["execute_sql"]


def test_without_a_lookup_no_param_header_is_checked_here():
    body = _call({"region": "us-west1"})
    assert isinstance(validate_request(body, _headers(body, {"mcp-param-region": ["us-east1"]})), ModernRequest)
    assert _rejected(_check({"region": "us-west1"}, {"mcp-param-region": ["us-east1"]})).code == jsonrpc.HEADER_MISMATCH


@pytest.mark.parametrize("method", ["tools/list", "prompts/get", "resources/read"])
def test_annotations_are_looked_up_only_for_tools_call(method):
    def lookup(name: str) -> tuple[ParamHeader, ...]:
        raise AssertionError(f"looked up {name!r} for {method}")

    body = _body(method, {"name": "get_weather", "uri": "get_weather", "arguments": {"region": "x"}})
    assert isinstance(validate_request(body, _headers(body), lookup), ModernRequest)


def test_without_annotations_a_tools_call_needs_and_checks_no_param_header():
    body = _call({"region": "us-west1"})
    assert isinstance(validate_request(body, _headers(body)), ModernRequest)
    assert isinstance(validate_request(body, _headers(body, {"mcp-param-region": ["elsewhere"]})), ModernRequest)


@pytest.mark.parametrize(
    ("spec", "arguments", "header"),
    [
        (REGION, {"region": "us-west1"}, "us-west1"),
        (REGION, {"region": HELLO}, HELLO_B64),
        (REGION, {"region": "line1\nline2"}, "=?base64?bGluZTEKbGluZTI=?="),
        (REGION, {"region": ""}, ""),
        (ParamHeader("Count", ("count",), "integer"), {"count": 42}, "42"),
        (ParamHeader("Count", ("count",), "integer"), {"count": 42}, "42.0"),
        (ParamHeader("Count", ("count",), "integer"), {"count": 42.0}, "42"),
        (ParamHeader("Count", ("count",), "integer"), {"count": -7}, "-7"),
        (ParamHeader("Count", ("count",), "integer"), {"count": 0}, "=?base64?MA==?="),
        (ParamHeader("Dry-Run", ("dry_run",), "boolean"), {"dry_run": True}, "true"),
        (ParamHeader("Dry-Run", ("dry_run",), "boolean"), {"dry_run": False}, "false"),
        (ParamHeader("Zone", ("target", "zone"), "string"), {"target": {"zone": "eu"}}, "eu"),
    ],
)
def test_a_param_header_matching_its_argument_is_accepted(spec, arguments, header):
    result = _check(arguments, {"mcp-param-" + spec.name.lower(): [header]}, (spec,))
    assert isinstance(result, ModernRequest)


@pytest.mark.parametrize(
    ("spec", "arguments", "header"),
    [
        (REGION, {"region": "us-west1"}, "us-east1"),
        (REGION, {"region": "us-west1"}, "US-WEST1"),
        (REGION, {"region": "42"}, "42.0"),  # strings compare as strings
        (REGION, {"region": "Hello"}, HELLO_B64),
        (ParamHeader("Count", ("count",), "integer"), {"count": 42}, "43"),
        (ParamHeader("Count", ("count",), "integer"), {"count": 42}, "forty-two"),
        (ParamHeader("Count", ("count",), "integer"), {"count": 42}, ""),
        (ParamHeader("Dry-Run", ("dry_run",), "boolean"), {"dry_run": True}, "True"),
        (ParamHeader("Dry-Run", ("dry_run",), "boolean"), {"dry_run": True}, "1"),
        (ParamHeader("Dry-Run", ("dry_run",), "boolean"), {"dry_run": True}, "false"),
        (ParamHeader("Dry-Run", ("dry_run",), "boolean"), {"dry_run": False}, "0"),
        (ParamHeader("Dry-Run", ("dry_run",), "boolean"), {"dry_run": False}, "true"),
        (ParamHeader("Zone", ("target", "zone"), "string"), {"target": {"zone": "eu"}}, "us"),
    ],
)
def test_a_param_header_that_disagrees_with_its_argument_is_a_header_mismatch(spec, arguments, header):
    name = "Mcp-Param-" + spec.name
    value = arguments
    for step in spec.path:
        value = value[step]
    decoded = HELLO if header == HELLO_B64 else header
    rejection = _rejected(_check(arguments, {name.lower(): [header]}, (spec,)))
    assert rejection == _mismatch(f"{name} {decoded!r} does not match the argument value {value!r}")
    assert rejection.status == 400


@pytest.mark.parametrize(
    ("spec", "arguments", "path"),
    [
        (REGION, {"region": "us-west1"}, "region"),
        (REGION, {"region": ""}, "region"),
        (ParamHeader("Dry-Run", ("dry_run",), "boolean"), {"dry_run": False}, "dry_run"),
        (ParamHeader("Count", ("count",), "integer"), {"count": 0}, "count"),
        (ParamHeader("Zone", ("target", "zone"), "string"), {"target": {"zone": "eu"}}, "target.zone"),
    ],
)
def test_an_argument_present_without_its_param_header_is_a_header_mismatch(spec, arguments, path):
    rejection = _rejected(_check(arguments, {}, (spec,)))
    assert rejection == _mismatch(f"missing Mcp-Param-{spec.name} header for argument {path}")
    assert rejection.status == 400


ABSENT_ARGUMENTS = [
    pytest.param(None, id="no-arguments"),
    pytest.param({}, id="empty-arguments"),
    pytest.param({"region": None}, id="null-argument"),
    pytest.param({"query": "SELECT 1"}, id="other-arguments"),
    pytest.param(["us-west1"], id="arguments-not-an-object"),
]


@pytest.mark.parametrize("arguments", ABSENT_ARGUMENTS)
def test_an_absent_or_null_argument_needs_no_param_header(arguments):
    assert isinstance(_check(arguments, {}), ModernRequest)


@pytest.mark.parametrize("arguments", ABSENT_ARGUMENTS)
def test_a_param_header_sent_for_an_absent_or_null_argument_is_a_header_mismatch(arguments):
    rejection = _rejected(_check(arguments, {"mcp-param-region": ["us-west1"]}))
    assert rejection == _mismatch("Mcp-Param-Region sent but the argument is absent")
    assert rejection.status == 400


@pytest.mark.parametrize(
    "arguments", [{"target": "eu"}, {"target": None}, {"target": {}}, {"target": ["eu"]}, {"zone": "eu"}]
)
def test_a_nested_argument_behind_a_missing_or_non_object_step_is_absent(arguments):
    zone = ParamHeader("Zone", ("target", "zone"), "string")
    assert isinstance(_check(arguments, {}, (zone,)), ModernRequest)
    assert _rejected(_check(arguments, {"mcp-param-zone": ["eu"]}, (zone,))) == _mismatch(
        "Mcp-Param-Zone sent but the argument is absent"
    )


@pytest.mark.parametrize("arguments", [{"region": "us-west1"}, {}])
def test_a_param_header_sent_twice_is_a_header_mismatch(arguments):
    rejection = _rejected(_check(arguments, {"mcp-param-region": ["us-west1", "us-west1"]}))
    assert rejection == _mismatch("header Mcp-Param-Region appears more than once")
    assert rejection.status == 400


@pytest.mark.parametrize(
    ("header", "region"),
    [("=?base64?not base64!?=", "not base64!"), ("=?base64?SGk?=", "Hi"), (NOT_UTF8_B64, "\ufffd")],
)
def test_a_param_header_sentinel_with_invalid_base64_or_utf8_is_a_header_mismatch(header, region):
    rejection = _rejected(_check({"region": region}, {"mcp-param-region": [header]}))
    assert rejection.code == jsonrpc.HEADER_MISMATCH
    assert rejection.status == 400
    assert rejection.message.startswith("Header mismatch: Mcp-Param-Region: invalid base64 header value")


def test_param_headers_the_tool_does_not_annotate_are_ignored():
    result = _check({"region": "us-west1"}, {"mcp-param-region": ["us-west1"], "mcp-param-other": ["x", "y"]})
    assert isinstance(result, ModernRequest)


def test_every_annotated_argument_is_checked_not_only_the_first():
    specs = (REGION, ParamHeader("Count", ("count",), "integer"))
    arguments = {"region": "us-west1", "count": 3}
    both = {"mcp-param-region": ["us-west1"], "mcp-param-count": ["3"]}
    assert isinstance(_check(arguments, both, specs), ModernRequest)
    assert _rejected(_check(arguments, {"mcp-param-region": ["us-west1"]}, specs)) == _mismatch(
        "missing Mcp-Param-Count header for argument count"
    )


def test_the_log_level_check_comes_before_the_param_header_check():
    body = _call({"region": "us-west1"}, extra_meta={meta.LOG_LEVEL: "verbose"})
    rejection = _rejected(validate_request(body, _headers(body), lambda name: (REGION,)))
    assert rejection.code == jsonrpc.INVALID_PARAMS


# ---------------------------------------------------------------- HeaderLookup


def test_header_lookup_gives_every_value_of_a_name_in_order_whatever_its_case():
    pairs = [
        ("Host", "proxy.example"),
        ("MCP-Protocol-Version", LATEST_MODERN),
        ("Content-Type", "application/json"),
        ("Mcp-Param-Region", "us-west1"),
        ("X-Mcp-Param-Region", "spoofed"),
        ("mcp-param-region", "us-east1"),
        ("Mcp-Session-Id", "sid-1"),
        ("Mcp", "no dash"),
    ]
    headers = HeaderLookup(CIMultiDict(pairs))
    assert headers.get("mcp-protocol-version") == [LATEST_MODERN]
    assert headers.get("mcp-param-region") == ["us-west1", "us-east1"]
    assert headers.get("mcp-session-id") == ["sid-1"]
    assert headers.get("mcp-method") is None


def test_header_lookup_of_no_such_header_is_none():
    assert HeaderLookup(CIMultiDict([])).get("mcp-method") is None
    assert HeaderLookup(CIMultiDict([("Accept", "application/json, text/event-stream")])).get("mcp-method") is None


# ---------------------------------------------------------------- row 11: method_problem

ALL_CAPABILITIES = {"tools": {}, "prompts": {}, "resources": {}, "completions": {}, "logging": {}}
REMOVED = [
    "initialize",
    "ping",
    "logging/setLevel",
    "resources/subscribe",
    "resources/unsubscribe",
    "tasks/list",
    "tasks/result",
    "tasks/get",
    "tasks/cancel",
    "tasks/anything",
]
BACKED = [
    ("tools/list", "tools"),
    ("tools/call", "tools"),
    ("prompts/list", "prompts"),
    ("prompts/get", "prompts"),
    ("resources/list", "resources"),
    ("resources/templates/list", "resources"),
    ("resources/read", "resources"),
    ("completion/complete", "completions"),
]


@pytest.mark.parametrize("capabilities", [None, {}, ALL_CAPABILITIES])
@pytest.mark.parametrize("method", REMOVED)
def test_methods_2026_07_28_removed_are_method_not_found_whatever_the_server_declares(method, capabilities):
    rejection = method_problem(method, capabilities)
    assert rejection == Rejection(jsonrpc.METHOD_NOT_FOUND, f"Method not found: {method}")
    assert rejection.status == 404


@pytest.mark.parametrize(("method", "capability"), BACKED)
def test_a_method_backed_by_a_capability_the_server_lacks_is_method_not_found(method, capability):
    others = {name: {} for name in ALL_CAPABILITIES if name != capability}
    rejection = method_problem(method, others)
    assert rejection == Rejection(
        jsonrpc.METHOD_NOT_FOUND, f"Method not found: {method} (the server has no {capability})"
    )
    assert rejection.status == 404


@pytest.mark.parametrize(("method", "capability"), BACKED)
def test_a_method_backed_by_a_declared_capability_is_allowed(method, capability):
    assert method_problem(method, {capability: {}}) is None


@pytest.mark.parametrize("method", [method for method, _ in BACKED])
def test_without_known_server_capabilities_only_removed_methods_are_refused(method):
    assert method_problem(method, None) is None


@pytest.mark.parametrize("method", ["server/discover", "subscriptions/listen", "com.example/custom", "tasks"])
def test_methods_no_capability_backs_are_allowed_even_by_a_server_declaring_nothing(method):
    assert method_problem(method, {}) is None
