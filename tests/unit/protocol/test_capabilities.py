"""Capability tables A, B and C of docs/translation.md and the extensions every direction carries
(proxy/protocol/capabilities.py)."""

from __future__ import annotations

import copy

import pytest

from proxy.protocol.capabilities import (
    MAX_EXTENSIONS,
    carried_extensions,
    describe_required,
    elicitation_modes,
    extensions_problem,
    legacy_client_capabilities,
    legacy_server_capabilities,
    missing_input_capability,
    modern_client_capabilities,
    modern_server_capabilities,
)
from proxy.protocol.versions import LATEST_LEGACY, LATEST_MODERN, LEGACY_VERSIONS
from tests.support.schema import errors

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
UI = "io.modelcontextprotocol/ui"  # MCP Apps
UI_SETTINGS = {"mimeTypes": ["text/html;profile=mcp-app"]}

MODERN_SERVER_CAPS = {
    "tools": {"listChanged": True},
    "prompts": {"listChanged": False},
    "resources": {"subscribe": True, "listChanged": True},
    "completions": {},
    "logging": {},
    "experimental": {"vendor.feature": {"level": 2}},
    "extensions": {TASKS_EXTENSION: {}, "com.example/other": {"x": 1}},
}

LEGACY_CLIENT_CAPS = {
    "extensions": {UI: UI_SETTINGS, "com.example/trace": {"depth": {"max": 3}}},
    "roots": {"listChanged": True},
    "sampling": {"context": {}, "tools": {}},
    "elicitation": {"form": {}, "url": {}},
    "tasks": {"requests": {"sampling": {"createMessage": {}}}},
    "experimental": {"vendor.client": {"on": True}},
}


# ---------------------------------------------------------------- table A


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_table_a_result_validates_as_legacy_server_capabilities(version):
    caps = legacy_server_capabilities(MODERN_SERVER_CAPS, version)
    assert errors(version, "ServerCapabilities", caps) == []


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_table_a_copies_tools_prompts_resources_logging_and_experimental(version):
    caps = legacy_server_capabilities(MODERN_SERVER_CAPS, version)
    assert caps["tools"] == {"listChanged": True}
    assert caps["prompts"] == {"listChanged": False}
    assert caps["resources"] == {"subscribe": True, "listChanged": True}
    assert caps["logging"] == {}
    assert caps["experimental"] == {"vendor.feature": {"level": 2}}


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_table_a_carries_the_servers_extensions_but_the_tasks_one_the_proxy_translates(version):
    caps = legacy_server_capabilities(MODERN_SERVER_CAPS, version)
    assert caps["extensions"] == {"com.example/other": {"x": 1}}
    assert "tasks" not in caps  # 2025-11-25's own tasks capability is the proxy's to add (§3.10)
    assert "extensions" not in legacy_server_capabilities({"extensions": {TASKS_EXTENSION: {}}}, version)


def test_table_a_omits_completions_only_for_2024_11_05():
    assert "completions" not in legacy_server_capabilities(MODERN_SERVER_CAPS, "2024-11-05")
    for version in ("2025-03-26", "2025-06-18", "2025-11-25"):
        assert legacy_server_capabilities(MODERN_SERVER_CAPS, version)["completions"] == {}


def test_table_a_declares_only_what_the_upstream_declares():
    assert legacy_server_capabilities({"tools": {}}, "2025-11-25") == {"tools": {}}
    assert legacy_server_capabilities({}, "2025-11-25") == {}
    assert legacy_server_capabilities(None, "2025-11-25") == {}


def test_table_a_withholds_list_changed_when_the_proxy_does_not_bridge_it():
    caps = legacy_server_capabilities(MODERN_SERVER_CAPS, "2025-11-25", bridge_list_changed=False)
    assert caps["tools"] == {}
    assert caps["resources"] == {"subscribe": True}
    assert caps["prompts"] == {}


def test_table_a_keeps_unknown_members_of_known_capabilities_and_leaves_its_input_alone():
    modern = {"tools": {"listChanged": True, "x-vendor": 1}, "resources": {"subscribe": True}}
    snapshot = copy.deepcopy(modern)
    caps = legacy_server_capabilities(modern, "2025-06-18", bridge_list_changed=False)
    assert caps["tools"] == {"x-vendor": 1}
    assert modern == snapshot


# ---------------------------------------------------------------- table B


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_table_b_result_validates_as_modern_client_capabilities(version):
    caps = modern_client_capabilities(LEGACY_CLIENT_CAPS, version)
    assert errors(LATEST_MODERN, "ClientCapabilities", caps) == []


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_table_b_turns_roots_into_an_empty_object_and_drops_client_tasks(version):
    caps = modern_client_capabilities(LEGACY_CLIENT_CAPS, version)
    assert caps["roots"] == {}
    assert "tasks" not in caps
    assert caps["experimental"] == {"vendor.client": {"on": True}}


def test_table_b_keeps_sampling_tools_only_for_2025_11_25():
    assert modern_client_capabilities(LEGACY_CLIENT_CAPS, "2025-11-25")["sampling"] == {"context": {}, "tools": {}}
    for version in ("2025-06-18", "2025-03-26", "2024-11-05"):
        assert modern_client_capabilities(LEGACY_CLIENT_CAPS, version)["sampling"] == {"context": {}}


def test_table_b_maps_2025_06_18_elicitation_to_form_only():
    caps = modern_client_capabilities({"elicitation": {}}, "2025-06-18")
    assert caps["elicitation"] == {"form": {}}
    assert elicitation_modes(caps) == frozenset({"form"})


def test_table_b_ignores_url_elicitation_before_2025_11_25():
    caps = modern_client_capabilities({"elicitation": {"url": {}}}, "2025-06-18")
    assert elicitation_modes(caps) == frozenset({"form"})


def test_table_b_keeps_2025_11_25_elicitation_modes():
    assert modern_client_capabilities({"elicitation": {"form": {}, "url": {}}}, "2025-11-25")["elicitation"] == {
        "form": {},
        "url": {},
    }
    assert elicitation_modes(modern_client_capabilities({"elicitation": {"url": {}}}, "2025-11-25")) == {"url"}
    assert elicitation_modes(modern_client_capabilities({"elicitation": {}}, "2025-11-25")) == {"form"}


@pytest.mark.parametrize("version", ["2025-03-26", "2024-11-05"])
def test_table_b_ignores_elicitation_before_2025_06_18(version):
    assert "elicitation" not in modern_client_capabilities({"elicitation": {}}, version)


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_table_b_carries_the_clients_extensions_with_their_settings_unchanged(version):
    caps = modern_client_capabilities(LEGACY_CLIENT_CAPS, version)
    assert caps["extensions"] == LEGACY_CLIENT_CAPS["extensions"]


def test_table_b_declares_nothing_the_client_did_not_declare():
    assert modern_client_capabilities({}, "2025-11-25") == {}
    assert modern_client_capabilities(None, "2025-11-25") == {}
    assert modern_client_capabilities({"roots": {}}, "2024-11-05") == {"roots": {}}


def test_table_b_leaves_its_input_alone():
    legacy = copy.deepcopy(LEGACY_CLIENT_CAPS)
    modern_client_capabilities(legacy, "2025-06-18")
    modern_client_capabilities(legacy, "2024-11-05")
    assert legacy == LEGACY_CLIENT_CAPS


# ---------------------------------------------------------------- elicitation modes


@pytest.mark.parametrize(
    ("caps", "modes"),
    [
        ({}, frozenset()),
        (None, frozenset()),
        ({"elicitation": {}}, frozenset({"form"})),
        ({"elicitation": {"form": {}}}, frozenset({"form"})),
        ({"elicitation": {"url": {}}}, frozenset({"url"})),
        ({"elicitation": {"form": {}, "url": {}}}, frozenset({"form", "url"})),
        ({"elicitation": {"other": {}}}, frozenset({"form"})),
    ],
)
def test_elicitation_modes_treats_an_empty_object_as_form_only(caps, modes):
    assert elicitation_modes(caps) == modes


# The one rule for what an input request needs, used by both directions.
NEEDS = [
    ("elicitation/create", {"message": "m"}, {"elicitation": {}}, None),
    ("elicitation/create", {"mode": "form"}, {"elicitation": {"url": {}}}, {"elicitation": {"form": {}}}),
    ("elicitation/create", {"mode": "url", "url": "https://x"}, {"elicitation": {}}, {"elicitation": {"url": {}}}),
    ("elicitation/create", {"mode": "url"}, {"elicitation": {"url": {}}}, None),
    ("elicitation/create", {}, {}, {"elicitation": {"form": {}}}),
    ("sampling/createMessage", {"messages": []}, {"sampling": {}}, None),
    ("sampling/createMessage", {"messages": []}, {}, {"sampling": {}}),
    ("sampling/createMessage", {"tools": []}, {"sampling": {}}, {"sampling": {"tools": {}}}),
    ("sampling/createMessage", {"toolChoice": {}}, {"sampling": {"tools": {}}}, None),
    (
        "sampling/createMessage",
        {"includeContext": "thisServer"},
        {"sampling": {"tools": {}}},
        {"sampling": {"context": {}}},
    ),
    ("sampling/createMessage", {"includeContext": "none"}, {"sampling": {}}, None),
    (
        "sampling/createMessage",
        {"tools": [], "includeContext": "allServers"},
        {"sampling": {"tools": {}}},
        {"sampling": {"tools": {}, "context": {}}},
    ),
    ("sampling/createMessage", {}, {"sampling": "yes"}, {"sampling": {}}),
    ("roots/list", None, {"roots": {}}, None),
    ("roots/list", None, {"sampling": {}}, {"roots": {}}),
    ("roots/list", {}, "not an object", {"roots": {}}),
]


@pytest.mark.parametrize(("method", "params", "caps", "missing"), NEEDS)
def test_an_input_request_needs_exactly_the_capabilities_of_its_kind(method, params, caps, missing):
    assert missing_input_capability(method, params, caps) == missing


@pytest.mark.parametrize(
    ("required", "text"),
    [
        ({"roots": {}}, "roots"),
        ({"sampling": {}}, "sampling"),
        ({"elicitation": {"url": {}}}, "elicitation.url"),
        ({"sampling": {"tools": {}, "context": {}}}, "sampling.tools, sampling.context"),
    ],
)
def test_what_is_missing_reads_as_capability_paths(required, text):
    assert describe_required(required) == text


# ---------------------------------------------------------------- table C

MODERN_CLIENT_CAPS = {
    "roots": {},
    "sampling": {"context": {}, "tools": {}, "x-vendor": {"on": True}},
    "elicitation": {"form": {}, "url": {}},
    "extensions": {TASKS_EXTENSION: {}, UI: UI_SETTINGS},
    "experimental": {"vendor.client": {"on": True}},
}


def test_table_c_result_validates_as_2025_11_25_client_capabilities():
    assert errors(LATEST_MODERN, "ClientCapabilities", MODERN_CLIENT_CAPS) == []
    assert errors(LATEST_LEGACY, "ClientCapabilities", legacy_client_capabilities(MODERN_CLIENT_CAPS)) == []


def test_table_c_keeps_sampling_elicitation_modes_experimental_and_the_extensions_but_tasks():
    assert legacy_client_capabilities(MODERN_CLIENT_CAPS) == {
        "roots": {},
        "sampling": {"context": {}, "tools": {}, "x-vendor": {"on": True}},
        "elicitation": {"form": {}, "url": {}},
        "experimental": {"vendor.client": {"on": True}},
        "extensions": {UI: UI_SETTINGS},  # the tasks extension is hosted by the proxy (§4.9)
    }


@pytest.mark.parametrize("roots", [{}, {"listChanged": True}, {"listChanged": False, "x": 1}, None])
def test_table_c_never_declares_roots_list_changed(roots):
    assert legacy_client_capabilities({"roots": roots}) == {"roots": {}}


@pytest.mark.parametrize(
    ("elicitation", "legacy"),
    [
        ({}, {"form": {}}),
        (None, {"form": {}}),
        ({"form": {}}, {"form": {}}),
        ({"url": {}}, {"url": {}}),
        ({"form": {"x": 1}, "url": {}}, {"form": {"x": 1}, "url": {}}),
        ({"form": None}, {"form": {}}),
    ],
)
def test_table_c_keeps_the_declared_elicitation_modes_and_reads_empty_as_form(elicitation, legacy):
    assert legacy_client_capabilities({"elicitation": elicitation}) == {"elicitation": legacy}


@pytest.mark.parametrize("sampling", [{}, {"context": {}}, {"tools": {}}, None])
def test_table_c_copies_sampling_as_declared(sampling):
    assert legacy_client_capabilities({"sampling": sampling}) == {"sampling": sampling or {}}


def test_table_c_never_declares_client_tasks_nor_what_the_request_did_not_declare():
    assert legacy_client_capabilities({"tasks": {"requests": {}}, "extensions": {TASKS_EXTENSION: {}}}) == {}
    assert legacy_client_capabilities({}) == {}
    assert legacy_client_capabilities(None) == {}
    assert legacy_client_capabilities({"experimental": "not an object"}) == {}


def test_table_c_leaves_its_input_alone():
    modern = copy.deepcopy(MODERN_CLIENT_CAPS)
    legacy = legacy_client_capabilities(modern)
    legacy["sampling"]["added"] = {}
    legacy["elicitation"]["form"]["added"] = 1
    assert modern == MODERN_CLIENT_CAPS


# ---------------------------------------------------------------- legacy server capabilities → modern (§4.2)

LEGACY_SERVER_CAPS = {
    "tools": {"listChanged": True, "x-vendor": 1},
    "prompts": {"listChanged": False},
    "resources": {"subscribe": True, "listChanged": True},
    "completions": {},
    "logging": {},
    "experimental": {"vendor.server": {"level": 2}},
    "tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}},
    "extensions": {"io.modelcontextprotocol/skills": {"directoryRead": True}},
}


def test_modern_server_capabilities_validate_for_2026_07_28():
    assert errors(LATEST_LEGACY, "ServerCapabilities", LEGACY_SERVER_CAPS) == []
    assert errors(LATEST_MODERN, "ServerCapabilities", modern_server_capabilities(LEGACY_SERVER_CAPS)) == []


def test_modern_server_capabilities_copy_the_five_kinds_and_experimental_and_drop_tasks():
    assert modern_server_capabilities(LEGACY_SERVER_CAPS) == {
        k: v for k, v in LEGACY_SERVER_CAPS.items() if k != "tasks"
    }


def test_modern_server_capabilities_drop_members_the_modern_shape_does_not_bridge():
    assert modern_server_capabilities({"tools": {}, "x-vendor-cap": {}, "extensions": {TASKS_EXTENSION: {}}}) == {
        "tools": {}
    }


# ---------------------------------------------------------------- extensions in every direction


@pytest.mark.parametrize(
    "table",
    [
        lambda caps: legacy_server_capabilities(caps, LATEST_LEGACY),  # A: modern server → legacy client
        lambda caps: modern_client_capabilities(caps, LATEST_LEGACY),  # B: legacy client → modern server
        legacy_client_capabilities,  # C: modern client → legacy server
        modern_server_capabilities,  # §4.2: legacy server → modern client
    ],
    ids=["A", "B", "C", "4.2"],
)
def test_every_direction_carries_any_declared_extension_and_its_settings(table):
    declared = {
        UI: UI_SETTINGS,
        "com.example/search": {"engines": ["a", "b"], "limits": {"per_minute": 10}},
        "io.modelcontextprotocol/skills": {},
        "odd id without a vendor": {},  # the server judges identifiers, not the proxy
        TASKS_EXTENSION: {"kept": "apart"},
    }
    carried = table({"extensions": declared})["extensions"]
    assert carried == {name: settings for name, settings in declared.items() if name != TASKS_EXTENSION}
    assert "extensions" not in table({})
    assert "extensions" not in table({"extensions": {}})


def test_carried_extensions_leaves_out_only_what_the_proxy_translates():
    assert carried_extensions({"extensions": {TASKS_EXTENSION: {}}}) is None
    assert carried_extensions({"extensions": "not a map"}) is None
    assert carried_extensions({"extensions": {UI: UI_SETTINGS}}) == {UI: UI_SETTINGS}


@pytest.mark.parametrize(
    ("extensions", "problem"),
    [
        ("ui", "must be an object mapping extension identifiers to settings objects"),
        ([UI], "must be an object mapping"),
        ({UI: True}, f"capabilities.extensions[{UI!r}] must be a settings object"),
        ({UI: None}, "must be a settings object"),
        (None, "must be an object mapping"),
        ({UI: ["text/html"]}, "must be a settings object"),
        ({f"com.example/x{i}": {} for i in range(MAX_EXTENSIONS + 1)}, f"more than {MAX_EXTENSIONS}"),
    ],
)
def test_a_malformed_extensions_declaration_is_named(extensions, problem):
    assert problem in (extensions_problem({"extensions": extensions}) or "")


@pytest.mark.parametrize(
    "caps",
    [
        {},
        {"extensions": {}},
        {"extensions": {UI: UI_SETTINGS, "x": {}}},
        {"extensions": {f"e{i}": {} for i in range(MAX_EXTENSIONS)}},
    ],
)
def test_a_well_formed_extensions_declaration_passes(caps):
    assert extensions_problem(caps) is None


@pytest.mark.parametrize("kind", ["tools", "prompts", "resources", "completions", "logging"])
def test_modern_server_capabilities_skip_a_null_kind_and_declare_a_malformed_one_empty(kind):
    assert modern_server_capabilities({kind: None}) == {}
    assert modern_server_capabilities({kind: True}) == {kind: {}}


@pytest.mark.parametrize("legacy", [None, {}, "caps", {"experimental": ["x"]}])
def test_modern_server_capabilities_declare_nothing_the_server_did_not(legacy):
    assert modern_server_capabilities(legacy) == {}


def test_modern_server_capabilities_leave_their_input_alone():
    legacy = copy.deepcopy(LEGACY_SERVER_CAPS)
    modern = modern_server_capabilities(legacy)
    modern["tools"]["listChanged"] = False
    assert legacy == LEGACY_SERVER_CAPS
