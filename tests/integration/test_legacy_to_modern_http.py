"""Legacy clients (2024-11-05 .. 2025-11-25) through the real proxy app to a scripted modern upstream.

Design: docs/translation.md §1.1, §3 and §7. Every message the proxy
sends to the legacy client is checked against the schema of the negotiated revision.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
from typing import Any

import pytest
from structlog.testing import capture_logs

from proxy.errors import SESSION_NOT_FOUND
from proxy.protocol import jsonrpc, meta
from proxy.protocol.headers import (
    METHOD_HEADER,
    NAME_HEADER,
    PARAM_HEADER_PREFIX,
    PROTOCOL_VERSION_HEADER,
    SESSION_HEADER,
)
from proxy.protocol.versions import LATEST_LEGACY, LEGACY_VERSIONS, MODERN_VERSIONS, legacy_at_least
from tests.integration.conftest import UPSTREAM_NAME, FakeClock, MakeProxy, Proxy, closed_port_url
from tests.support.fake_modern import (
    MODERN,
    SERVER_INFO,
    Call,
    FakeModern,
    Listen,
    Outcome,
    Reply,
    complete,
    error,
    hang,
    input_required,
    notification,
)
from tests.support.legacy_client import (
    CLIENT_INFO,
    VISIBLE_ASCII,
    LegacyClient,
    check,
    error_body,
    initialize_message,
    read_reply,
)
from tests.support.mcp_client import ACCEPT, PATH, SseReader, content_type
from tests.support.modern_client import ModernClient

JSONDict = dict[str, Any]
WAIT = 5.0  # upper bound for anything a test waits for

ELICIT = {
    "method": "elicitation/create",
    "params": {
        "mode": "form",
        "message": "Deploy to production?",
        "requestedSchema": {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]},
    },
}
SAMPLE = {
    "method": "sampling/createMessage",
    "params": {
        "messages": [{"role": "user", "content": {"type": "text", "text": "Summarise the diff"}}],
        "maxTokens": 64,
    },
}
ROOTS = {"method": "roots/list"}
ANSWERS: dict[str, JSONDict] = {
    "elicitation/create": {"action": "accept", "content": {"confirm": True}},
    "sampling/createMessage": {
        "role": "assistant",
        "content": {"type": "text", "text": "Looks fine."},
        "model": "test-model",
        "stopReason": "endTurn",
    },
    "roots/list": {"roots": [{"uri": "file:///work", "name": "work"}]},
}
USER_REJECTED = -1  # the client's own error code for a declined request (any integer is legal)


def listed_as_task_capable(tool: JSONDict) -> JSONDict:
    """A tool as a 2025-11-25 client sees it listed: it may run as a task the proxy hosts."""
    return {**tool, "execution": {"taskSupport": "optional"}}


def text(value: str) -> list[JSONDict]:
    return [{"type": "text", "text": value}]


def respond_with(outcome: Outcome) -> Any:
    """A fake handler that always answers `outcome`."""

    async def handler(call: Call) -> Outcome:
        return outcome

    return handler


def scripted(*outcomes: Outcome) -> Any:
    """A fake handler answering `outcomes` in turn, one per request."""
    remaining = list(outcomes)

    async def handler(call: Call) -> Outcome:
        assert remaining, f"unexpected extra {call.method} request"
        return remaining.pop(0)

    return handler


def ping(request_id: Any = 1) -> JSONDict:
    return {"jsonrpc": "2.0", "id": request_id, "method": "ping"}


async def drive(
    peer: LegacyClient, reader: SseReader, request_id: Any, answers: dict[str, JSONDict]
) -> tuple[list[JSONDict], JSONDict]:
    """Answer every server request on a POST stream until the final response; return both.

    `answers` maps a method to the result to send, or to {"error": {...}} to fail it.
    """
    asked: list[JSONDict] = []
    while True:
        message = await reader.message()
        assert message is not None, "the stream ended without a response"
        if "method" not in message:
            assert message.get("id") == request_id, message
            return asked, message
        peer.check(message)
        if "id" not in message:
            continue  # a notification
        asked.append(message)
        answer = answers[message["method"]]
        if "error" in answer:
            status = await peer.respond(message["id"], error=answer["error"])
        else:
            status = await peer.respond(message["id"], answer)
        assert status == 202


# ---------------------------------------------------------------------------- 1. initialize


async def test_initialize_answers_an_initialize_result_and_mints_a_visible_ascii_session_id(
    proxy: Proxy, fake: FakeModern
) -> None:
    async with asyncio.timeout(WAIT):
        response = await proxy.client.post(PATH, json=initialize_message(), headers={"Accept": ACCEPT})
        reply = await read_reply(response, LATEST_LEGACY, "initialize", 0)
    assert response.status == 200
    assert reply.content_type == "application/json"
    assert reply.result == {
        "protocolVersion": LATEST_LEGACY,
        "capabilities": {
            "tools": {"listChanged": True},
            "prompts": {"listChanged": True},
            "resources": {"subscribe": True, "listChanged": True},
            "logging": {},
            "completions": {},
            # The proxy hosts 2025-11-25 clients' tasks itself (docs/design.md §Tasks).
            "tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}},
        },
        "serverInfo": SERVER_INFO,
        "instructions": fake.discover["instructions"],
    }
    session_id = response.headers[SESSION_HEADER]
    assert len(session_id) >= 22
    assert set(session_id) <= VISIBLE_ASCII
    [discover] = fake.calls_of("server/discover")
    assert discover.headers[PROTOCOL_VERSION_HEADER] == MODERN
    assert discover.headers[METHOD_HEADER] == "server/discover"
    assert discover.meta[meta.PROTOCOL_VERSION] == MODERN


async def test_each_initialize_mints_a_different_session_id(proxy: Proxy) -> None:
    async with asyncio.timeout(WAIT):
        first = await proxy.connect()
        second = await proxy.connect()
    assert first.session_id != second.session_id


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
async def test_initialize_echoes_the_legacy_version_the_client_requested(proxy: Proxy, version: str) -> None:
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect(version)  # validates the InitializeResult against `version`
    assert peer.version == version
    # Table A: completions did not exist as a capability in 2024-11-05.
    assert ("completions" in peer.initialize_result["capabilities"]) == legacy_at_least(version, "2025-03-26")


async def test_initialize_with_an_unknown_version_is_answered_with_the_latest_legacy_version(proxy: Proxy) -> None:
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect("1999-01-01")
    assert peer.version == LATEST_LEGACY


UI = "io.modelcontextprotocol/ui"  # MCP Apps
UI_SETTINGS: JSONDict = {"mimeTypes": ["text/html;profile=mcp-app"]}


async def test_initialize_carries_the_modern_servers_extensions_to_the_legacy_client(
    proxy: Proxy, fake: FakeModern
) -> None:
    declared = {UI: {}, "com.example/widgets": {"sizes": ["s", "m"]}}
    fake.discover["capabilities"]["extensions"] = declared
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
    assert peer.initialize_result["capabilities"]["extensions"] == declared


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
async def test_the_extensions_a_legacy_client_declared_go_with_every_request_it_makes(
    proxy: Proxy, fake: FakeModern, version: str
) -> None:
    declared = {UI: UI_SETTINGS, "com.example/search": {"engines": ["a"]}}
    tasks = {"io.modelcontextprotocol/tasks": {}}  # the proxy's own to declare or not (§3.10)
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect(version, capabilities={"extensions": {**declared, **tasks}})
        await peer.request("tools/list")
        await peer.request("resources/read", {"uri": "ui://widget/app.html"})
    for method in ("tools/list", "resources/read"):
        [call] = fake.calls_of(method)
        assert call.meta[meta.CLIENT_CAPABILITIES] == {"extensions": declared}


# An MCP Apps tool as `registerAppTool` (@modelcontextprotocol/ext-apps) declares it: `_meta.ui` and
# the deprecated flat key, pointing at a `ui://` resource of the MCP App mime type.
APP_TOOL: JSONDict = {
    "name": "show-chart",
    "description": "Shows a chart",
    "inputSchema": {"type": "object"},
    "_meta": {
        "ui": {"resourceUri": "ui://charts/app.html", "visibility": ["model", "app"], "csp": {"connectDomains": []}},
        "ui/resourceUri": "ui://charts/app.html",
    },
}
APP_RESOURCE: JSONDict = {
    "uri": "ui://charts/app.html",
    "mimeType": "text/html;profile=mcp-app",
    "text": "<!doctype html><title>chart</title>",
    "_meta": {"ui": {"prefersBorder": True}},
}


async def test_an_mcp_apps_tool_and_its_ui_resource_reach_the_legacy_client_untouched(
    peer: LegacyClient, fake: FakeModern
) -> None:
    fake.tools = [APP_TOOL]
    fake.handlers["resources/read"] = respond_with(complete(contents=[APP_RESOURCE]))
    async with asyncio.timeout(WAIT):
        listed = await peer.request("tools/list")
        read = await peer.request("resources/read", {"uri": APP_RESOURCE["uri"]})
    [tool] = listed.result["tools"]
    assert {k: v for k, v in tool.items() if k != "execution"} == APP_TOOL  # execution: §3.10
    assert read.result["contents"] == [APP_RESOURCE]


SKILL_LIST: JSONDict = {"skills": [{"name": "pdf", "uri": "skill://pdf/SKILL.md", "description": "PDF work"}]}


@pytest.mark.parametrize(
    ("method", "params", "answer"),
    [
        ("skills/list", {}, SKILL_LIST),
        ("skills/get", {"name": "pdf"}, {"contents": [{"uri": "skill://pdf/SKILL.md", "text": "# PDF"}]}),
        ("resources/directory/read", {"uri": "skill://pdf/"}, {"entries": [{"uri": "skill://pdf/SKILL.md"}]}),
        ("com.example/search", {"query": "q", "limits": {"n": 3}}, {"hits": ["a"], "_meta": {"com.example/x": 1}}),
    ],
)
async def test_an_extensions_requests_are_forwarded_like_core_ones(
    proxy: Proxy, fake: FakeModern, method: str, params: JSONDict, answer: JSONDict
) -> None:
    fake.handlers[method] = respond_with(complete(**answer))
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect(capabilities={"extensions": {"io.modelcontextprotocol/skills": {}}})
        reply = await peer.request(method, params)
    [call] = fake.calls_of(method)
    assert {k: v for k, v in call.params.items() if k != "_meta"} == params
    assert call.meta[meta.CLIENT_CAPABILITIES] == {"extensions": {"io.modelcontextprotocol/skills": {}}}
    assert call.headers[METHOD_HEADER] == method
    assert {k: v for k, v in reply.result.items() if k not in ("resultType", "_meta", "ttlMs", "cacheScope")} == {
        k: v for k, v in answer.items() if k != "_meta"
    }


async def test_an_extensions_notification_goes_to_the_modern_server_with_its_headers_and_a_core_one_does_not(
    proxy: Proxy, fake: FakeModern
) -> None:
    method = "notifications/com.example/trace/flushed"
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect(capabilities={"extensions": {"com.example/trace": {}}})
        assert await peer.notify(method, {"spans": 2, "_meta": {"com.example/batch": 7}}) == 202
        assert await peer.notify("notifications/roots/list_changed") == 202
    [call] = fake.calls_of(method)
    assert call.body == {"jsonrpc": "2.0", "method": method, "params": {"spans": 2, "_meta": {"com.example/batch": 7}}}
    assert call.headers[METHOD_HEADER] == method and call.headers[PROTOCOL_VERSION_HEADER] in MODERN_VERSIONS
    assert fake.calls_of("notifications/roots/list_changed") == []  # removed in 2026-07-28 (§3.3)


async def test_a_modern_clients_notification_reaches_a_modern_server_byte_for_byte(
    proxy: Proxy, fake: FakeModern
) -> None:
    method = "notifications/com.example/trace/flushed"
    client = ModernClient(proxy.client)
    note = {"jsonrpc": "2.0", "method": method, "params": {"spans": 2, "_meta": client.envelope()}}
    async with asyncio.timeout(WAIT):
        response = await client.post(note)
        assert response.status == 202
    [call] = fake.calls_of(method)
    assert call.body == note and call.headers[METHOD_HEADER] == method


@pytest.mark.parametrize("extensions", ["io.modelcontextprotocol/ui", [UI], {UI: True}])
async def test_an_initialize_with_malformed_extensions_gets_invalid_params_and_no_session(
    proxy: Proxy, extensions: object
) -> None:
    message = initialize_message(LATEST_LEGACY, {"extensions": extensions})
    async with asyncio.timeout(WAIT):
        response = await proxy.client.post(PATH, json=message, headers={"Accept": ACCEPT})
        reply = await read_reply(response, LATEST_LEGACY, "initialize", 0)
    assert SESSION_HEADER not in response.headers
    assert reply.error["code"] == jsonrpc.INVALID_PARAMS
    assert "capabilities.extensions" in reply.error["message"]


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("notifications/initialized", None),
        ("notifications/roots/list_changed", None),
        ("notifications/progress", {"progressToken": 1, "progress": 1}),
        ("notifications/cancelled", {"requestId": 999, "reason": "no such request"}),
    ],
)
async def test_client_notifications_are_accepted_with_202_and_never_forwarded(
    proxy: Proxy, fake: FakeModern, method: str, params: JSONDict | None
) -> None:
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect(initialized=False)
        assert await peer.notify(method, params) == 202
    assert [c.method for c in fake.calls] == ["server/discover"]


async def test_ping_is_answered_locally_even_before_initialized(proxy: Proxy, fake: FakeModern) -> None:
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect(initialized=False)
        reply = await peer.request("ping")
    assert reply.status == 200
    assert reply.result == {}
    assert fake.calls_of("ping") == []


async def test_set_level_is_stored_and_sent_upstream_as_the_log_level_meta_key(
    peer: LegacyClient, fake: FakeModern
) -> None:
    async with asyncio.timeout(WAIT):
        await peer.request("tools/list")
        reply = await peer.request("logging/setLevel", {"level": "warning"})
        await peer.request("tools/list")
    assert reply.result == {}
    before, after = fake.calls_of("tools/list")
    assert meta.LOG_LEVEL not in before.meta
    assert after.meta[meta.LOG_LEVEL] == "warning"
    assert fake.calls_of("logging/setLevel") == []


async def test_set_level_with_an_unknown_level_is_invalid_params(peer: LegacyClient, fake: FakeModern) -> None:
    async with asyncio.timeout(WAIT):
        reply = await peer.request("logging/setLevel", {"level": "verbose"})
        await peer.request("tools/list")
    assert reply.status == 200
    assert reply.error["code"] == jsonrpc.INVALID_PARAMS
    assert meta.LOG_LEVEL not in fake.calls_of("tools/list")[0].meta


# ---------------------------------------------------------------------------- 2. request rewriting


@pytest.mark.parametrize(
    ("version", "legacy_caps", "modern_caps"),
    [
        pytest.param(
            "2025-11-25",
            {
                "roots": {"listChanged": True},
                "sampling": {"context": {}, "tools": {}},
                "elicitation": {"form": {}, "url": {}},
                "tasks": {"list": {}, "cancel": {}},
                "experimental": {"com.example/x": {"on": True}},
            },
            {
                "roots": {},
                "sampling": {"context": {}, "tools": {}},
                "elicitation": {"form": {}, "url": {}},
                "experimental": {"com.example/x": {"on": True}},
            },
            id="2025-11-25",
        ),
        pytest.param(
            "2025-06-18",
            {"roots": {}, "sampling": {"tools": {}}, "elicitation": {}},
            {"roots": {}, "sampling": {}, "elicitation": {"form": {}}},
            id="2025-06-18",
        ),
        pytest.param("2025-03-26", {"sampling": {}, "elicitation": {}}, {"sampling": {}}, id="2025-03-26"),
        pytest.param("2024-11-05", {}, {}, id="2024-11-05-none"),
    ],
)
async def test_forwarded_requests_carry_modern_meta_with_capabilities_mapped_by_table_b(
    proxy: Proxy, fake: FakeModern, version: str, legacy_caps: JSONDict, modern_caps: JSONDict
) -> None:
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect(version, capabilities=legacy_caps)
        await peer.request("tools/list")  # no params at all: the proxy must create params._meta
    [call] = fake.calls_of("tools/list")
    assert call.meta[meta.PROTOCOL_VERSION] == MODERN
    assert call.meta[meta.CLIENT_CAPABILITIES] == modern_caps
    assert call.meta[meta.CLIENT_INFO] == CLIENT_INFO
    assert call.headers[PROTOCOL_VERSION_HEADER] == MODERN
    assert call.headers[METHOD_HEADER] == "tools/list"


async def test_forwarded_call_has_routing_headers_passes_auth_and_trace_and_drops_session_and_origin(
    proxy: Proxy, fake: FakeModern
) -> None:
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    client_headers = {"Authorization": "Bearer token-A", "traceparent": traceparent, "Origin": "http://localhost:5173"}
    fake.handlers["tools/call"] = respond_with(complete(content=text("sunny")))
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect(headers=client_headers)
        reply = await peer.request("tools/call", {"name": "weather", "arguments": {"city": "Oslo"}}, id="client-1")
    assert reply.result == {"content": text("sunny")}
    assert reply.final == {"jsonrpc": "2.0", "id": "client-1", "result": {"content": text("sunny")}}
    [call] = fake.calls_of("tools/call")
    assert call.headers[PROTOCOL_VERSION_HEADER] == call.meta[meta.PROTOCOL_VERSION] == MODERN
    assert call.headers[METHOD_HEADER] == "tools/call"
    assert call.headers[NAME_HEADER] == "weather"
    assert call.headers["Authorization"] == "Bearer token-A"
    assert call.headers["traceparent"] == traceparent
    assert SESSION_HEADER not in call.headers
    assert "Origin" not in call.headers
    assert "application/json" in call.headers["Accept"]
    assert "text/event-stream" in call.headers["Accept"]
    assert call.headers["Content-Type"].startswith("application/json")
    assert call.id != "client-1"


async def test_two_sessions_reusing_a_request_id_reach_the_upstream_under_distinct_minted_ids(
    proxy: Proxy, fake: FakeModern
) -> None:
    async with asyncio.timeout(WAIT):
        first = await proxy.connect()
        second = await proxy.connect()
        # tools/call: not cacheable, so both reach the upstream (identical lists would share one call).
        call = {"name": "echo", "arguments": {}}
        await asyncio.gather(first.request("tools/call", call, id=7), second.request("tools/call", call, id=7))
    ids = [c.id for c in fake.calls_of("tools/call")]
    assert len(ids) == 2
    assert ids[0] != ids[1]


@pytest.mark.parametrize(
    ("method", "params", "name", "answer"),
    [
        ("tools/call", {"name": "météo", "arguments": {}}, "météo", complete(content=text("ok"))),
        ("tools/call", {"name": " padded ", "arguments": {}}, " padded ", complete(content=text("ok"))),
        ("prompts/get", {"name": "greet"}, "greet", complete(messages=[])),
        ("resources/read", {"uri": "file:///a.txt"}, "file:///a.txt", complete(contents=[])),
    ],
)
async def test_name_bearing_requests_mirror_the_name_into_mcp_name_base64_when_not_plain_ascii(
    peer: LegacyClient, fake: FakeModern, method: str, params: JSONDict, name: str, answer: JSONDict
) -> None:
    fake.handlers[method] = respond_with(answer)
    async with asyncio.timeout(WAIT):
        reply = await peer.request(method, params)
    assert "result" in (reply.final or {})
    [call] = fake.calls_of(method)
    plain = name.isascii() and name == name.strip()
    expected = name if plain else "=?base64?" + base64.b64encode(name.encode()).decode("ascii") + "?="
    assert call.headers[NAME_HEADER] == expected


async def test_x_mcp_header_arguments_are_mirrored_as_mcp_param_headers(peer: LegacyClient, fake: FakeModern) -> None:
    fake.tools = [
        {
            "name": "deploy",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "region": {"type": "string", "x-mcp-header": "Region"},
                    "replicas": {"type": "integer", "x-mcp-header": "Replicas"},
                    "dryRun": {"type": "boolean", "x-mcp-header": "Dry-Run"},
                    "note": {"type": "string"},
                },
            },
        }
    ]
    fake.handlers["tools/call"] = respond_with(complete(content=text("deployed")))
    arguments = {"region": "eu-west-1", "replicas": 3, "dryRun": False, "note": "friday"}
    async with asyncio.timeout(WAIT):
        reply = await peer.request("tools/call", {"name": "deploy", "arguments": arguments})
    assert reply.result == {"content": text("deployed")}
    [call] = fake.calls_of("tools/call")
    params = {k.lower(): v for k, v in call.headers.items() if k.lower().startswith(PARAM_HEADER_PREFIX.lower())}
    assert params == {
        (PARAM_HEADER_PREFIX + "Region").lower(): "eu-west-1",
        (PARAM_HEADER_PREFIX + "Replicas").lower(): "3",
        (PARAM_HEADER_PREFIX + "Dry-Run").lower(): "false",
    }


async def test_a_call_whose_tools_list_walk_fails_goes_without_param_headers_and_says_why(
    peer: LegacyClient, fake: FakeModern
) -> None:
    fake.handlers["tools/list"] = respond_with(error(-32603, "listing is broken"))
    fake.handlers["tools/call"] = respond_with(complete(content=text("deployed")))
    with capture_logs() as logs:
        async with asyncio.timeout(WAIT):
            reply = await peer.request("tools/call", {"name": "deploy", "arguments": {"region": "eu"}})
    assert reply.result == {"content": text("deployed")}
    [call] = fake.calls_of("tools/call")
    assert not [k for k in call.headers if k.lower().startswith(PARAM_HEADER_PREFIX.lower())]
    failed = [(e["upstream"], e["error"]) for e in logs if e["event"] == "tools_prefetch_failed"]
    assert failed == [(UPSTREAM_NAME, "listing is broken")]


async def test_tools_with_an_invalid_x_mcp_header_are_withheld_from_tools_list(
    peer: LegacyClient, fake: FakeModern
) -> None:
    good = {"name": "good", "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}}}
    bad = {
        "name": "bad",
        "inputSchema": {"type": "object", "properties": {"ratio": {"type": "number", "x-mcp-header": "Ratio"}}},
    }
    fake.tools = [good, bad]
    async with asyncio.timeout(WAIT):
        reply = await peer.request("tools/list")
    assert reply.result == {"tools": [listed_as_task_capable(good)]}


async def test_unknown_params_and_foreign_meta_keys_survive_forwarding(peer: LegacyClient, fake: FakeModern) -> None:
    fake.handlers["tools/call"] = respond_with(complete(content=text("ok")))
    params = {
        "name": "echo",
        "arguments": {"a": 1},
        "vendorExtension": {"keep": [1, 2]},
        "_meta": {"progressToken": "tok-1", "com.example/trace": "abc"},
    }
    async with asyncio.timeout(WAIT):
        await peer.request("tools/call", params)
        await peer.request("tools/call", {"name": "echo", "arguments": {}, "_meta": {"progressToken": 5}})
    first, second = fake.calls_of("tools/call")
    assert first.params["vendorExtension"] == {"keep": [1, 2]}
    assert first.params["arguments"] == {"a": 1}
    assert first.meta["progressToken"] == "tok-1"
    assert first.meta["com.example/trace"] == "abc"
    assert second.meta["progressToken"] == 5  # same JSON type: 5 is not "5"


# ---------------------------------------------------------------------------- 3. replies


async def test_modern_result_fields_and_server_info_are_stripped_for_the_legacy_client(
    peer: LegacyClient, fake: FakeModern
) -> None:
    tool = {"name": "t", "inputSchema": {"type": "object"}}
    fake.handlers["tools/list"] = respond_with(
        complete(
            tools=[tool], ttlMs=5000, cacheScope="private", _meta={meta.SERVER_INFO: SERVER_INFO, "com.example/p": 1}
        )
    )
    fake.handlers["tools/call"] = respond_with(complete(content=text("ok"), _meta={meta.SERVER_INFO: SERVER_INFO}))
    async with asyncio.timeout(WAIT):
        listed = await peer.request("tools/list")
        called = await peer.request("tools/call", {"name": "t", "arguments": {}})
    assert listed.result == {"tools": [listed_as_task_capable(tool)], "_meta": {"com.example/p": 1}}
    assert called.result == {"content": text("ok")}


async def test_progress_and_log_notifications_stream_on_the_post_before_the_result(
    peer: LegacyClient, fake: FakeModern
) -> None:
    async def slow_tool(call: Call) -> Outcome:
        token = call.meta["progressToken"]
        await call.send(notification("notifications/progress", {"progressToken": token, "progress": 1, "total": 2}))
        await call.send(notification("notifications/message", {"level": "debug", "data": "below the session level"}))
        await call.send(notification("notifications/message", {"level": "warning", "logger": "t", "data": "careful"}))
        await call.send(notification("notifications/progress", {"progressToken": token, "progress": 2, "total": 2}))
        return complete(content=text("done"))

    fake.handlers["tools/call"] = slow_tool
    async with asyncio.timeout(WAIT):
        await peer.request("logging/setLevel", {"level": "info"})
        reply = await peer.request("tools/call", {"name": "slow", "arguments": {}, "_meta": {"progressToken": "p-1"}})
    assert reply.status == 200
    assert reply.content_type == "text/event-stream"
    assert reply.headers["X-Accel-Buffering"] == "no"
    assert reply.messages == [
        notification("notifications/progress", {"progressToken": "p-1", "progress": 1, "total": 2}),
        notification("notifications/message", {"level": "warning", "logger": "t", "data": "careful"}),
        notification("notifications/progress", {"progressToken": "p-1", "progress": 2, "total": 2}),
        {"jsonrpc": "2.0", "id": reply.request_id, "result": {"content": text("done")}},
    ]
    assert fake.calls_of("tools/call")[0].meta[meta.LOG_LEVEL] == "info"


@pytest.mark.parametrize("upstream_framing", ["json", "sse"])
async def test_a_result_that_comes_first_is_relayed_as_plain_json(
    peer: LegacyClient, fake: FakeModern, upstream_framing: str
) -> None:
    async def tool(call: Call) -> Outcome:
        result = complete(content=text("quick"))
        if upstream_framing == "json":
            return result
        await call.send(call.response_message(result))
        return None

    fake.handlers["tools/call"] = tool
    async with asyncio.timeout(WAIT):
        reply = await peer.request("tools/call", {"name": "quick", "arguments": {}})
    assert reply.status == 200
    assert reply.content_type == "application/json"
    assert reply.messages == [{"jsonrpc": "2.0", "id": reply.request_id, "result": {"content": text("quick")}}]


@pytest.mark.parametrize("status", [200, 400])
async def test_resource_not_found_from_the_upstream_reaches_the_legacy_client_as_32002(
    peer: LegacyClient, fake: FakeModern, status: int
) -> None:
    uri = "file:///missing.txt"
    fake.handlers["resources/read"] = respond_with(
        error(jsonrpc.INVALID_PARAMS, "Resource not found", {"uri": uri}, status=status)
    )
    async with asyncio.timeout(WAIT):
        reply = await peer.request("resources/read", {"uri": uri})
    assert reply.status == 200
    assert reply.error["code"] == jsonrpc.RESOURCE_NOT_FOUND
    assert reply.error["data"] == {"uri": uri}


async def test_upstream_method_not_found_with_http_404_becomes_32601_in_an_http_200(
    peer: LegacyClient, fake: FakeModern
) -> None:
    params = {"ref": {"type": "ref/prompt", "name": "p"}, "argument": {"name": "a", "value": "b"}}
    async with asyncio.timeout(WAIT):
        reply = await peer.request("completion/complete", params)  # the fake has no handler: -32601 + 404
    assert len(fake.calls_of("completion/complete")) == 1
    assert reply.status == 200
    assert reply.error["code"] == jsonrpc.METHOD_NOT_FOUND


async def test_an_unknown_result_type_from_the_upstream_is_an_internal_error(
    peer: LegacyClient, fake: FakeModern
) -> None:
    fake.handlers["tools/call"] = respond_with({"resultType": "bogus", "content": text("?")})
    async with asyncio.timeout(WAIT):
        reply = await peer.request("tools/call", {"name": "t", "arguments": {}})
    assert reply.status == 200
    assert reply.error["code"] == jsonrpc.INTERNAL_ERROR


async def test_input_required_on_a_list_request_is_an_internal_error_and_asks_nothing(
    peer: LegacyClient, fake: FakeModern
) -> None:
    fake.handlers["prompts/list"] = respond_with(input_required({"where": ROOTS}, "s"))
    async with asyncio.timeout(WAIT):
        reply = await peer.request("prompts/list")
    assert reply.error["code"] == jsonrpc.INTERNAL_ERROR
    assert [m for m in reply.messages if "method" in m] == []


# ---------------------------------------------------------------------------- 4. input_required (MRTR)


async def test_input_requests_are_asked_on_the_post_stream_and_the_answers_retried_upstream(
    peer: LegacyClient, fake: FakeModern
) -> None:
    state = 'opaque-☃-"state"\\n-1'
    fake.handlers["tools/call"] = scripted(
        input_required({"confirm": ELICIT, "draft": SAMPLE, "where": ROOTS}, state),
        complete(content=text("deployed")),
    )
    async with asyncio.timeout(WAIT):
        request_id, response = await peer.send("tools/call", {"name": "deploy", "arguments": {"env": "prod"}})
        assert response.status == 200
        assert content_type(response) == "text/event-stream"
        assert response.headers["X-Accel-Buffering"] == "no"
        reader = SseReader(response)
        asked: dict[str, JSONDict] = {}
        while len(asked) < 3:
            message = await reader.message()
            assert message is not None and "id" in message and "method" in message, message
            peer.check(message)
            asked[message["method"]] = message
        for method, message in asked.items():
            assert await peer.respond(message["id"], ANSWERS[method]) == 202
        final = await reader.message()
        end = await reader.message()
    assert final is not None
    peer.check(final, "tools/call")
    assert final == {"jsonrpc": "2.0", "id": request_id, "result": {"content": text("deployed")}}
    assert end is None  # the final response ends the stream
    assert len({m["id"] for m in asked.values()}) == 3
    assert all(isinstance(m["id"], str) for m in asked.values())  # sealed, naming this replica
    assert asked["elicitation/create"]["params"] == ELICIT["params"]
    assert asked["sampling/createMessage"]["params"] == SAMPLE["params"]
    first, retry = fake.calls_of("tools/call")
    assert "inputResponses" not in first.params and "requestState" not in first.params
    assert retry.id != first.id
    assert retry.params["name"] == "deploy" and retry.params["arguments"] == {"env": "prod"}
    assert retry.params["inputResponses"] == {
        "confirm": ANSWERS["elicitation/create"],
        "draft": ANSWERS["sampling/createMessage"],
        "where": ANSWERS["roots/list"],
    }
    assert retry.params["requestState"] == state


async def test_two_rounds_of_input_send_only_the_latest_answers_with_the_latest_state(
    peer: LegacyClient, fake: FakeModern
) -> None:
    fake.handlers["tools/call"] = scripted(
        input_required({"confirm": ELICIT}, "state-1"),
        input_required({"draft": SAMPLE}, "state-2"),
        complete(content=text("ok")),
    )
    async with asyncio.timeout(WAIT):
        request_id, response = await peer.send("tools/call", {"name": "deploy", "arguments": {}})
        asked, final = await drive(peer, SseReader(response), request_id, ANSWERS)
    peer.check(final, "tools/call")
    assert final["result"] == {"content": text("ok")}
    assert [m["method"] for m in asked] == ["elicitation/create", "sampling/createMessage"]
    assert asked[0]["id"] != asked[1]["id"]  # never reused within the session
    calls = fake.calls_of("tools/call")
    assert len(calls) == 3
    assert len({c.id for c in calls}) == 3
    assert calls[1].params["inputResponses"] == {"confirm": ANSWERS["elicitation/create"]}
    assert calls[1].params["requestState"] == "state-1"
    assert calls[2].params["inputResponses"] == {"draft": ANSWERS["sampling/createMessage"]}
    assert calls[2].params["requestState"] == "state-2"


async def test_an_input_request_for_an_undeclared_capability_fails_the_call_without_asking_the_client(
    proxy: Proxy, fake: FakeModern
) -> None:
    fake.handlers["tools/call"] = scripted(input_required({"draft": SAMPLE}, "s"))
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect(capabilities={"roots": {}})
        reply = await peer.request("tools/call", {"name": "t", "arguments": {}})
    assert reply.error["code"] == jsonrpc.INTERNAL_ERROR
    assert [m for m in reply.messages if "method" in m] == []
    [call] = fake.calls_of("tools/call")
    assert call.meta[meta.CLIENT_CAPABILITIES] == {"roots": {}}


async def test_a_client_error_to_a_sampling_request_fails_the_call_with_that_error(
    peer: LegacyClient, fake: FakeModern
) -> None:
    fake.handlers["tools/call"] = scripted(input_required({"draft": SAMPLE}, "s"))
    answers = {"sampling/createMessage": {"error": {"code": USER_REJECTED, "message": "User rejected sampling"}}}
    async with asyncio.timeout(WAIT):
        request_id, response = await peer.send("tools/call", {"name": "t", "arguments": {}})
        asked, final = await drive(peer, SseReader(response), request_id, answers)
    peer.check(final, "tools/call")
    assert [m["method"] for m in asked] == ["sampling/createMessage"]
    assert final["error"]["code"] == USER_REJECTED
    assert len(fake.calls_of("tools/call")) == 1


async def test_a_client_error_to_an_elicitation_is_retried_as_a_cancelled_elicitation(
    peer: LegacyClient, fake: FakeModern
) -> None:
    fake.handlers["tools/call"] = scripted(input_required({"confirm": ELICIT}, "s"), complete(content=text("skipped")))
    answers = {"elicitation/create": {"error": {"code": USER_REJECTED, "message": "no UI available"}}}
    async with asyncio.timeout(WAIT):
        request_id, response = await peer.send("tools/call", {"name": "t", "arguments": {}})
        _, final = await drive(peer, SseReader(response), request_id, answers)
    peer.check(final, "tools/call")
    assert final["result"] == {"content": text("skipped")}
    _, retry = fake.calls_of("tools/call")
    assert retry.params["inputResponses"] == {"confirm": {"action": "cancel"}}
    assert retry.params["requestState"] == "s"


async def test_a_url_elicitation_reaches_a_2025_11_25_client_with_a_minted_elicitation_id(
    proxy: Proxy, fake: FakeModern
) -> None:
    login = {
        "method": "elicitation/create",
        "params": {"mode": "url", "message": "Sign in to continue", "url": "https://auth.example/login?x=1"},
    }
    fake.handlers["tools/call"] = scripted(input_required({"login": login}, "s"), complete(content=text("in")))
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect(capabilities={"elicitation": {"form": {}, "url": {}}})
        request_id, response = await peer.send("tools/call", {"name": "t", "arguments": {}})
        asked, final = await drive(peer, SseReader(response), request_id, {"elicitation/create": {"action": "accept"}})
    [request] = asked
    assert request["params"]["url"] == login["params"]["url"]
    assert isinstance(request["params"]["elicitationId"], str) and request["params"]["elicitationId"]
    assert final["result"] == {"content": text("in")}
    assert fake.calls_of("tools/call")[1].params["inputResponses"] == {"login": {"action": "accept"}}


# ---------------------------------------------------------------------------- 5. bad input


async def test_malformed_json_is_http_400_with_a_parse_error(peer: LegacyClient, fake: FakeModern) -> None:
    async with asyncio.timeout(WAIT):
        response = await peer.post(b'{"jsonrpc": "2.0", "id": 1, "method": ')
        assert response.status == 400
        assert (await error_body(response))["code"] == jsonrpc.PARSE_ERROR
    assert [c.method for c in fake.calls] == ["server/discover"]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"foo": 1}, id="not-jsonrpc"),
        pytest.param({"jsonrpc": "2.0", "id": None, "method": "tools/list"}, id="null-id"),
        pytest.param({"jsonrpc": "1.0", "id": 1, "method": "tools/list"}, id="wrong-version"),
        pytest.param({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1]}, id="array-params"),
        pytest.param("a string", id="string"),
        pytest.param([], id="empty-batch"),
        pytest.param([ping(1)], id="batch-in-2025-11-25"),
    ],
)
async def test_json_that_is_not_a_valid_json_rpc_message_is_http_400_invalid_request(
    peer: LegacyClient, fake: FakeModern, body: Any
) -> None:
    async with asyncio.timeout(WAIT):
        response = await peer.post(body)
        assert response.status == 400
        assert (await error_body(response))["code"] == jsonrpc.INVALID_REQUEST
    assert [c.method for c in fake.calls] == ["server/discover"]


@pytest.mark.parametrize(
    ("version_header", "code"),
    [(None, jsonrpc.INVALID_REQUEST), (MODERN_VERSIONS[0], jsonrpc.INVALID_PARAMS)],
)
async def test_a_request_without_session_or_meta_is_http_400(
    proxy: Proxy, fake: FakeModern, version_header: str | None, code: int
) -> None:
    headers = {"Accept": ACCEPT} | ({PROTOCOL_VERSION_HEADER: version_header} if version_header else {})
    async with asyncio.timeout(WAIT):
        response = await proxy.client.post(
            PATH, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=headers
        )
        assert response.status == 400
        assert (await error_body(response))["code"] == code
    assert fake.calls == []


def _forged(real: str, how: str) -> str:
    if how == "random":
        body = base64.urlsafe_b64encode(secrets.token_bytes(24)).rstrip(b"=").decode()
        mac = base64.urlsafe_b64encode(secrets.token_bytes(16)).rstrip(b"=").decode()
        return f"{body}.{mac}"
    if how == "tampered":  # change one whole base64 character inside the random part
        return real[:5] + ("A" if real[5] != "A" else "B") + real[6:]
    return "not-a-session"


@pytest.mark.parametrize("how", ["random", "tampered", "garbage"])
async def test_an_unknown_or_forged_session_id_is_http_404(peer: LegacyClient, fake: FakeModern, how: str) -> None:
    forged = _forged(peer.session_id, how)
    assert forged != peer.session_id
    async with asyncio.timeout(WAIT):
        response = await peer.post(ping(), headers={SESSION_HEADER: forged})
        assert response.status == 404
        assert (await error_body(response))["code"] == SESSION_NOT_FOUND
        get = await peer.client.get(PATH, headers={SESSION_HEADER: forged, "Accept": "text/event-stream"})
        assert get.status == 404
        await error_body(get)


async def test_a_session_id_presented_with_other_credentials_is_http_404(proxy: Proxy) -> None:
    async with asyncio.timeout(WAIT):
        alice = await proxy.connect(headers={"Authorization": "Bearer alice"})
        assert (await alice.request("ping")).result == {}
        mallory = alice.headers({"Authorization": "Bearer mallory"})
        anonymous = {k: v for k, v in alice.headers().items() if k != "Authorization"}
        for headers in (mallory, anonymous):
            response = await proxy.client.post(PATH, data=json.dumps(ping()), headers=headers)
            assert response.status == 404
            assert (await error_body(response))["code"] == SESSION_NOT_FOUND


@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_get_or_delete_without_a_session_is_http_405(proxy: Proxy, method: str) -> None:
    async with asyncio.timeout(WAIT):
        response = await proxy.client.request(method, PATH, headers={"Accept": ACCEPT})
        assert response.status == 405
        assert "POST" in response.headers.get("Allow", "")
        await error_body(response)


async def test_a_body_over_the_size_limit_is_http_413_with_a_json_error(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(**{"security.max_body_bytes": 1024})
    big = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "x", "arguments": {"b": "a" * 4096}}}
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        response = await peer.post(big)
        assert response.status == 413
        assert (await error_body(response))["code"] == jsonrpc.INVALID_REQUEST


@pytest.mark.parametrize(("method", "path"), [("GET", "/nope"), ("POST", "/nope"), ("PUT", PATH)])
async def test_an_unknown_path_or_method_answers_a_json_error_not_html(proxy: Proxy, method: str, path: str) -> None:
    async with asyncio.timeout(WAIT):
        response = await proxy.client.request(method, path, json=ping(), headers={"Accept": ACCEPT})
        assert 400 <= response.status < 500
        await error_body(response)


@pytest.mark.parametrize("method", ["initialize", "POST", "GET", "DELETE"])
async def test_a_foreign_origin_is_refused_with_http_403(peer: LegacyClient, method: str) -> None:
    evil = {"Origin": "https://evil.example"}
    async with asyncio.timeout(WAIT):
        if method == "initialize":
            response = await peer.client.post(PATH, json=initialize_message(), headers={"Accept": ACCEPT, **evil})
            assert SESSION_HEADER not in response.headers
        elif method == "POST":
            response = await peer.post(ping(), headers=evil)
        elif method == "GET":
            response = await peer.get_stream(headers=evil)
        else:
            response = await peer.delete(headers=evil)
        assert response.status == 403
        await error_body(response)
        assert (await peer.request("ping")).result == {}  # the session was not touched


async def test_a_non_loopback_host_header_is_refused(proxy: Proxy, fake: FakeModern) -> None:
    async with asyncio.timeout(WAIT):
        response = await proxy.client.post(
            PATH, json=initialize_message(), headers={"Accept": ACCEPT, "Host": "evil.example"}
        )
        assert 400 <= response.status < 500
        await error_body(response)
    assert fake.calls == []


async def test_initialize_against_an_unreachable_upstream_is_a_json_rpc_error_not_a_hang(
    make_proxy: MakeProxy,
) -> None:
    proxy = await make_proxy(upstream_url=closed_port_url())
    async with asyncio.timeout(WAIT):
        response = await proxy.client.post(PATH, json=initialize_message(), headers={"Accept": ACCEPT})
        reply = await read_reply(response, LATEST_LEGACY, "initialize", 0)
    assert response.status == 200
    assert SESSION_HEADER not in response.headers
    assert reply.error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE


async def test_a_request_after_the_upstream_went_away_is_upstream_unavailable(
    peer: LegacyClient, fake_server: tuple[FakeModern, Any]
) -> None:
    async with asyncio.timeout(WAIT):
        await fake_server[1].close()
        reply = await peer.request("tools/list")
    assert reply.status == 200
    assert reply.error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE


async def test_an_upstream_that_never_answers_times_out_with_upstream_timeout(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    proxy = await make_proxy(**{"upstream.request_timeout_s": 0.3})
    fake.handlers["resources/read"] = hang
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        reply = await peer.request("resources/read", {"uri": "file:///slow"})
        [call] = fake.calls_of("resources/read")
        await call.cancelled.wait()  # and the proxy gave up on the upstream request
    assert reply.status == 200
    assert reply.error["code"] == jsonrpc.UPSTREAM_TIMEOUT


@pytest.mark.parametrize(
    "upstream_reply",
    [
        pytest.param(Reply(200, "this is not json", "application/json"), id="json-type-garbage-body"),
        pytest.param(Reply(200, "<html><body>oops</body></html>", "text/html"), id="html-200"),
        pytest.param(Reply(200, {"foo": 1}), id="json-not-jsonrpc"),
        pytest.param(Reply(200, {"jsonrpc": "2.0", "id": "someone-else", "result": {}}), id="answer-to-another-id"),
        pytest.param(Reply(200, "data: not json\n\n", "text/event-stream"), id="sse-garbage"),
    ],
)
async def test_an_upstream_reply_that_is_not_json_rpc_is_upstream_invalid_and_logged_with_the_upstream_name(
    peer: LegacyClient, fake: FakeModern, upstream_reply: Reply
) -> None:
    fake.handlers["resources/read"] = respond_with(upstream_reply)
    async with asyncio.timeout(WAIT):
        with capture_logs() as logs:
            reply = await peer.request("resources/read", {"uri": "file:///x"})
    assert reply.status == 200
    assert reply.error["code"] == jsonrpc.UPSTREAM_INVALID
    named = [e for e in logs if e.get("upstream") == UPSTREAM_NAME and e.get("log_level") in ("warning", "error")]
    assert named, logs


async def test_a_version_refusal_offering_the_version_asked_for_is_retried_once(proxy: Proxy, fake: FakeModern) -> None:
    """A server may refuse a first request with -32022 though it supports the version asked for
    (the runner's 2026-07-28 `request-metadata` client scenario does): a native client tries again
    once with the version offered, and so does the proxy, rather than fail the legacy initialize."""
    answers: list[Outcome] = [
        Reply(
            400,
            jsonrpc.error_response(None, jsonrpc.UNSUPPORTED_PROTOCOL_VERSION, "try again", {"supported": [MODERN]}),
        )
    ]

    async def discover(call: Call) -> Outcome:
        return answers.pop(0) if answers else complete(**fake.discover)

    fake.handlers["server/discover"] = discover
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
    assert peer.initialize_result["serverInfo"]["name"]
    assert [c.meta[meta.PROTOCOL_VERSION] for c in fake.calls_of("server/discover")] == [MODERN, MODERN]


async def test_a_version_refusal_offering_nothing_the_proxy_speaks_fails_the_initialize(
    proxy: Proxy, fake: FakeModern
) -> None:
    refusal = jsonrpc.error_response(None, jsonrpc.UNSUPPORTED_PROTOCOL_VERSION, "no", {"supported": ["2099-01-01"]})
    fake.handlers["server/discover"] = respond_with(Reply(400, refusal))
    async with asyncio.timeout(WAIT):
        response = await proxy.client.post(PATH, json=initialize_message(), headers={"Accept": ACCEPT})
        reply = await read_reply(response, LATEST_LEGACY, "initialize", 0)
    assert "error" in reply.messages[0], reply.messages
    assert len(fake.calls_of("server/discover")) == 1


@pytest.mark.parametrize("where", ["initialize", "in-session"])
async def test_an_upstream_401_is_relayed_with_its_www_authenticate_header(
    proxy: Proxy, fake: FakeModern, where: str
) -> None:
    challenge = 'Bearer resource_metadata="http://127.0.0.1/.well-known/oauth-protected-resource"'
    unauthorized = Reply(401, {"error": "invalid_token"}, headers={"WWW-Authenticate": challenge})
    async with asyncio.timeout(WAIT):
        if where == "initialize":
            fake.handlers["server/discover"] = respond_with(unauthorized)
            response = await proxy.client.post(PATH, json=initialize_message(), headers={"Accept": ACCEPT})
        else:
            peer = await proxy.connect()
            fake.handlers["resources/list"] = respond_with(unauthorized)
            _, response = await peer.send("resources/list")
        assert response.status == 401
        # Relayed, naming the proxy's metadata (tests/integration/test_oauth_discovery.py).
        metadata = proxy.client.make_url("/.well-known/oauth-protected-resource/mcp")
        assert response.headers.get("WWW-Authenticate") == f'Bearer resource_metadata="{metadata}"'
        await error_body(response)


# ---------------------------------------------------------------------------- 6. sessions


async def test_delete_ends_the_session_and_its_id_then_answers_404(peer: LegacyClient) -> None:
    async with asyncio.timeout(WAIT):
        deleted = await peer.delete()
        assert deleted.status == 200
        for response in (await peer.post(ping()), await peer.get_stream(), await peer.delete()):
            assert response.status == 404
            assert (await error_body(response))["code"] == SESSION_NOT_FOUND


async def test_an_idle_session_expires_and_its_id_then_answers_404(make_proxy: MakeProxy) -> None:
    clock = FakeClock()
    proxy = await make_proxy(clock=clock, **{"sessions.idle_timeout_s": 60})
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        clock.advance(45)
        assert (await peer.request("ping")).result == {}  # activity keeps it alive
        clock.advance(45)
        assert (await peer.request("ping")).result == {}
        clock.advance(61)
        response = await peer.post(ping())
        assert response.status == 404
        assert (await error_body(response))["code"] == SESSION_NOT_FOUND


async def test_the_reaper_closes_only_sessions_idle_past_the_timeout(make_proxy: MakeProxy) -> None:
    clock = FakeClock()
    proxy = await make_proxy(clock=clock, **{"sessions.idle_timeout_s": 60})
    async with asyncio.timeout(WAIT):
        idle = await proxy.connect()
        active = await proxy.connect()
        clock.advance(40)
        assert (await active.request("ping")).result == {}
        clock.advance(30)
        assert await proxy.relay.reap() == 1
        assert (await active.request("ping")).result == {}
        assert (await idle.post(ping())).status == 404


async def test_initialize_beyond_max_sessions_is_refused_until_a_session_ends(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(**{"sessions.max_sessions": 2})
    async with asyncio.timeout(WAIT):
        first = await proxy.connect()
        await proxy.connect()
        response = await proxy.client.post(PATH, json=initialize_message(), headers={"Accept": ACCEPT})
        assert response.status == 503
        assert SESSION_HEADER not in response.headers
        assert (await error_body(response))["code"] == jsonrpc.LIMIT_EXCEEDED
        assert (await first.delete()).status == 200
        await proxy.connect()


async def test_a_get_stream_beyond_the_per_session_limit_is_http_409(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(**{"sessions.max_get_streams": 1})
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        first = await peer.get_stream()
        assert first.status == 200
        second = await peer.get_stream()
        assert second.status == 409
        assert (await error_body(second))["code"] == jsonrpc.LIMIT_EXCEEDED
        first.close()


# ---------------------------------------------------------------------------- 7. cancellation


async def test_a_cancelled_notification_closes_the_upstream_request_and_no_result_is_sent(
    peer: LegacyClient, fake: FakeModern
) -> None:
    fake.handlers["resources/read"] = hang
    async with asyncio.timeout(WAIT):
        pending = asyncio.create_task(peer.request("resources/read", {"uri": "file:///slow"}, id="call-1"))
        call = await fake.next_call("resources/read")
        assert await peer.notify("notifications/cancelled", {"requestId": "call-1", "reason": "user"}) == 202
        await call.cancelled.wait()
        reply = await pending
    assert reply.status < 300
    assert reply.final is None
    assert reply.messages == []


async def test_a_client_disconnecting_mid_stream_closes_the_upstream_request(
    peer: LegacyClient, fake: FakeModern
) -> None:
    async def tool(call: Call) -> Outcome:
        await call.send(notification("notifications/progress", {"progressToken": 1, "progress": 1}))
        return await hang(call)

    fake.handlers["tools/call"] = tool
    async with asyncio.timeout(WAIT):
        _, response = await peer.send("tools/call", {"name": "slow", "arguments": {}, "_meta": {"progressToken": 1}})
        reader = SseReader(response)
        progress = await reader.message()
        assert progress is not None and progress["method"] == "notifications/progress"
        peer.check(progress)
        [call] = fake.calls_of("tools/call")
        response.close()
        await call.cancelled.wait()


async def test_cancelling_a_call_that_waits_for_input_withdraws_the_client_request(
    peer: LegacyClient, fake: FakeModern
) -> None:
    fake.handlers["tools/call"] = scripted(input_required({"confirm": ELICIT}, "s"))
    async with asyncio.timeout(WAIT):
        request_id, response = await peer.send("tools/call", {"name": "t", "arguments": {}})
        reader = SseReader(response)
        ask = await reader.message()
        assert ask is not None and ask["method"] == "elicitation/create"
        peer.check(ask)
        assert await peer.notify("notifications/cancelled", {"requestId": request_id, "reason": "user"}) == 202
        rest: list[JSONDict] = []
        while (message := await reader.message()) is not None:
            peer.check(message)
            rest.append(message)
    assert [m.get("method") for m in rest] == ["notifications/cancelled"]
    assert rest[0]["params"]["requestId"] == ask["id"]
    assert len(fake.calls_of("tools/call")) == 1


# ---------------------------------------------------------------------------- 8. GET stream and subscriptions

LIST_CHANGED = ("notifications/tools/list_changed", "notifications/prompts/list_changed")
ALL_LIST_CHANGES = {"toolsListChanged": True, "promptsListChanged": True, "resourcesListChanged": True}


async def test_a_get_stream_listens_upstream_and_relays_list_changes_without_the_subscription_id(
    peer: LegacyClient, fake: FakeModern
) -> None:
    async with asyncio.timeout(WAIT):
        response = await peer.get_stream()
        assert response.status == 200
        assert content_type(response) == "text/event-stream"
        assert response.headers["X-Accel-Buffering"] == "no"
        listen = await fake.wait_listen()
        for method in (*LIST_CHANGED, "notifications/resources/list_changed"):
            listen.push(method)
        reader = SseReader(response)
        received = [await reader.message() for _ in range(3)]
        response.close()
    assert listen.call.headers[METHOD_HEADER] == "subscriptions/listen"
    assert listen.call.headers[PROTOCOL_VERSION_HEADER] == MODERN
    assert listen.call.meta[meta.PROTOCOL_VERSION] == MODERN
    assert listen.filter == ALL_LIST_CHANGES
    for message in received:
        assert message is not None
        peer.check(message)
    assert received == [
        notification("notifications/tools/list_changed"),
        notification("notifications/prompts/list_changed"),
        notification("notifications/resources/list_changed"),
    ]


async def test_a_get_stream_is_answered_once_the_upstream_listen_feeding_it_is_acknowledged(
    peer: LegacyClient, fake: FakeModern
) -> None:
    """A client (the stdio bridge does) that waits for its GET stream before changing anything
    must not miss the list_changed of its change: the stream is answered after the upstream listen
    that feeds it is acknowledged (bounded), not before the listen even starts."""
    fake.ack_gate = asyncio.Event()
    async with asyncio.timeout(WAIT):
        opening = asyncio.create_task(peer.get_stream())
        listen = await fake.wait_listen(acked=False)
        assert not opening.done()  # no answer while nothing listens upstream
        fake.ack_gate.set()
        stream = await opening
    assert stream.status == 200 and listen.acked.is_set()
    assert listen.filter.get("toolsListChanged") is True
    stream.close()


async def test_resources_subscribe_replies_only_after_the_upstream_acknowledges_the_uri(
    peer: LegacyClient, fake: FakeModern
) -> None:
    uri = "file:///notes.md"
    fake.ack_gate = asyncio.Event()

    async def subscribe() -> tuple[Any, list[bool]]:
        reply = await peer.request("resources/subscribe", {"uri": uri})
        return reply, [listen.acked.is_set() for listen in fake.listens]

    async with asyncio.timeout(WAIT):
        task = asyncio.create_task(subscribe())
        listen = await fake.wait_listen(acked=False)
        assert not task.done()
        fake.ack_gate.set()
        reply, acked_when_replied = await task
    assert reply.result == {}
    assert acked_when_replied == [True]
    assert listen.filter == {"resourceSubscriptions": [uri]}
    assert listen.call.headers[METHOD_HEADER] == "subscriptions/listen"


async def test_resources_subscribe_fails_when_the_acknowledgement_omits_the_uri(
    peer: LegacyClient, fake: FakeModern
) -> None:
    fake.listen_ack = lambda requested: {k: v for k, v in requested.items() if k != "resourceSubscriptions"}
    async with asyncio.timeout(WAIT):
        reply = await peer.request("resources/subscribe", {"uri": "file:///nope"})
    assert reply.error["code"] == jsonrpc.INTERNAL_ERROR


async def test_resource_updates_reach_the_get_stream_without_the_subscription_id(
    peer: LegacyClient, fake: FakeModern
) -> None:
    uri = "file:///notes.md"
    async with asyncio.timeout(WAIT):
        response = await peer.get_stream()
        reader = SseReader(response)
        first = await fake.wait_listen()
        assert (await peer.request("resources/subscribe", {"uri": uri})).result == {}
        current = await fake.wait_listen(lambda listen: uri in listen.filter.get("resourceSubscriptions", ()))
        await first.closed.wait()  # the re-listen replaced the old stream once acknowledged
        current.push("notifications/resources/updated", {"uri": uri})
        message = await reader.message()
        response.close()
    assert current.filter == {**ALL_LIST_CHANGES, "resourceSubscriptions": [uri]}
    assert message is not None
    peer.check(message)
    assert message == notification("notifications/resources/updated", {"uri": uri})


async def test_after_unsubscribe_updates_for_that_uri_no_longer_arrive(peer: LegacyClient, fake: FakeModern) -> None:
    a, b = "file:///a.txt", "file:///b.txt"
    async with asyncio.timeout(WAIT):
        response = await peer.get_stream()
        reader = SseReader(response)
        await fake.wait_listen()
        assert (await peer.request("resources/subscribe", {"uri": a})).result == {}
        assert (await peer.request("resources/subscribe", {"uri": b})).result == {}
        both = await fake.wait_listen(lambda listen: listen.filter.get("resourceSubscriptions") == [a, b])
        fake.ack_gate = asyncio.Event()  # hold the re-listen: only local filtering can stop `a` now
        assert (await peer.request("resources/unsubscribe", {"uri": a})).result == {}
        both.push("notifications/resources/updated", {"uri": a})
        both.push("notifications/resources/updated", {"uri": b})
        message = await reader.message()
        fake.ack_gate.set()
        narrowed = await fake.wait_listen(lambda listen: listen.filter.get("resourceSubscriptions") == [b])
        await both.closed.wait()
        response.close()
    assert message is not None
    peer.check(message)
    assert message == notification("notifications/resources/updated", {"uri": b})
    assert narrowed.filter == {**ALL_LIST_CHANGES, "resourceSubscriptions": [b]}


async def test_delete_closes_the_upstream_listen_stream_and_ends_the_get_stream(
    peer: LegacyClient, fake: FakeModern
) -> None:
    async with asyncio.timeout(WAIT):
        response = await peer.get_stream()
        reader = SseReader(response)
        listen: Listen = await fake.wait_listen()
        assert (await peer.delete()).status == 200
        await listen.closed.wait()
        assert await reader.message() is None


# ---------------------------------------------------------------------------- 9. keep-alive


def answered_late(release: asyncio.Event) -> Any:
    """A tool handler that answers "late" once `release` is set."""

    async def long_tool(call: Call) -> Outcome:
        await release.wait()
        return complete(content=text("late"))

    return long_tool


async def test_a_result_slower_than_the_keepalive_interval_comes_on_an_sse_stream_kept_alive_meanwhile(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    """Intermediaries with an idle timeout (ingress-nginx: 60 s) must not cut a long quiet call."""
    proxy = await make_proxy(**{"streams.keepalive_s": 0.05})
    release = asyncio.Event()
    fake.handlers["tools/call"] = answered_late(release)
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        request_id, response = await peer.send("tools/call", {"name": "long", "arguments": {}})
        assert content_type(response) == "text/event-stream"  # headers sent while the call runs
        reader = SseReader(response)
        assert await reader.comment()
        release.set()
        final = await reader.message()
        assert await reader.message() is None
    check(LATEST_LEGACY, final, "tools/call")
    assert final == {"jsonrpc": "2.0", "id": request_id, "result": {"content": text("late")}}


async def test_a_2025_03_26_batch_that_runs_long_streams_its_replies_kept_alive_even_after_an_item_failed(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    """One item failing at once (an unknown log level) must not keep the slow rest of the batch
    on plain JSON, which an intermediary's idle timeout would cut."""
    proxy = await make_proxy(**{"streams.keepalive_s": 0.05})
    release = asyncio.Event()
    fake.handlers["tools/call"] = answered_late(release)
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "logging/setLevel", "params": {"level": "loud"}},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "long", "arguments": {}}},
    ]
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect("2025-03-26")
        response = await peer.post(batch)
        assert content_type(response) == "text/event-stream"  # headers sent while the call runs
        reader = SseReader(response)
        assert await reader.comment()
        release.set()
        replies = [await reader.message(), await reader.message()]
        assert await reader.message() is None
    by_id = {reply["id"]: reply for reply in replies if reply is not None}
    assert by_id[1]["error"]["code"] == jsonrpc.INVALID_PARAMS
    assert by_id[2]["result"] == {"content": text("late")}


async def test_a_2025_03_26_batch_of_quick_requests_is_one_json_array(make_proxy: MakeProxy, fake: FakeModern) -> None:
    proxy = await make_proxy(**{"streams.keepalive_s": 5})
    fake.handlers["tools/call"] = respond_with(complete(content=text("quick")))
    batch = [
        ping(1),
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "quick", "arguments": {}}},
    ]
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect("2025-03-26")
        response = await peer.post(batch)
        assert content_type(response) == "application/json"
        replies = json.loads(await response.read())
    assert sorted(replies, key=lambda r: r["id"]) == [
        {"jsonrpc": "2.0", "id": 1, "result": {}},
        {"jsonrpc": "2.0", "id": 2, "result": {"content": text("quick")}},
    ]


@pytest.mark.parametrize(
    ("item", "code"),
    [
        ({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": 7}}, jsonrpc.INVALID_PARAMS),
        ({"jsonrpc": "2.0", "id": 2, "method": "tools/\u0007call", "params": {}}, jsonrpc.INVALID_REQUEST),
    ],
    ids=["name-not-a-string", "control-character"],
)
async def test_a_2025_03_26_batch_with_one_unfit_message_is_refused_whole(
    make_proxy: MakeProxy, fake: FakeModern, item: dict[str, Any], code: int
) -> None:
    proxy = await make_proxy()
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect("2025-03-26")
        response = await peer.post([ping(1), item])
        assert response.status == 400
        assert (await error_body(response))["code"] == code
    assert "tools/call" not in [c.method for c in fake.calls]


async def test_a_slow_result_stays_plain_json_for_a_client_that_accepts_only_json(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    proxy = await make_proxy(**{"streams.keepalive_s": 0.05})
    seen = asyncio.Event()

    async def long_tool(call: Call) -> Outcome:
        seen.set()
        # Several keep-alive intervals, bounded: nothing may be written before the result.
        await asyncio.sleep(0.3)
        return complete(content=text("late"))

    fake.handlers["tools/call"] = long_tool
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        reply = await peer.request(
            "tools/call", {"name": "long", "arguments": {}}, headers={"Accept": "application/json"}
        )
    assert seen.is_set()
    assert reply.content_type == "application/json"
    assert reply.messages == [{"jsonrpc": "2.0", "id": reply.request_id, "result": {"content": text("late")}}]


async def test_a_quiet_get_stream_receives_keepalive_comments(make_proxy: MakeProxy, fake: FakeModern) -> None:
    proxy = await make_proxy(**{"streams.keepalive_s": 0.05})
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        response = await peer.get_stream()
        reader = SseReader(response)
        assert await reader.comment()
        assert await reader.comment()
        response.close()
    assert reader.comments >= 2


async def test_a_load_shedding_answer_is_retried_with_its_state_on_a_new_request(
    peer: LegacyClient, fake: FakeModern
) -> None:
    """input_required with a requestState only (2026-07-28/basic/patterns/mrtr.mdx): the retry is
    a new upstream request, not a second reply awaited on the first one's stream."""
    fake.handlers["tools/call"] = scripted(
        input_required(request_state="shed-1"), complete(content=[{"type": "text", "text": "ok"}])
    )
    async with asyncio.timeout(5.0):
        reply = await peer.request("tools/call", {"name": "busy", "arguments": {}})
    assert reply.result["content"] == [{"type": "text", "text": "ok"}]
    _, retry = fake.calls_of("tools/call")
    assert retry.params["requestState"] == "shed-1" and "inputResponses" not in retry.params
