"""Modern payloads rendered for each legacy revision (docs/translation.md §3.5; proxy/protocol/downgrade.py)."""

from __future__ import annotations

import copy

import pytest

from proxy.protocol import downgrade, jsonrpc
from proxy.protocol.versions import LATEST_MODERN, LEGACY_VERSIONS
from tests.support.schema import errors, server_message_errors

from .modern_fixtures import (
    AUDIO,
    CACHE_HINTS,
    COUNT_TOOL,
    EMBEDDED,
    ICONS,
    IMAGE,
    MODERN_ENVELOPE,
    RESOURCE_LINK,
    TEXT,
    TOOLS_CALL,
    TOOLS_LIST,
    WEATHER_TOOL,
)


def test_the_modern_fixtures_are_valid_2026_07_28_results():
    assert errors(LATEST_MODERN, "ListToolsResult", {**TOOLS_LIST, **MODERN_ENVELOPE, **CACHE_HINTS}) == []
    assert errors(LATEST_MODERN, "CallToolResult", {**TOOLS_CALL, **MODERN_ENVELOPE}) == []


# ---------------------------------------------------------------- tools/list


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_downgraded_tools_list_validates_for_the_session_revision(version):
    out = downgrade.result("tools/list", TOOLS_LIST, version)
    assert server_message_errors(version, jsonrpc.result_response(1, out), "tools/list") == []


def _weather(version: str) -> dict:
    out = downgrade.result("tools/list", TOOLS_LIST, version)
    return next(t for t in out["tools"] if t["name"] == WEATHER_TOOL["name"])


def test_tools_for_2024_11_05_lose_title_output_schema_meta_annotations_icons_and_execution():
    tool = _weather("2024-11-05")
    for field in ("title", "outputSchema", "_meta", "annotations", "icons", "execution"):
        assert field not in tool
    assert tool["inputSchema"] == WEATHER_TOOL["inputSchema"]
    assert tool["description"] == WEATHER_TOOL["description"]


def test_tools_for_2025_03_26_keep_annotations_but_lose_title_output_schema_and_meta():
    tool = _weather("2025-03-26")
    assert tool["annotations"] == WEATHER_TOOL["annotations"]
    for field in ("title", "outputSchema", "_meta", "icons", "execution"):
        assert field not in tool


def test_tools_for_2025_06_18_keep_title_output_schema_and_meta_but_lose_icons():
    tool = _weather("2025-06-18")
    for field in ("title", "outputSchema", "_meta", "annotations"):
        assert tool[field] == WEATHER_TOOL[field]
    assert "icons" not in tool
    assert "execution" not in tool


def test_tools_for_2025_11_25_keep_icons_but_never_advertise_task_execution():
    tool = _weather("2025-11-25")
    assert tool["icons"] == ICONS
    assert tool["title"] == WEATHER_TOOL["title"]
    assert "execution" not in tool


@pytest.mark.parametrize("version", ["2025-06-18", "2025-11-25"])
def test_an_output_schema_without_an_object_root_is_dropped(version):
    out = downgrade.result("tools/list", TOOLS_LIST, version)
    count = next(t for t in out["tools"] if t["name"] == COUNT_TOOL["name"])
    assert "outputSchema" not in count
    assert count["inputSchema"] == COUNT_TOOL["inputSchema"]


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_tools_list_keeps_unknown_fields_order_and_cursor_and_leaves_its_input_alone(version):
    payload = copy.deepcopy(TOOLS_LIST)
    out = downgrade.result("tools/list", payload, version)
    assert payload == TOOLS_LIST
    assert [t["name"] for t in out["tools"]] == [t["name"] for t in TOOLS_LIST["tools"]]
    assert out["nextCursor"] == TOOLS_LIST["nextCursor"]
    assert _weather(version)["x-vendor-field"] == WEATHER_TOOL["x-vendor-field"]


# ---------------------------------------------------------------- tools/call


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_downgraded_tools_call_validates_for_the_session_revision(version):
    out = downgrade.result("tools/call", TOOLS_CALL, version)
    assert server_message_errors(version, jsonrpc.result_response(1, out), "tools/call") == []


def test_audio_becomes_a_text_note_for_2024_11_05():
    out = downgrade.result("tools/call", TOOLS_CALL, "2024-11-05")
    audio_slot = out["content"][TOOLS_CALL["content"].index(AUDIO)]
    assert audio_slot["type"] == "text"
    assert AUDIO["mimeType"] in audio_slot["text"]
    assert all(block.get("type") != "audio" for block in out["content"])


@pytest.mark.parametrize("version", ["2025-03-26", "2025-06-18", "2025-11-25"])
def test_audio_is_kept_from_2025_03_26_on(version):
    out = downgrade.result("tools/call", TOOLS_CALL, version)
    assert AUDIO in out["content"]


@pytest.mark.parametrize("version", ["2024-11-05", "2025-03-26"])
def test_resource_links_become_text_carrying_the_uri_before_2025_06_18(version):
    out = downgrade.result("tools/call", TOOLS_CALL, version)
    slot = out["content"][TOOLS_CALL["content"].index(RESOURCE_LINK)]
    assert slot["type"] == "text"
    assert RESOURCE_LINK["uri"] in slot["text"]
    assert all(block.get("type") != "resource_link" for block in out["content"])


def test_resource_links_are_kept_without_icons_for_2025_06_18():
    out = downgrade.result("tools/call", TOOLS_CALL, "2025-06-18")
    slot = out["content"][TOOLS_CALL["content"].index(RESOURCE_LINK)]
    assert slot == {k: v for k, v in RESOURCE_LINK.items() if k != "icons"}


def test_resource_links_keep_icons_for_2025_11_25():
    out = downgrade.result("tools/call", TOOLS_CALL, "2025-11-25")
    assert RESOURCE_LINK in out["content"]


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_text_image_and_embedded_resources_pass_unchanged(version):
    out = downgrade.result("tools/call", TOOLS_CALL, version)
    for block in (TEXT, IMAGE, EMBEDDED):
        assert out["content"][TOOLS_CALL["content"].index(block)] == block
    assert len(out["content"]) == len(TOOLS_CALL["content"])


@pytest.mark.parametrize(
    ("version", "kept"), [("2024-11-05", False), ("2025-03-26", False), ("2025-06-18", True), ("2025-11-25", True)]
)
def test_structured_content_is_kept_only_from_2025_06_18_on(version, kept):
    out = downgrade.result("tools/call", TOOLS_CALL, version)
    assert ("structuredContent" in out) is kept
    if kept:
        assert out["structuredContent"] == TOOLS_CALL["structuredContent"]


@pytest.mark.parametrize("structured", [[1, 2], "text", 3, None, True])
@pytest.mark.parametrize("version", ["2025-06-18", "2025-11-25"])
def test_structured_content_that_is_not_an_object_is_dropped(version, structured):
    payload = {**TOOLS_CALL, "structuredContent": structured}
    out = downgrade.result("tools/call", payload, version)
    assert "structuredContent" not in out
    assert out["content"]  # the text content remains
    assert server_message_errors(version, jsonrpc.result_response(1, out), "tools/call") == []


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_tools_call_keeps_is_error_meta_and_unknown_fields_and_leaves_its_input_alone(version):
    payload = copy.deepcopy(TOOLS_CALL)
    out = downgrade.result("tools/call", payload, version)
    assert payload == TOOLS_CALL
    assert out["isError"] is False
    assert out["_meta"] == TOOLS_CALL["_meta"]
    assert out["x-vendor-field"] == TOOLS_CALL["x-vendor-field"]


# ---------------------------------------------------------------- other results


def test_prompt_messages_get_their_content_downgraded():
    payload = {
        "description": "d",
        "messages": [
            {"role": "user", "content": AUDIO},
            {"role": "assistant", "content": RESOURCE_LINK},
            {"role": "user", "content": TEXT},
        ],
    }
    snapshot = copy.deepcopy(payload)
    out = downgrade.result("prompts/get", payload, "2024-11-05")
    assert [m["content"]["type"] for m in out["messages"]] == ["text", "text", "text"]
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "user"]
    assert payload == snapshot
    assert server_message_errors("2024-11-05", jsonrpc.result_response(1, out), "prompts/get") == []


@pytest.mark.parametrize(
    ("method", "field", "item"),
    [
        ("resources/list", "resources", {"uri": "mem://a", "name": "a", "icons": ICONS}),
        ("resources/templates/list", "resourceTemplates", {"uriTemplate": "mem://{x}", "name": "t", "icons": ICONS}),
        ("prompts/list", "prompts", {"name": "p", "icons": ICONS}),
    ],
)
@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_listed_items_lose_icons_before_2025_11_25(method, field, item, version):
    out = downgrade.result(method, {field: [item], "nextCursor": "c"}, version)
    listed = out[field][0]
    assert ("icons" in listed) is (version == "2025-11-25")
    assert {k: v for k, v in listed.items() if k != "icons"} == {k: v for k, v in item.items() if k != "icons"}
    assert out["nextCursor"] == "c"
    assert server_message_errors(version, jsonrpc.result_response(1, out), method) == []


@pytest.mark.parametrize("version", ["2024-11-05", "2025-03-26", "2025-06-18"])
def test_implementation_info_loses_icons_description_and_website_before_2025_11_25(version):
    info = {
        "name": "srv",
        "version": "1.0",
        "title": "Server",
        "icons": ICONS,
        "description": "d",
        "websiteUrl": "https://example.com",
    }
    assert downgrade.implementation(info, version) == {"name": "srv", "version": "1.0", "title": "Server"}
    assert downgrade.implementation(info, "2025-11-25") == info


# ---------------------------------------------------------------- progress


def test_progress_loses_its_message_for_2024_11_05_only():
    params = {"progressToken": "t", "progress": 3, "total": 10, "message": "copying", "_meta": {"k": 1}}
    snapshot = copy.deepcopy(params)
    old = downgrade.progress_params(params, "2024-11-05")
    assert old == {"progressToken": "t", "progress": 3, "total": 10, "_meta": {"k": 1}}
    assert params == snapshot
    assert server_message_errors("2024-11-05", jsonrpc.notification("notifications/progress", old)) == []
    for version in ("2025-03-26", "2025-06-18", "2025-11-25"):
        assert downgrade.progress_params(params, version) == params


# ---------------------------------------------------------------- elicitation (SEP-1330 enum variants)

ELICIT_2025_11_25 = {
    "mode": "form",
    "message": "Configure the run",
    "requestedSchema": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "title": "Name", "minLength": 1, "default": "run"},
            "count": {"type": "integer", "minimum": 1},
            "verbose": {"type": "boolean", "default": False},
            "plain_enum": {"type": "string", "enum": ["a", "b"]},
            "legacy_titled": {"type": "string", "enum": ["a", "b"], "enumNames": ["A", "B"]},
            "titled_single": {
                "type": "string",
                "title": "Colour",
                "oneOf": [{"const": "r", "title": "Red"}, {"const": "g", "title": "Green"}],
                "default": "r",
            },
            "untitled_multi": {
                "type": "array",
                "items": {"type": "string", "enum": ["x", "y", "z"]},
                "minItems": 1,
                "maxItems": 2,
                "default": ["x"],
            },
            "titled_multi": {
                "type": "array",
                "title": "Sizes",
                "items": {"anyOf": [{"const": "s", "title": "Small"}, {"const": "l", "title": "Large"}]},
            },
        },
        "required": ["name"],
    },
}


def test_the_elicitation_fixture_is_a_valid_2026_07_28_input_request():
    assert errors(LATEST_MODERN, "ElicitRequest", {"method": "elicitation/create", "params": ELICIT_2025_11_25}) == []


def test_elicitation_params_for_2025_06_18_validate_as_an_elicit_request():
    params = downgrade.elicitation_params(ELICIT_2025_11_25, "2025-06-18")
    request = jsonrpc.request(9, "elicitation/create", params)
    assert server_message_errors("2025-06-18", request) == []


def test_elicitation_for_2025_06_18_drops_mode_and_leaves_its_input_alone():
    params = copy.deepcopy(ELICIT_2025_11_25)
    out = downgrade.elicitation_params(params, "2025-06-18")
    assert "mode" not in out
    assert out["message"] == ELICIT_2025_11_25["message"]
    assert out["requestedSchema"]["required"] == ["name"]
    assert params == ELICIT_2025_11_25


def test_titled_single_select_becomes_enum_with_enum_names():
    prop = downgrade.elicitation_params(ELICIT_2025_11_25, "2025-06-18")["requestedSchema"]["properties"][
        "titled_single"
    ]
    assert prop["type"] == "string"
    assert prop["enum"] == ["r", "g"]
    assert prop["enumNames"] == ["Red", "Green"]
    assert "oneOf" not in prop
    assert prop["title"] == "Colour"


@pytest.mark.parametrize(("name", "values"), [("untitled_multi", ["x", "y", "z"]), ("titled_multi", ["s", "l"])])
def test_multi_select_becomes_a_single_choice_string_enum(name, values):
    prop = downgrade.elicitation_params(ELICIT_2025_11_25, "2025-06-18")["requestedSchema"]["properties"][name]
    assert prop["type"] == "string"
    assert prop["enum"] == values
    for gone in ("items", "minItems", "maxItems", "default"):
        assert gone not in prop
    assert errors("2025-06-18", "EnumSchema", prop) == []


@pytest.mark.parametrize("name", ["name", "count", "verbose", "plain_enum", "legacy_titled"])
def test_schemas_2025_06_18_already_knows_are_unchanged(name):
    prop = downgrade.elicitation_params(ELICIT_2025_11_25, "2025-06-18")["requestedSchema"]["properties"][name]
    assert prop == ELICIT_2025_11_25["requestedSchema"]["properties"][name]


def test_elicitation_for_2025_11_25_is_unchanged():
    assert downgrade.elicitation_params(ELICIT_2025_11_25, "2025-11-25") == ELICIT_2025_11_25


# ---------------------------------------------------------------- sampling


def test_sampling_drops_tools_and_tool_choice_before_2025_11_25():
    params = {
        "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
        "maxTokens": 10,
        "tools": [{"name": "t", "inputSchema": {"type": "object"}}],
        "toolChoice": {"mode": "auto"},
        "x-vendor": 1,
    }
    snapshot = copy.deepcopy(params)
    out = downgrade.sampling_params(params, "2025-06-18")
    assert "tools" not in out and "toolChoice" not in out
    assert out["x-vendor"] == 1 and out["maxTokens"] == 10
    assert params == snapshot
    assert server_message_errors("2025-06-18", jsonrpc.request(1, "sampling/createMessage", out)) == []
    assert downgrade.sampling_params(params, "2025-11-25") == params


# ---------------------------------------------------------------- malformed and partial payloads pass as they came


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_content_entries_that_are_not_objects_are_kept_in_place(version):
    payload = {"content": [TEXT, "junk", None, 5], "isError": False}
    out = downgrade.result("tools/call", payload, version)
    assert out["content"] == [TEXT, "junk", None, 5]


@pytest.mark.parametrize("content", ["text", None, {"type": "text", "text": "x"}])
def test_a_content_member_that_is_not_a_list_is_kept_as_it_came(content):
    out = downgrade.result("tools/call", {"content": content, "structuredContent": {"a": 1}}, "2024-11-05")
    assert out == {"content": content}


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_a_tools_call_result_without_content_is_downgraded_all_the_same(version):
    payload = {"structuredContent": {"celsius": 21.5}, "x-vendor-field": 1}
    out = downgrade.result("tools/call", payload, version)
    assert "content" not in out
    assert ("structuredContent" in out) is (version in ("2025-06-18", "2025-11-25"))
    assert out["x-vendor-field"] == 1


@pytest.mark.parametrize(
    ("method", "payload"),
    [
        ("resources/list", {"nextCursor": "c"}),
        ("prompts/list", {"x-vendor": [1]}),
        ("resources/templates/list", {}),
        ("completion/complete", {"completion": {"values": ["a"]}, "icons": ICONS}),
        ("resources/read", {"contents": [{"uri": "mem://a", "text": "t", "icons": ICONS}]}),
    ],
)
def test_results_with_nothing_to_downgrade_are_returned_equal_and_unshared(method, payload):
    snapshot = copy.deepcopy(payload)
    out = downgrade.result(method, payload, "2024-11-05")
    assert out == snapshot
    assert out is not payload


def test_elicitation_params_without_a_usable_schema_only_lose_the_mode():
    for schema in (None, "schema", {"type": "object"}, {"type": "object", "properties": ["a"]}):
        params = {"mode": "form", "message": "m", "requestedSchema": schema, "x-vendor": 1}
        out = downgrade.elicitation_params(params, "2025-06-18")
        assert out == {"message": "m", "requestedSchema": schema, "x-vendor": 1}
    assert downgrade.elicitation_params({"message": "m"}, "2025-06-18") == {"message": "m"}


def test_a_property_that_is_not_an_object_schema_is_kept_as_it_came():
    params = {"message": "m", "requestedSchema": {"type": "object", "properties": {"free": True, "odd": "x"}}}
    out = downgrade.elicitation_params(params, "2025-06-18")
    assert out["requestedSchema"]["properties"] == {"free": True, "odd": "x"}


@pytest.mark.parametrize(
    "prop",
    [
        {"type": "array", "title": "Tags"},
        {"type": "array", "title": "Tags", "items": "string"},
        {"type": "array", "title": "Tags", "items": {"type": "string"}, "minItems": 1},
        {"type": "array", "title": "Tags", "items": {"type": "string", "enum": []}},
        {"type": "array", "title": "Tags", "items": {"anyOf": []}},
    ],
)
def test_a_multi_select_without_choices_becomes_a_plain_single_string(prop):
    params = {"message": "m", "requestedSchema": {"type": "object", "properties": {"tags": prop}}}
    out = downgrade.elicitation_params(params, "2025-06-18")["requestedSchema"]["properties"]["tags"]
    assert out["type"] == "string"
    assert out["title"] == "Tags"
    assert "enum" not in out
    for gone in ("items", "minItems", "maxItems", "default"):
        assert gone not in out
    assert errors("2025-06-18", "PrimitiveSchemaDefinition", out) == []


# ---------------------------------------------------------------- elicitation answers back to the 2025-11-25 shape

MULTI_SCHEMA = {
    "type": "object",
    "properties": {
        "colors": {"type": "array", "items": {"type": "string", "enum": ["red", "blue"]}},
        "name": {"type": "string"},
        "free": True,
    },
}


def test_a_single_answer_to_a_multi_select_goes_back_as_a_list():
    content = {"colors": "red", "name": "Ada", "x-extra": 1}
    snapshot = copy.deepcopy(content)
    out = downgrade.elicitation_content(MULTI_SCHEMA, content, "2025-06-18")
    assert out == {"colors": ["red"], "name": "Ada", "x-extra": 1}
    assert content == snapshot


@pytest.mark.parametrize("content", [{"colors": ["red"], "name": "Ada"}, {"name": "Ada"}, {}])
def test_answers_already_in_shape_or_absent_are_left_alone(content):
    assert downgrade.elicitation_content(MULTI_SCHEMA, content, "2025-06-18") == content


@pytest.mark.parametrize("schema", [None, "schema", {"type": "object"}, {"type": "object", "properties": ["colors"]}])
def test_answers_to_a_form_without_properties_are_left_alone(schema):
    content = {"colors": "red"}
    assert downgrade.elicitation_content(schema, content, "2025-06-18") is content


@pytest.mark.parametrize("content", [None, "red", ["red"]])
def test_an_answer_that_is_not_an_object_is_left_alone(content):
    assert downgrade.elicitation_content(MULTI_SCHEMA, content, "2025-06-18") == content


def test_a_2025_11_25_answer_is_never_rewritten():
    content = {"colors": "red"}
    assert downgrade.elicitation_content(MULTI_SCHEMA, content, "2025-11-25") is content


def test_the_latest_legacy_revision_takes_every_content_block_as_it_is() -> None:
    blocks = [
        {"type": "audio", "data": "AA==", "mimeType": "audio/wav"},
        {"type": "resource_link", "uri": "file:///a", "name": "a", "icons": [{"src": "https://x/i.png"}]},
        {"type": "text", "text": "hi", "icons": []},
    ]
    kept = copy.deepcopy(blocks)
    out = downgrade.result("tools/call", {"content": blocks}, LEGACY_VERSIONS[0])
    assert out["content"] == kept
    for older in LEGACY_VERSIONS[1:]:  # each older one changes at least one of them
        assert downgrade.result("tools/call", {"content": blocks}, older)["content"] != kept
    assert blocks == kept
