"""Modern (2026-07-28) clients through the real proxy app to a scripted legacy (2025-11-25) upstream.

Design: docs/translation.md §4 (with §1.1, §6 and §7). Every message the
proxy sends the modern client is checked against the 2026-07-28 schema (tests/support/modern_client),
and everything it sends the legacy upstream against 2025-11-25 (`fake.protocol_problems()`).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs

from proxy.app import METRICS, MODERN_TO_LEGACY, create_app
from proxy.config import Settings, load_settings
from proxy.errors import SESSION_NOT_FOUND
from proxy.protocol import jsonrpc, meta
from proxy.protocol.headers import METHOD_HEADER, NAME_HEADER, PROTOCOL_VERSION_HEADER, SESSION_HEADER
from proxy.protocol.parked_call import ParkedCall
from proxy.protocol.versions import LATEST_LEGACY, LATEST_MODERN
from proxy.state.sessions import short_hash
from tests.integration.conftest import FakeClock, closed_port_url, serve
from tests.support import legacy_client
from tests.support.fake_legacy import (
    INSTRUCTIONS,
    PATH,
    SERVER_INFO,
    Call,
    FakeLegacy,
    Outcome,
    Pending,
    Reply,
    Session,
    error,
    hang,
    notification,
)
from tests.support.legacy_client import LegacyClient
from tests.support.mcp_client import McpReply, SseReader, content_type
from tests.support.modern_client import ModernClient, ModernStream, check, read_reply

JSONDict = dict[str, Any]
WAIT = 5.0  # upper bound for anything a test waits for
UPSTREAM_NAME = "fake-legacy-upstream"
SINFO = {meta.SERVER_INFO: SERVER_INFO}

ELICIT_PARAMS: JSONDict = {
    "mode": "form",
    "message": "Deploy to production?",
    "requestedSchema": {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]},
}
URL_ELICIT_PARAMS: JSONDict = {
    "mode": "url",
    "message": "Sign in to continue",
    "url": "https://auth.example.com/start",
    "elicitationId": "e-1",
}
SAMPLE_PARAMS: JSONDict = {
    "messages": [{"role": "user", "content": {"type": "text", "text": "Summarise the diff"}}],
    "maxTokens": 64,
}
ACCEPTED: JSONDict = {"action": "accept", "content": {"confirm": True}}
SAMPLED: JSONDict = {
    "role": "assistant",
    "content": {"type": "text", "text": "Looks fine."},
    "model": "test-model",
    "stopReason": "endTurn",
}
DEPLOY: JSONDict = {"name": "deploy", "arguments": {"env": "prod"}}
WATCHED = "file:///watched/config.yaml"


# ---------------------------------------------------------------------------- fixtures


@dataclass
class Proxy:
    app: web.Application
    http: TestClient
    settings: Settings

    def modern(
        self, authorization: str | None = None, *, capabilities: JSONDict | None = None, **kwargs: Any
    ) -> ModernClient:
        headers = {"Authorization": authorization} if authorization else {}
        return ModernClient(self.http, capabilities=capabilities, headers=headers, **kwargs)


MakeProxy = Callable[..., Awaitable[Proxy]]


@pytest.fixture
async def fake_server(aiohttp_server: Any) -> tuple[FakeLegacy, TestServer]:
    fake = FakeLegacy()
    server = await serve(aiohttp_server, fake.app)
    fake.url = str(server.make_url(PATH))
    return fake, server


@pytest.fixture
async def fake(fake_server: tuple[FakeLegacy, TestServer]) -> AsyncIterator[FakeLegacy]:
    fake = fake_server[0]
    yield fake
    problems = fake.protocol_problems()
    assert not problems, f"the proxy sent what a 2025-11-25 server must refuse: {problems}"


@pytest.fixture
def make_proxy(aiohttp_server: Any, aiohttp_client: Any, fake: FakeLegacy) -> MakeProxy:
    """Build and serve a proxy in front of the fake: `await make_proxy(**{"input.park_timeout_s": 1})`."""

    async def build(*, clock: Any = None, **overrides: Any) -> Proxy:
        settings = load_settings(
            None,
            **{"upstream.url": fake.url, "upstream.name": UPSTREAM_NAME, "upstream.era": "legacy", **overrides},
        )
        app, admin = create_app(settings, **({"clock": clock} if clock is not None else {}))
        assert admin is None
        server = await serve(aiohttp_server, app)
        return Proxy(app, await aiohttp_client(server), settings)

    return build


@pytest.fixture
async def proxy(make_proxy: MakeProxy) -> Proxy:
    return await make_proxy()


@pytest.fixture
def client(proxy: Proxy) -> ModernClient:
    """A modern client declaring roots, sampling (context, tools) and elicitation (form, url)."""
    return proxy.modern("Bearer alice")


# ---------------------------------------------------------------------------- helpers


def text(value: str) -> list[JSONDict]:
    return [{"type": "text", "text": value}]


def tool_result(value: str) -> JSONDict:
    return {"content": text(value)}


def answered_after(release: asyncio.Event, outcome: Outcome) -> Any:
    """A fake handler that answers `outcome` once `release` is set."""

    async def handler(call: Call) -> Outcome:
        await release.wait()
        return outcome

    return handler


def respond_with(outcome: Outcome) -> Any:
    async def handler(call: Call) -> Outcome:
        return copy.deepcopy(outcome)

    return handler


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


async def error_of(response: ClientResponse, request_id: Any) -> JSONDict:
    """The JSON-RPC error an HTTP reply carries (validated, and answering `request_id`)."""
    assert content_type(response) == "application/json", response.headers
    assert SESSION_HEADER not in response.headers
    message = json.loads(await response.read())
    check(message)
    assert "error" in message, message
    assert message.get("id") == request_id, message
    return message["error"]


def retry(params: JSONDict, state: str, responses: JSONDict) -> JSONDict:
    """The MRTR retry of a request: the same params plus inputResponses and requestState."""
    return {**copy.deepcopy(params), "inputResponses": responses, "requestState": state}


def input_required(reply: McpReply) -> JSONDict:
    assert reply.status == 200
    result = reply.result
    assert result["resultType"] == "input_required", result
    assert isinstance(result.get("requestState"), str) and result["requestState"], result
    return result


async def confirm_then_deploy(call: Call) -> Outcome:
    """tools/call: ask for confirmation on the POST stream, then finish with the answer."""
    answer = await call.ask("elicitation/create", ELICIT_PARAMS)
    return tool_result(f"deployed: {answer['result']['action']}")


async def parked(client: ModernClient, fake: FakeLegacy, params: JSONDict = DEPLOY) -> tuple[JSONDict, Call, Pending]:
    """Start a tools/call the fake parks on one elicitation; the input_required result, the call, the ask."""
    result = input_required(await client.request("tools/call", params))
    upstream = fake.calls_of("tools/call")[-1]
    [asked] = upstream.asked
    return result, upstream, asked


def untouched(upstream: Call, asked: Pending, fake: FakeLegacy) -> None:
    assert not asked.response.done(), "the parked server request was answered"
    assert not upstream.cancelled.is_set(), "the parked upstream call was closed"
    assert fake.calls_of("notifications/cancelled") == []


# ---------------------------------------------------------------------------- 1. front validation


@pytest.mark.parametrize(
    "defect", ["no-params", "no-meta", "no-protocol-version", "no-capabilities", "caps-not-object"]
)
async def test_a_request_without_the_meta_envelope_is_http_400_invalid_params_with_its_id(
    client: ModernClient, fake: FakeLegacy, defect: str
) -> None:
    message = client.message("tools/list", id="req-1")
    envelope = message["params"]["_meta"]
    if defect == "no-params":
        del message["params"]
    elif defect == "no-meta":
        del message["params"]["_meta"]
    elif defect == "no-protocol-version":
        del envelope[meta.PROTOCOL_VERSION]
    elif defect == "no-capabilities":
        del envelope[meta.CLIENT_CAPABILITIES]
    else:
        envelope[meta.CLIENT_CAPABILITIES] = ["roots"]
    async with asyncio.timeout(WAIT):
        response = await client.post(message)
        err = await error_of(response, "req-1")
    assert response.status == 400
    assert err["code"] == jsonrpc.INVALID_PARAMS
    assert fake.calls == []


CALL = {"name": "weather", "arguments": {"city": "Oslo"}}
READ = {"uri": "file:///notes.txt"}
PROMPT = {"name": "greet", "arguments": {"who": "Ada"}}


@pytest.mark.parametrize(
    ("method", "params", "overrides"),
    [
        pytest.param("tools/list", {}, {PROTOCOL_VERSION_HEADER: None}, id="no-protocol-version-header"),
        pytest.param("tools/list", {}, {PROTOCOL_VERSION_HEADER: LATEST_LEGACY}, id="version-header-differs-from-body"),
        pytest.param("tools/list", {}, {METHOD_HEADER: None}, id="no-mcp-method"),
        pytest.param("tools/list", {}, {METHOD_HEADER: "prompts/list"}, id="mcp-method-differs-from-method"),
        pytest.param("tools/call", CALL, {NAME_HEADER: None}, id="tools-call-without-mcp-name"),
        pytest.param("resources/read", READ, {NAME_HEADER: None}, id="resources-read-without-mcp-name"),
        pytest.param("prompts/get", PROMPT, {NAME_HEADER: None}, id="prompts-get-without-mcp-name"),
        pytest.param("tools/call", CALL, {NAME_HEADER: "forecast"}, id="mcp-name-differs-from-name"),
        pytest.param("resources/read", READ, {NAME_HEADER: "file:///other.txt"}, id="mcp-name-differs-from-uri"),
        pytest.param("prompts/get", PROMPT, {NAME_HEADER: "farewell"}, id="mcp-name-differs-from-prompt"),
        pytest.param(
            "tools/call", CALL, {NAME_HEADER: f"=?base64?{b64(b'forecast')}?="}, id="sentinel-decodes-to-another-name"
        ),
        pytest.param("tools/call", CALL, {NAME_HEADER: "=?base64?not*base64?="}, id="sentinel-not-base64"),
        pytest.param(
            "tools/call", CALL, {NAME_HEADER: "=?base64?" + b64(bytes([0xFF, 0xFE])) + "?="}, id="sentinel-not-utf8"
        ),
    ],
)
async def test_missing_or_mismatched_routing_headers_are_http_400_header_mismatch(
    client: ModernClient, fake: FakeLegacy, method: str, params: JSONDict, overrides: dict[str, str | None]
) -> None:
    message = client.message(method, params, id=11)
    async with asyncio.timeout(WAIT):
        response = await client.post(message, overrides)
        err = await error_of(response, 11)
    assert response.status == 400
    assert err["code"] == jsonrpc.HEADER_MISMATCH
    assert fake.calls == []


def _lists(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


async def test_json_nested_deeper_than_security_max_json_depth_is_refused_before_it_runs(
    make_proxy: MakeProxy, fake: FakeLegacy
) -> None:
    fake.handlers["tools/call"] = respond_with(tool_result("ok"))
    client = (await make_proxy(**{"security.max_json_depth": 16})).modern("Bearer alice")
    # The message is level 1, params 2, arguments 3: arrays 13 deep in an argument reach level 16.
    async with asyncio.timeout(WAIT):
        accepted = await client.request("tools/call", {"name": "t", "arguments": {"a": _lists(13)}})
        message, response = await client.send("tools/call", {"name": "t", "arguments": {"a": _lists(14)}})
        err = await error_of(response, message["id"])
    assert accepted.result["content"] == text("ok")
    assert response.status == 400
    assert err["code"] == jsonrpc.INVALID_REQUEST and "16" in err["message"]
    assert len(fake.calls_of("tools/call")) == 1


@pytest.mark.parametrize("name", ["weather", "météo", " padded "])
async def test_a_correct_base64_sentinel_in_mcp_name_is_accepted(
    client: ModernClient, fake: FakeLegacy, name: str
) -> None:
    fake.handlers["tools/call"] = respond_with(tool_result("sunny"))
    sentinel = f"=?base64?{b64(name.encode())}?="
    async with asyncio.timeout(WAIT):
        message, response = await client.send(
            "tools/call", {"name": name, "arguments": {}}, headers={NAME_HEADER: sentinel}
        )
        reply = await read_reply(response, message)
    assert reply.status == 200
    assert reply.result["content"] == text("sunny")
    [call] = fake.calls_of("tools/call")
    assert call.params["name"] == name


@pytest.mark.parametrize("version", ["2099-01-01", LATEST_LEGACY])
async def test_an_unsupported_version_in_header_and_body_is_http_400_with_the_supported_versions(
    client: ModernClient, fake: FakeLegacy, version: str
) -> None:
    message = client.message("tools/list", id="v-1", version=version)
    async with asyncio.timeout(WAIT):
        response = await client.post(message)
        err = await error_of(response, "v-1")
    assert response.status == 400
    assert err["code"] == jsonrpc.UNSUPPORTED_PROTOCOL_VERSION
    assert err["data"] == {"supported": [LATEST_MODERN], "requested": version}
    assert fake.calls == []


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("ping", None),
        ("logging/setLevel", {"level": "info"}),
        ("resources/subscribe", {"uri": WATCHED}),
        ("resources/unsubscribe", {"uri": WATCHED}),
        (
            "initialize",
            {"protocolVersion": LATEST_LEGACY, "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}},
        ),
    ],
)
async def test_methods_removed_in_2026_are_http_404_method_not_found_and_never_forwarded(
    client: ModernClient, fake: FakeLegacy, method: str, params: JSONDict | None
) -> None:
    async with asyncio.timeout(WAIT):
        reply = await client.request(method, params, id="removed-1")
    assert reply.status == 404
    assert reply.error["code"] == jsonrpc.METHOD_NOT_FOUND
    forwarded = [c for c in fake.calls_of(method) if c.id == "removed-1" or "_meta" in c.params]
    assert forwarded == []
    if method != "initialize":
        assert fake.calls_of(method) == []


async def test_a_method_whose_server_capability_the_upstream_lacks_is_http_404_and_not_forwarded(
    client: ModernClient, fake: FakeLegacy
) -> None:
    del fake.initialize_result["capabilities"]["prompts"]
    async with asyncio.timeout(WAIT):
        reply = await client.request("prompts/list")
    assert reply.status == 404
    assert reply.error["code"] == jsonrpc.METHOD_NOT_FOUND
    assert fake.calls_of("prompts/list") == []


async def test_a_method_the_upstream_does_not_know_is_http_404_method_not_found(
    client: ModernClient, fake: FakeLegacy
) -> None:
    async with asyncio.timeout(WAIT):
        reply = await client.request("com.example/unknown", {"x": 1})
    assert reply.status == 404
    assert reply.error["code"] == jsonrpc.METHOD_NOT_FOUND
    assert len(fake.calls_of("com.example/unknown")) == 1


async def test_a_json_rpc_response_posted_by_a_modern_client_is_http_400_invalid_request(
    client: ModernClient, fake: FakeLegacy
) -> None:
    async with asyncio.timeout(WAIT):
        response = await client.post({"jsonrpc": "2.0", "id": 5, "result": {}})
        body = json.loads(await response.read())
    check(body)
    assert response.status == 400
    assert body["error"]["code"] == jsonrpc.INVALID_REQUEST
    assert fake.calls == []


@pytest.mark.parametrize("with_envelope", [False, True], ids=["plain", "with-envelope"])
async def test_a_notification_from_a_modern_client_is_accepted_with_202_and_not_forwarded(
    client: ModernClient, fake: FakeLegacy, with_envelope: bool
) -> None:
    params: JSONDict = {"requestId": 3, "reason": "user"}
    if with_envelope:
        params["_meta"] = client.envelope()
    message = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}
    async with asyncio.timeout(WAIT):
        response = await client.post(message)
        body = await response.read()
    assert response.status == 202
    assert body == b""
    assert fake.calls == []


@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_get_or_delete_without_a_session_is_http_405(proxy: Proxy, fake: FakeLegacy, method: str) -> None:
    async with asyncio.timeout(WAIT):
        response = await proxy.http.request(method, PATH, headers={"Accept": "text/event-stream"})
        await response.read()
    assert response.status == 405
    assert fake.calls == []


async def test_an_unknown_log_level_is_http_400_invalid_params(client: ModernClient, fake: FakeLegacy) -> None:
    message = client.message("tools/list", id=4, log_level="verbose")
    async with asyncio.timeout(WAIT):
        response = await client.post(message)
        err = await error_of(response, 4)
    assert response.status == 400
    assert err["code"] == jsonrpc.INVALID_PARAMS
    assert fake.calls_of("tools/list") == []


# ---------------------------------------------------------------------------- 2. discover and results


async def test_server_discover_is_answered_from_the_legacy_initialize_result(
    client: ModernClient, fake: FakeLegacy
) -> None:
    fake.initialize_result["capabilities"].update(
        {
            "experimental": {"com.example/x": {"on": True}},
            "tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}},
        }
    )
    async with asyncio.timeout(WAIT):
        reply = await client.request("server/discover")
    assert reply.status == 200
    assert reply.result == {
        "resultType": "complete",
        "supportedVersions": [LATEST_MODERN],
        "capabilities": {
            "tools": {"listChanged": True},
            "prompts": {"listChanged": True},
            "resources": {"subscribe": True, "listChanged": True},
            "logging": {},
            "completions": {},
            "experimental": {"com.example/x": {"on": True}},
            # Its 2025-11-25 tasks are not the extension's; the proxy hosts the extension's tasks.
            "extensions": {"io.modelcontextprotocol/tasks": {}},
        },
        "instructions": INSTRUCTIONS,
        "_meta": SINFO,
        "ttlMs": 0,
        "cacheScope": "private",
    }
    assert fake.calls_of("server/discover") == []


async def test_cache_hints_can_be_configured_per_method(make_proxy: MakeProxy, fake: FakeLegacy) -> None:
    proxy = await make_proxy(
        **{
            "upstream.cache_methods": {
                "server/discover": {"ttl_ms": 60000, "scope": "public"},
                "tools/list": {"ttl_ms": 5000},
            }
        }
    )
    client = proxy.modern()
    fake.handlers["prompts/list"] = respond_with({"prompts": []})
    async with asyncio.timeout(WAIT):
        discover = await client.request("server/discover")
        tools = await client.request("tools/list")
        prompts = await client.request("prompts/list")
    assert (discover.result["ttlMs"], discover.result["cacheScope"]) == (60000, "public")
    assert (tools.result["ttlMs"], tools.result["cacheScope"]) == (5000, "private")
    assert (prompts.result["ttlMs"], prompts.result["cacheScope"]) == (0, "private")


@pytest.mark.parametrize(
    ("method", "params", "legacy_result"),
    [
        ("prompts/list", None, {"prompts": [{"name": "greet"}], "nextCursor": "page-2"}),
        ("resources/list", None, {"resources": [{"uri": "file:///a.txt", "name": "a"}]}),
        ("resources/templates/list", None, {"resourceTemplates": [{"uriTemplate": "file:///{p}", "name": "files"}]}),
        ("resources/read", READ, {"contents": [{"uri": READ["uri"], "text": "hello"}]}),
    ],
)
async def test_cacheable_results_carry_result_type_cache_hints_and_server_info(
    client: ModernClient, fake: FakeLegacy, method: str, params: JSONDict | None, legacy_result: JSONDict
) -> None:
    fake.handlers[method] = respond_with(legacy_result)
    async with asyncio.timeout(WAIT):
        reply = await client.request(method, params)
    assert reply.status == 200
    assert reply.result == {
        **legacy_result,
        "resultType": "complete",
        "ttlMs": 0,
        "cacheScope": "private",
        "_meta": SINFO,
    }


async def test_an_mcp_apps_tool_and_its_ui_resource_reach_the_modern_client_untouched(
    client: ModernClient, fake: FakeLegacy
) -> None:
    app_tool = {
        "name": "show-chart",
        "inputSchema": {"type": "object"},
        "_meta": {
            "ui": {"resourceUri": "ui://charts/app.html", "visibility": ["app"]},
            "ui/resourceUri": "ui://charts/app.html",
        },
    }
    html = {
        "uri": "ui://charts/app.html",
        "mimeType": "text/html;profile=mcp-app",
        "text": "<!doctype html>",
        "_meta": {"ui": {}},
    }
    fake.tools = [app_tool]
    fake.handlers["resources/read"] = respond_with({"contents": [html]})
    async with asyncio.timeout(WAIT):
        listed = await client.request("tools/list")
        read = await client.request("resources/read", {"uri": html["uri"]})
    assert listed.result["tools"] == [app_tool]
    assert read.result["contents"] == [html]


async def test_tools_list_strips_execution_and_keeps_everything_else(client: ModernClient, fake: FakeLegacy) -> None:
    tool = {
        "name": "deploy",
        "title": "Deploy",
        "inputSchema": {"type": "object", "properties": {"env": {"type": "string"}}},
        "annotations": {"destructiveHint": True},
        "_meta": {"com.example/owner": "ops"},
    }
    fake.tools = [{**tool, "execution": {"taskSupport": "optional"}}]
    async with asyncio.timeout(WAIT):
        reply = await client.request("tools/list")
    assert reply.result == {
        "tools": [tool],
        "resultType": "complete",
        "ttlMs": 0,
        "cacheScope": "private",
        "_meta": SINFO,
    }


async def test_a_tool_result_carries_result_type_and_server_info_but_no_cache_hints(
    client: ModernClient, fake: FakeLegacy
) -> None:
    fake.handlers["tools/call"] = respond_with({**tool_result("ok"), "_meta": {"com.example/cost": 3}})
    async with asyncio.timeout(WAIT):
        reply = await client.request("tools/call", CALL)
    assert reply.content_type == "application/json"
    assert reply.result == {
        **tool_result("ok"),
        "resultType": "complete",
        "_meta": {"com.example/cost": 3, **SINFO},
    }


async def test_a_tool_result_slower_than_the_keepalive_interval_comes_on_a_kept_alive_sse_stream(
    make_proxy: MakeProxy, fake: FakeLegacy
) -> None:
    """Intermediaries with an idle timeout (ingress-nginx: 60 s) must not cut a long quiet call."""
    proxy = await make_proxy(**{"streams.keepalive_s": 0.05})
    client = proxy.modern("Bearer alice")
    release = asyncio.Event()
    fake.handlers["tools/call"] = answered_after(release, tool_result("late"))
    async with asyncio.timeout(WAIT):
        message, response = await client.send("tools/call", CALL)
        stream = ModernStream(response, "tools/call", message["id"])  # headers came while the call runs
        assert await stream.comment()
        release.set()
        final = await stream.next()
        assert await stream.next() is None
    assert final is not None
    assert final["result"] == {**tool_result("late"), "resultType": "complete", "_meta": SINFO}


async def test_resource_not_found_becomes_invalid_params_keeping_the_uri(
    client: ModernClient, fake: FakeLegacy
) -> None:
    fake.handlers["resources/read"] = respond_with(
        error(jsonrpc.RESOURCE_NOT_FOUND, "Resource not found", {"uri": READ["uri"]})
    )
    async with asyncio.timeout(WAIT):
        reply = await client.request("resources/read", READ)
    assert reply.status == 200
    assert reply.error["code"] == jsonrpc.INVALID_PARAMS
    assert reply.error["data"] == {"uri": READ["uri"]}


async def test_method_not_found_from_the_upstream_is_relayed_with_http_404(
    client: ModernClient, fake: FakeLegacy
) -> None:
    params = {"ref": {"type": "ref/prompt", "name": "greet"}, "argument": {"name": "who", "value": "A"}}
    async with asyncio.timeout(WAIT):
        reply = await client.request("completion/complete", params)  # declared, but the fake has no handler
    assert len(fake.calls_of("completion/complete")) == 1
    assert reply.status == 404
    assert reply.error["code"] == jsonrpc.METHOD_NOT_FOUND


# ---------------------------------------------------------------------------- 3. the session pool


async def test_requests_from_one_caller_share_one_upstream_session(client: ModernClient, fake: FakeLegacy) -> None:
    fake.handlers["tools/call"] = respond_with(tool_result("ok"))
    async with asyncio.timeout(WAIT):
        await client.request("server/discover")
        await client.request("tools/list")
        await client.request("tools/list")
        await client.request("tools/call", CALL)
    [session] = fake.sessions
    assert len(fake.calls_of("initialize")) == 1
    assert session.initialized.is_set()
    assert {c.session_id for c in fake.posted if c.method != "initialize"} == {session.id}


async def test_callers_with_different_authorization_never_share_a_session(proxy: Proxy, fake: FakeLegacy) -> None:
    alice, bob = proxy.modern("Bearer alice"), proxy.modern("Bearer bob")
    async with asyncio.timeout(WAIT):
        await alice.request("tools/list")
        await bob.request("tools/list")
        await alice.request("tools/list")
    first, second = fake.sessions
    assert first.initialize.headers["Authorization"] == "Bearer alice"
    assert second.initialize.headers["Authorization"] == "Bearer bob"
    for call in fake.calls_of("tools/list"):
        owner = first if call.headers["Authorization"] == "Bearer alice" else second
        assert call.session_id == owner.id


async def test_by_default_every_input_capability_is_declared_and_capability_sets_share_a_session(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    async with asyncio.timeout(WAIT):
        await proxy.modern("Bearer alice", capabilities={}).request("tools/list")
        await proxy.modern("Bearer alice", capabilities={"sampling": {}}).request("tools/list")
    [session] = fake.sessions
    assert session.capabilities == {
        "roots": {},
        "sampling": {"context": {}, "tools": {}},
        "elicitation": {"form": {}, "url": {}},
    }


async def test_declaring_client_capabilities_opens_one_session_per_capability_set(
    make_proxy: MakeProxy, fake: FakeLegacy
) -> None:
    proxy = await make_proxy(**{"upstream.declare_capabilities": "client"})
    sampling = proxy.modern("Bearer alice", capabilities={"sampling": {}})
    asking = proxy.modern("Bearer alice", capabilities={"elicitation": {"form": {}}, "roots": {}})
    async with asyncio.timeout(WAIT):
        await sampling.request("tools/list")
        await asking.request("tools/list")
        await sampling.request("tools/list")
    first, second = fake.sessions
    assert first.capabilities == {"sampling": {}}
    assert second.capabilities == {"roots": {}, "elicitation": {"form": {}}}
    assert [c.session_id for c in fake.calls_of("tools/list")] == [first.id, second.id, first.id]


UI = "io.modelcontextprotocol/ui"  # MCP Apps
UI_SETTINGS: JSONDict = {"mimeTypes": ["text/html;profile=mcp-app"]}


@pytest.mark.parametrize("declare", ["all", "client"])
async def test_a_pooled_session_declares_the_extensions_of_the_requests_it_serves_and_no_other(
    make_proxy: MakeProxy, fake: FakeLegacy, declare: str
) -> None:
    """A legacy server learns its client's extensions once, at initialize, and may offer an MCP
    Apps host what it offers no other client: a host declaring the UI extension and a client that
    does not never share an upstream session, whatever `upstream.declare_capabilities` says."""
    proxy = await make_proxy(**{"upstream.declare_capabilities": declare})
    third_party = {"com.example/search": {"engines": ["a"], "limits": {"per_minute": 10}}}
    host = proxy.modern("Bearer alice", capabilities={"extensions": {UI: UI_SETTINGS, **third_party}})
    plain = proxy.modern("Bearer alice", capabilities={})
    async with asyncio.timeout(WAIT):
        await host.request("tools/list")
        await plain.request("tools/list")
        await host.request("tools/list")
    with_ui, without = fake.sessions
    assert with_ui.capabilities["extensions"] == {UI: UI_SETTINGS, **third_party}  # settings unchanged
    assert "extensions" not in without.capabilities
    assert [c.session_id for c in fake.calls_of("tools/list")] == [with_ui.id, without.id, with_ui.id]
    assert fake.protocol_problems() == []


async def test_the_tasks_extension_is_the_proxys_and_never_reaches_a_legacy_server(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    client = proxy.modern("Bearer alice", capabilities={"extensions": {"io.modelcontextprotocol/tasks": {}}})
    async with asyncio.timeout(WAIT):
        await client.request("tools/list")
    [session] = fake.sessions
    assert "extensions" not in session.capabilities


async def test_a_legacy_servers_extensions_reach_the_modern_client_in_discover(
    client: ModernClient, fake: FakeLegacy
) -> None:
    declared = {UI: {}, "io.modelcontextprotocol/skills": {"directoryRead": True}, "com.example/x": {"a": [1]}}
    fake.initialize_result["capabilities"]["extensions"] = declared
    async with asyncio.timeout(WAIT):
        reply = await client.request("server/discover")
    assert reply.result["capabilities"]["extensions"] == declared


@pytest.mark.parametrize(
    ("method", "params", "answer"),
    [
        ("skills/list", {}, {"skills": [{"name": "pdf", "uri": "skill://pdf/SKILL.md"}]}),
        ("skills/get", {"name": "pdf"}, {"contents": [{"uri": "skill://pdf/SKILL.md", "text": "# PDF"}]}),
        ("resources/directory/read", {"uri": "skill://pdf/"}, {"entries": [{"uri": "skill://pdf/SKILL.md"}]}),
        ("com.example/search", {"query": "q", "limits": {"n": 3}}, {"hits": ["a"]}),
    ],
)
async def test_an_extensions_requests_reach_the_legacy_server_in_the_session_of_its_extensions(
    proxy: Proxy, fake: FakeLegacy, method: str, params: JSONDict, answer: JSONDict
) -> None:
    fake.handlers[method] = respond_with(answer)
    declared = {"extensions": {"io.modelcontextprotocol/skills": {"directoryRead": True}}}
    client = proxy.modern("Bearer alice", capabilities=declared)
    async with asyncio.timeout(WAIT):
        reply = await client.request(method, params)
    [call] = fake.calls_of(method)
    assert call.params == params  # the envelope is the session's: nothing of it in the request
    [session] = fake.sessions
    assert session.capabilities["extensions"] == declared["extensions"] and call.session_id == session.id
    # The Skills extension's results carry the cache hints 2026-07-28 requires of them (the
    # configured default here); a third-party extension's get none.
    hints = {"ttlMs": 0, "cacheScope": "private"} if method.startswith(("skills/", "resources/")) else {}
    assert {k: v for k, v in reply.result.items() if k in ("ttlMs", "cacheScope")} == hints
    assert {k: v for k, v in reply.result.items() if k not in ("resultType", "_meta", *hints)} == answer
    assert fake.protocol_problems() == []


async def test_an_extensions_notification_reaches_the_legacy_server_in_the_session_of_its_extensions(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    method = "notifications/com.example/trace/flushed"
    declared = {"extensions": {"com.example/trace": {"depth": 3}}}
    client = proxy.modern("Bearer alice", capabilities=declared)
    note = {"jsonrpc": "2.0", "method": method, "params": {"spans": 2, "_meta": client.envelope()}}
    async with asyncio.timeout(WAIT):
        assert (await client.post(note)).status == 202
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
        assert (await client.post(cancel)).status == 202
    [call] = fake.calls_of(method)
    assert call.body == {"jsonrpc": "2.0", "method": method, "params": {"spans": 2}}  # the envelope is the session's
    [session] = fake.sessions
    assert session.capabilities["extensions"] == declared["extensions"] and call.session_id == session.id
    assert fake.calls_of("notifications/cancelled") == []  # over HTTP a closed stream cancels (§4.1)
    assert fake.protocol_problems() == []


@pytest.mark.parametrize("extensions", ["io.modelcontextprotocol/ui", {UI: ["text/html"]}])
async def test_malformed_declared_extensions_get_invalid_params_and_reach_no_server(
    proxy: Proxy, fake: FakeLegacy, extensions: object
) -> None:
    client = proxy.modern("Bearer alice", capabilities={"extensions": extensions})
    async with asyncio.timeout(WAIT):
        response = await client.post(client.message("tools/list", id=3))
        err = await error_of(response, 3)
    assert (response.status, err["code"]) == (400, jsonrpc.INVALID_PARAMS)
    assert "capabilities.extensions" in err["message"]
    assert fake.sessions == []


async def test_concurrent_callers_reusing_a_request_id_get_distinct_upstream_ids_and_their_own_results(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    arrived: list[Call] = []
    both = asyncio.Event()

    async def echo(call: Call) -> Outcome:
        arrived.append(call)
        if len(arrived) == 2:
            both.set()
        await both.wait()
        return tool_result(call.params["arguments"]["who"])

    fake.handlers["tools/call"] = echo
    first, second = proxy.modern("Bearer alice", capabilities={}), proxy.modern("Bearer alice", capabilities={})
    async with asyncio.timeout(WAIT):
        a, b = await asyncio.gather(
            first.request("tools/call", {"name": "echo", "arguments": {"who": "a"}}, id=7),
            second.request("tools/call", {"name": "echo", "arguments": {"who": "b"}}, id=7),
        )
    assert (a.final, b.final) == (
        {"jsonrpc": "2.0", "id": 7, "result": {**tool_result("a"), "resultType": "complete", "_meta": SINFO}},
        {"jsonrpc": "2.0", "id": 7, "result": {**tool_result("b"), "resultType": "complete", "_meta": SINFO}},
    )
    [session] = fake.sessions
    assert {c.session_id for c in arrived} == {session.id}
    assert arrived[0].id != arrived[1].id


async def test_progress_tokens_are_rewritten_upstream_and_restored_for_each_caller(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    arrived: list[Call] = []
    both = asyncio.Event()

    async def work(call: Call) -> Outcome:
        arrived.append(call)
        if len(arrived) == 2:
            both.set()
        await both.wait()
        await call.progress(1, 2, message=call.params["arguments"]["who"])
        return tool_result("done")

    fake.handlers["tools/call"] = work
    first, second = proxy.modern("Bearer alice", capabilities={}), proxy.modern("Bearer alice", capabilities={})

    def params(who: str) -> JSONDict:
        return {"name": "work", "arguments": {"who": who}, "_meta": {"progressToken": "tok"}}

    async with asyncio.timeout(WAIT):
        a, b = await asyncio.gather(first.request("tools/call", params("a")), second.request("tools/call", params("b")))
    for reply, who in ((a, "a"), (b, "b")):
        assert reply.content_type == "text/event-stream"
        assert reply.notes == [
            notification("notifications/progress", {"progressToken": "tok", "progress": 1, "total": 2, "message": who})
        ]
    upstream_tokens = [c.meta["progressToken"] for c in arrived]
    assert len(set(upstream_tokens)) == 2
    assert "tok" not in upstream_tokens


@pytest.mark.parametrize("method", ["tools/list", "tools/call"])
async def test_a_session_the_upstream_forgot_is_reinitialized_and_the_request_retried_once(
    client: ModernClient, fake: FakeLegacy, method: str
) -> None:
    fake.handlers["tools/call"] = respond_with(tool_result("ok"))
    params = CALL if method == "tools/call" else None
    async with asyncio.timeout(WAIT):
        await client.request(method, params)
        [old] = fake.sessions
        # The session's GET stream open first: else the GET may be what meets the 404 (then the
        # session is opened again before the request is sent, which is right, but not this path).
        await old.stream()
        fake.forget(old.id)
        reply = await client.request(method, params)
    assert reply.status == 200
    assert reply.result["resultType"] == "complete"
    _, new = fake.sessions
    assert len(fake.calls_of("initialize")) == 2
    assert new.initialized.is_set()
    assert [(c.session_id, c.status) for c in fake.calls_of(method)] == [(old.id, 200), (old.id, 404), (new.id, 200)]


@pytest.mark.parametrize("method", ["tools/list", "tools/call"])  # read in the handler; by the call's reader
async def test_a_forgotten_session_that_cannot_be_opened_again_fails_the_request_as_session_gone(
    proxy: Proxy, client: ModernClient, fake: FakeLegacy, method: str
) -> None:
    fake.handlers["tools/call"] = respond_with(tool_result("ok"))
    params = CALL if method == "tools/call" else None
    async with asyncio.timeout(WAIT):
        await client.request(method, params)
        [old] = fake.sessions
        # The session's GET stream open first: else the GET may be what meets the 404 (then the
        # session is opened again before the request is sent, which is right, but not this path).
        await old.stream()
        fake.forget(old.id)
        fake.initialize_error = {"code": jsonrpc.INTERNAL_ERROR, "message": "not today"}
        reply = await client.request(method, params)
    assert reply.status == 200
    assert reply.error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    assert "forgot the session" in reply.error["message"] and "not today" in reply.error["message"]
    assert len(fake.calls_of("initialize")) == 2
    counted = proxy.app[METRICS].registry.get_sample_value(
        "mcp_era_proxy_upstream_errors_total", {"upstream": UPSTREAM_NAME, "kind": "session_gone"}
    )
    assert counted == 1


async def test_an_upstream_that_answers_404_again_after_reinitializing_is_not_retried_a_second_time(
    client: ModernClient, fake: FakeLegacy
) -> None:
    async def amnesiac(call: Call) -> Outcome:
        assert call.session is not None
        fake.forget(call.session.id)
        return Reply(404, jsonrpc.error_response(None, SESSION_NOT_FOUND, "Session not found"))

    async with asyncio.timeout(WAIT):
        await client.request("tools/list")
        fake.handlers["tools/list"] = amnesiac
        reply = await client.request("tools/list")
    assert reply.status == 200
    assert reply.error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    assert [c.status for c in fake.calls_of("tools/list")] == [200, 404, 404]
    assert len(fake.calls_of("initialize")) == 2


async def test_the_pool_never_holds_more_than_max_sessions(make_proxy: MakeProxy, fake: FakeLegacy) -> None:
    proxy = await make_proxy(**{"upstream.pool.max_sessions": 1})
    alice, bob = proxy.modern("Bearer alice", capabilities={}), proxy.modern("Bearer bob", capabilities={})
    release = asyncio.Event()
    fake.handlers["tools/call"] = answered_after(release, tool_result("slow"))
    async with asyncio.timeout(WAIT):
        await alice.request("tools/list")
        await bob.request("tools/list")  # alice's idle session makes room
        assert len(fake.live_sessions) == 1
        busy = asyncio.create_task(bob.request("tools/call", {"name": "slow", "arguments": {}}))
        await fake.next_call("tools/call")
        refused = await alice.request("tools/list")  # bob's session is busy: nothing to evict
        release.set()
        finished = await busy
        again = await alice.request("tools/list")
    first, second, third = fake.sessions
    deletes = {c.session_id: fake.calls.index(c) for c in fake.calls if c.http_method == "DELETE"}
    assert deletes[first.id] < fake.calls.index(second.initialize)
    assert deletes[second.id] < fake.calls.index(third.initialize)
    assert [s.live_when_opened for s in fake.sessions] == [0, 0, 0]
    assert fake.live_sessions == [third]
    assert refused.status == 200
    assert refused.error["code"] == jsonrpc.LIMIT_EXCEEDED
    assert finished.result["content"] == text("slow")
    assert again.result["resultType"] == "complete"


async def test_listen_sessions_count_toward_max_sessions(make_proxy: MakeProxy, fake: FakeLegacy) -> None:
    proxy = await make_proxy(**{"upstream.pool.max_sessions": 1})
    client = proxy.modern("Bearer alice")
    async with asyncio.timeout(WAIT):
        await client.request("tools/list")
        message, response = await client.send("subscriptions/listen", {"notifications": {"toolsListChanged": True}})
        if response.status == 200:  # room was made (an idle session evicted) ...
            stream = client.stream(response, message)
            assert await stream.next() is not None
            live = len(fake.live_sessions)
            stream.close()
        else:  # ... or the listen was refused
            check(json.loads(await response.read()))
            live = len(fake.live_sessions)
    assert live <= 1


# ---------------------------------------------------------------------------- 4. parked calls (MRTR)


async def test_a_server_elicitation_becomes_input_required_and_the_retry_resumes_the_same_call(
    client: ModernClient, fake: FakeLegacy
) -> None:
    async def deploy(call: Call) -> Outcome:
        params = {**ELICIT_PARAMS, "_meta": {"com.example/trace": "t-1"}, "task": {"ttl": 60000}}
        answer = await call.ask("elicitation/create", params)
        return tool_result(f"deployed: {answer['result']['action']}")

    fake.handlers["tools/call"] = deploy
    async with asyncio.timeout(WAIT):
        first = await client.request("tools/call", DEPLOY)
        result = input_required(first)
        [upstream] = fake.calls_of("tools/call")
        [asked] = upstream.asked
        key = f"s{asked.id}"
        second = await client.request("tools/call", retry(DEPLOY, result["requestState"], {key: ACCEPTED}))
    assert result["inputRequests"] == {key: {"method": "elicitation/create", "params": ELICIT_PARAMS}}
    assert result["_meta"] == SINFO
    assert second.request_id != first.request_id
    assert second.final == {
        "jsonrpc": "2.0",
        "id": second.request_id,
        "result": {**tool_result("deployed: accept"), "resultType": "complete", "_meta": SINFO},
    }
    assert asked.response.result() == {"jsonrpc": "2.0", "id": asked.id, "result": ACCEPTED}
    assert fake.calls_of("tools/call") == [upstream]  # resumed, never sent again
    assert "inputResponses" not in upstream.params and "requestState" not in upstream.params
    assert not upstream.cancelled.is_set()


async def test_a_result_the_server_sent_while_the_call_was_parked_answers_the_retry(
    proxy: Proxy, client: ModernClient, fake: FakeLegacy
) -> None:
    """The server stops waiting for its elicitation and ends the call itself while the client is
    still answering. Its reply ends the POST's stream, which the proxy reads next: the retry gets
    the server's result, not a stream that 'ended without a response'."""
    parked_now = asyncio.Event()

    async def impatient(call: Call) -> Outcome:
        await call.request("elicitation/create", ELICIT_PARAMS)
        await parked_now.wait()
        return tool_result("deployed without confirmation")

    fake.handlers["tools/call"] = impatient
    relay = proxy.app[MODERN_TO_LEGACY]
    async with asyncio.timeout(WAIT):
        result = input_required(await client.request("tools/call", DEPLOY))
        [upstream] = fake.calls_of("tools/call")
        [call] = relay._parked.values()
        parked_now.set()
        await upstream.done.wait()
        while not call._reader.done():  # noqa: ASYNC110  # bounded: the reader ends with the stream
            await asyncio.sleep(0.01)
        final = await client.request(
            "tools/call", retry(DEPLOY, result["requestState"], {f"s{upstream.asked[0].id}": ACCEPTED})
        )
    assert "error" not in final.final, final.final
    assert final.result["content"] == text("deployed without confirmation")


async def test_at_shutdown_a_parked_call_is_given_time_to_be_resumed_and_finish(
    proxy: Proxy, client: ModernClient, fake: FakeLegacy
) -> None:
    """A replica that is stopping still serves the retries of its parked calls (other replicas
    forward them), until they finish or the drain limit passes."""

    async def deploy(call: Call) -> Outcome:
        answer = await call.ask("elicitation/create", ELICIT_PARAMS)
        return tool_result(f"deployed: {answer['result']['action']}")

    fake.handlers["tools/call"] = deploy
    relay = proxy.app[MODERN_TO_LEGACY]
    async with asyncio.timeout(WAIT):
        result = input_required(await client.request("tools/call", DEPLOY))
        [upstream] = fake.calls_of("tools/call")
        settling = asyncio.create_task(relay.settle(WAIT))
        await asyncio.sleep(0)
        assert not settling.done()  # waits for the call, not for nothing
        final = await client.request(
            "tools/call", retry(DEPLOY, result["requestState"], {f"s{upstream.asked[0].id}": ACCEPTED})
        )
        assert await settling == 0
    assert final.result["content"] == text("deployed: accept")


async def test_at_shutdown_a_parked_call_never_resumed_is_given_up_at_the_drain_limit(
    make_proxy: MakeProxy, fake: FakeLegacy
) -> None:
    proxy = await make_proxy(**{"shutdown.grace_s": 0.5})  # the test's own teardown is a shutdown too
    client = proxy.modern("Bearer alice")

    async def deploy(call: Call) -> Outcome:
        await call.ask("elicitation/create", ELICIT_PARAMS)
        return tool_result("never")

    fake.handlers["tools/call"] = deploy
    async with asyncio.timeout(WAIT):
        input_required(await client.request("tools/call", DEPLOY))
        assert await proxy.app[MODERN_TO_LEGACY].settle(0.2) == 1


async def test_two_server_requests_sent_together_are_one_input_required_result(
    client: ModernClient, fake: FakeLegacy
) -> None:
    async def deploy(call: Call) -> Outcome:
        confirm = await call.request("elicitation/create", ELICIT_PARAMS)
        draft = await call.request("sampling/createMessage", SAMPLE_PARAMS)
        answers = await asyncio.gather(confirm.answer(), draft.answer())
        return tool_result(" + ".join(json.dumps(a["result"], sort_keys=True) for a in answers))

    fake.handlers["tools/call"] = deploy
    async with asyncio.timeout(WAIT):
        result = input_required(await client.request("tools/call", DEPLOY))
        [upstream] = fake.calls_of("tools/call")
        confirm, draft = upstream.asked
        responses = {f"s{confirm.id}": ACCEPTED, f"s{draft.id}": SAMPLED}
        final = await client.request("tools/call", retry(DEPLOY, result["requestState"], responses))
    assert result["inputRequests"] == {
        f"s{confirm.id}": {"method": "elicitation/create", "params": ELICIT_PARAMS},
        f"s{draft.id}": {"method": "sampling/createMessage", "params": SAMPLE_PARAMS},
    }
    expected = " + ".join(json.dumps(a, sort_keys=True) for a in (ACCEPTED, SAMPLED))
    assert final.result["content"] == text(expected)
    assert confirm.response.result()["result"] == ACCEPTED
    assert draft.response.result()["result"] == SAMPLED


async def test_a_server_request_after_the_first_answer_is_a_second_round_with_a_new_request_state(
    client: ModernClient, fake: FakeLegacy
) -> None:
    async def deploy(call: Call) -> Outcome:
        await call.ask("elicitation/create", ELICIT_PARAMS)
        await call.ask("roots/list")
        return tool_result("two rounds")

    fake.handlers["tools/call"] = deploy
    roots = {"roots": [{"uri": "file:///work", "name": "work"}]}
    async with asyncio.timeout(WAIT):
        round_one = input_required(await client.request("tools/call", DEPLOY))
        [upstream] = fake.calls_of("tools/call")
        confirm = upstream.asked[0]
        reply = await client.request(
            "tools/call", retry(DEPLOY, round_one["requestState"], {f"s{confirm.id}": ACCEPTED})
        )
        round_two = input_required(reply)
        where = upstream.asked[1]
        final = await client.request("tools/call", retry(DEPLOY, round_two["requestState"], {f"s{where.id}": roots}))
    assert round_two["inputRequests"] == {f"s{where.id}": {"method": "roots/list"}}
    assert round_two["requestState"] != round_one["requestState"]
    assert final.result["content"] == text("two rounds")
    assert where.response.result() == {"jsonrpc": "2.0", "id": where.id, "result": roots}


async def test_a_retry_missing_an_answer_is_asked_again_for_only_what_is_missing(
    client: ModernClient, fake: FakeLegacy
) -> None:
    async def deploy(call: Call) -> Outcome:
        confirm = await call.request("elicitation/create", ELICIT_PARAMS)
        draft = await call.request("sampling/createMessage", SAMPLE_PARAMS)
        await asyncio.gather(confirm.answer(), draft.answer())
        return tool_result("both answered")

    fake.handlers["tools/call"] = deploy
    async with asyncio.timeout(WAIT):
        first = input_required(await client.request("tools/call", DEPLOY))
        [upstream] = fake.calls_of("tools/call")
        confirm, draft = upstream.asked
        partial = {f"s{confirm.id}": ACCEPTED, "s-unknown": {"action": "decline"}}
        again = input_required(await client.request("tools/call", retry(DEPLOY, first["requestState"], partial)))
        confirmed = await confirm.answer()
        final = await client.request("tools/call", retry(DEPLOY, again["requestState"], {f"s{draft.id}": SAMPLED}))
    assert again["inputRequests"] == {f"s{draft.id}": {"method": "sampling/createMessage", "params": SAMPLE_PARAMS}}
    assert again["requestState"] != first["requestState"]
    assert confirmed["result"] == ACCEPTED
    assert final.result["content"] == text("both answered")


@pytest.mark.parametrize("defect", ["tampered", "forged", "foreign-caller", "other-method", "other-params"])
async def test_an_invalid_request_state_is_http_400_invalid_params_and_leaves_the_parked_call_intact(
    proxy: Proxy, client: ModernClient, fake: FakeLegacy, defect: str
) -> None:
    fake.handlers["tools/call"] = confirm_then_deploy
    async with asyncio.timeout(WAIT):
        result, upstream, asked = await parked(client, fake)
        state = result["requestState"]
        responses = {f"s{asked.id}": ACCEPTED}
        caller, method, params = client, "tools/call", retry(DEPLOY, state, responses)
        if defect == "tampered":
            flipped = "B" if state[10] == "A" else "A"
            params["requestState"] = state[:10] + flipped + state[11:]
        elif defect == "forged":
            params["requestState"] = "not-a-request-state"
        elif defect == "foreign-caller":
            caller = proxy.modern("Bearer mallory")
        elif defect == "other-method":
            method, params = "prompts/get", retry({"name": "deploy", "arguments": {"env": "prod"}}, state, responses)
        else:
            params["arguments"] = {"env": "staging"}
        message = caller.message(method, params, id="bad-retry")
        response = await caller.post(message)
        err = await error_of(response, "bad-retry")
        untouched(upstream, asked, fake)
        final = await client.request("tools/call", retry(DEPLOY, state, responses))
    assert response.status == 400
    assert err["code"] == jsonrpc.INVALID_PARAMS
    assert final.result["content"] == text("deployed: accept")


async def test_an_expired_request_state_is_http_400_invalid_params_and_leaves_the_parked_call_intact(
    make_proxy: MakeProxy, fake: FakeLegacy
) -> None:
    clock = FakeClock()
    proxy = await make_proxy(clock=clock, **{"input.park_timeout_s": 60})
    client = proxy.modern("Bearer alice")
    fake.handlers["tools/call"] = confirm_then_deploy
    async with asyncio.timeout(WAIT):
        result, upstream, asked = await parked(client, fake)
        params = retry(DEPLOY, result["requestState"], {f"s{asked.id}": ACCEPTED})
        clock.advance(61)
        late = await client.request("tools/call", params)
        untouched(upstream, asked, fake)
        clock.advance(-61)
        final = await client.request("tools/call", params)
    assert late.status == 400
    assert late.error["code"] == jsonrpc.INVALID_PARAMS
    assert final.result["content"] == text("deployed: accept")


async def test_a_request_state_is_valid_for_the_whole_park_timeout_even_a_short_one(
    make_proxy: MakeProxy, fake: FakeLegacy
) -> None:
    clock = FakeClock()
    clock.now = 1_000_000.6  # a fraction of a second must not be lost when the expiry is computed
    proxy = await make_proxy(clock=clock, **{"input.park_timeout_s": 2.0})
    client = proxy.modern("Bearer alice")
    fake.handlers["tools/call"] = confirm_then_deploy
    async with asyncio.timeout(WAIT):
        result, _, asked = await parked(client, fake)
        clock.advance(1.5)  # still within the park timeout
        final = await client.request("tools/call", retry(DEPLOY, result["requestState"], {f"s{asked.id}": ACCEPTED}))
    assert final.status == 200
    assert final.result["content"] == text("deployed: accept")


async def test_a_request_state_is_single_use(client: ModernClient, fake: FakeLegacy) -> None:
    async def deploy(call: Call) -> Outcome:
        await call.ask("elicitation/create", ELICIT_PARAMS)
        await call.ask("sampling/createMessage", SAMPLE_PARAMS)
        return tool_result("done")

    fake.handlers["tools/call"] = deploy
    async with asyncio.timeout(WAIT):
        first = input_required(await client.request("tools/call", DEPLOY))
        [upstream] = fake.calls_of("tools/call")
        confirm = upstream.asked[0]
        replay = retry(DEPLOY, first["requestState"], {f"s{confirm.id}": ACCEPTED})
        second = input_required(await client.request("tools/call", replay))
        replayed = await client.request("tools/call", replay)
        draft = upstream.asked[1]
        untouched_draft = not draft.response.done()
        final = await client.request("tools/call", retry(DEPLOY, second["requestState"], {f"s{draft.id}": SAMPLED}))
        replayed_last = await client.request(
            "tools/call", retry(DEPLOY, second["requestState"], {f"s{draft.id}": SAMPLED})
        )
    assert (replayed.status, replayed.error["code"]) == (400, jsonrpc.INVALID_PARAMS)
    assert untouched_draft
    assert [r.answers for r in fake.responses] == [confirm, draft]  # each answer delivered exactly once
    assert final.result["content"] == text("done")
    assert (replayed_last.status, replayed_last.error["code"]) == (400, jsonrpc.INVALID_PARAMS)
    assert fake.calls_of("tools/call") == [upstream]


@pytest.mark.parametrize(
    ("method", "params", "abandoned"),
    [
        ("elicitation/create", ELICIT_PARAMS, {"result": {"action": "cancel"}}),
        ("sampling/createMessage", SAMPLE_PARAMS, {"error": jsonrpc.INTERNAL_ERROR}),
        ("roots/list", None, {"error": jsonrpc.INTERNAL_ERROR}),
    ],
)
async def test_a_parked_call_never_retried_is_cancelled_upstream_after_the_park_timeout(
    make_proxy: MakeProxy, fake: FakeLegacy, method: str, params: JSONDict | None, abandoned: JSONDict
) -> None:
    proxy = await make_proxy(**{"input.park_timeout_s": 0.2})
    client = proxy.modern("Bearer alice")

    async def deploy(call: Call) -> Outcome:
        await call.ask(method, params)
        return tool_result("too late")

    fake.handlers["tools/call"] = deploy
    async with asyncio.timeout(WAIT):
        result, upstream, asked = await parked(client, fake)
        answer = await asked.answer()
        cancelled = await fake.next_call("notifications/cancelled")
        late = await client.request("tools/call", retry(DEPLOY, result["requestState"], {f"s{asked.id}": {}}))
    assert answer["id"] == asked.id
    if "result" in abandoned:
        assert answer["result"] == abandoned["result"]
    else:
        assert "result" not in answer
        assert answer["error"]["code"] == abandoned["error"]
    assert cancelled.params["requestId"] == upstream.id
    assert cancelled.session_id == upstream.session_id
    assert fake.calls.index(fake.responses[0]) < fake.calls.index(cancelled)
    assert (late.status, late.error["code"]) == (400, jsonrpc.INVALID_PARAMS)


async def test_closing_the_stream_that_delivered_input_required_does_not_cancel_the_parked_call(
    client: ModernClient, fake: FakeLegacy
) -> None:
    async def deploy(call: Call) -> Outcome:
        await call.progress(1, 3)
        await call.ask("elicitation/create", ELICIT_PARAMS)
        await call.progress(2, 3)
        return tool_result("deployed")

    fake.handlers["tools/call"] = deploy
    params = {**DEPLOY, "_meta": {"progressToken": "first"}}
    async with asyncio.timeout(WAIT):
        message, response = await client.send("tools/call", params)
        stream = client.stream(response, message)
        progress = await stream.next()
        reply = await stream.next()
        stream.close()
        assert reply is not None
        result = reply["result"]
        [upstream] = fake.calls_of("tools/call")
        [asked] = upstream.asked
        again = {
            **retry(DEPLOY, result["requestState"], {f"s{asked.id}": ACCEPTED}),
            "_meta": {"progressToken": "second"},
        }
        final = await client.request("tools/call", again)
    assert progress == notification("notifications/progress", {"progressToken": "first", "progress": 1, "total": 3})
    assert result["resultType"] == "input_required"
    assert final.notes == [
        notification("notifications/progress", {"progressToken": "second", "progress": 2, "total": 3})
    ]
    assert final.result["content"] == text("deployed")
    assert fake.calls_of("notifications/cancelled") == []
    assert not upstream.cancelled.is_set()


async def test_closing_the_retry_stream_before_the_final_answer_cancels_the_call_upstream(
    client: ModernClient, fake: FakeLegacy
) -> None:
    async def deploy(call: Call) -> Outcome:
        await call.ask("elicitation/create", ELICIT_PARAMS)
        await call.progress(1, 2)
        return await hang(call)

    fake.handlers["tools/call"] = deploy
    async with asyncio.timeout(WAIT):
        first = input_required(await client.request("tools/call", {**DEPLOY, "_meta": {"progressToken": "first"}}))
        [upstream] = fake.calls_of("tools/call")
        [asked] = upstream.asked
        again = {
            **retry(DEPLOY, first["requestState"], {f"s{asked.id}": ACCEPTED}),
            "_meta": {"progressToken": "second"},
        }
        message, response = await client.send("tools/call", again)
        stream = client.stream(response, message)
        progress = await stream.next()
        stream.close()
        cancelled = await fake.next_call("notifications/cancelled")
        await upstream.cancelled.wait()
    assert progress == notification("notifications/progress", {"progressToken": "second", "progress": 1, "total": 2})
    assert cancelled.params["requestId"] == upstream.id
    assert cancelled.session_id == upstream.session_id


@pytest.mark.parametrize(
    ("capabilities", "method", "params", "required", "upstream_code"),
    [
        pytest.param(
            {"sampling": {}},
            "elicitation/create",
            ELICIT_PARAMS,
            {"elicitation": {"form": {}}},
            jsonrpc.INVALID_PARAMS,
            id="form-elicitation",
        ),
        pytest.param(
            {"elicitation": {"form": {}}},
            "elicitation/create",
            URL_ELICIT_PARAMS,
            {"elicitation": {"url": {}}},
            jsonrpc.INVALID_PARAMS,
            id="url-elicitation",
        ),
        pytest.param(
            {"elicitation": {}},
            "sampling/createMessage",
            SAMPLE_PARAMS,
            {"sampling": {}},
            jsonrpc.METHOD_NOT_FOUND,
            id="sampling",
        ),
        pytest.param(
            {"sampling": {}},
            "sampling/createMessage",
            {**SAMPLE_PARAMS, "tools": [{"name": "lookup", "inputSchema": {"type": "object"}}]},
            {"sampling": {"tools": {}}},
            jsonrpc.METHOD_NOT_FOUND,
            id="sampling-with-tools",
        ),
        pytest.param({"sampling": {}}, "roots/list", None, {"roots": {}}, jsonrpc.METHOD_NOT_FOUND, id="roots"),
    ],
)
async def test_a_server_request_for_an_undeclared_capability_is_http_400_missing_capability_and_refused_upstream(
    proxy: Proxy,
    fake: FakeLegacy,
    capabilities: JSONDict,
    method: str,
    params: JSONDict | None,
    required: JSONDict,
    upstream_code: int,
) -> None:
    answers: list[JSONDict] = []

    async def deploy(call: Call) -> Outcome:
        answers.append(await call.ask(method, params))
        return tool_result("went ahead anyway")

    fake.handlers["tools/call"] = deploy
    client = proxy.modern("Bearer alice", capabilities=capabilities)
    async with asyncio.timeout(WAIT):
        reply = await client.request("tools/call", DEPLOY)
        [upstream] = fake.calls_of("tools/call")
        [asked] = upstream.asked
        answer = await asked.answer()
    assert reply.status == 400
    assert reply.error["code"] == jsonrpc.MISSING_REQUIRED_CAPABILITY
    assert reply.error["data"]["requiredCapabilities"] == required
    assert answer["error"]["code"] == upstream_code
    assert "result" not in answer


async def test_a_sampling_request_during_tools_list_is_refused_upstream_and_never_shown_to_the_client(
    client: ModernClient, fake: FakeLegacy
) -> None:
    answers: list[JSONDict] = []

    async def tools_list(call: Call) -> Outcome:
        answers.append(await call.ask("sampling/createMessage", SAMPLE_PARAMS))
        return {"tools": [{"name": "t", "inputSchema": {"type": "object"}}]}

    fake.handlers["tools/list"] = tools_list
    async with asyncio.timeout(WAIT):
        reply = await client.request("tools/list")
    assert reply.status == 200
    assert reply.messages == [reply.final]
    assert reply.result["resultType"] == "complete"
    assert reply.result["tools"] == [{"name": "t", "inputSchema": {"type": "object"}}]
    [answer] = answers
    assert "result" not in answer
    assert answer["error"]["code"] == jsonrpc.METHOD_NOT_FOUND


async def test_an_upstream_connection_dropped_mid_call_fails_only_that_call(proxy: Proxy, fake: FakeLegacy) -> None:
    dropped = asyncio.Event()

    async def tool(call: Call) -> Outcome:
        if call.params["name"] == "fragile":
            await call.log("info", "about to crash")
            call.drop()
            dropped.set()
            return None
        await dropped.wait()
        return tool_result("sturdy")

    fake.handlers["tools/call"] = tool
    alice, bob = proxy.modern("Bearer alice", capabilities={}), proxy.modern("Bearer bob", capabilities={})
    async with asyncio.timeout(WAIT):
        broken, fine = await asyncio.gather(
            alice.request("tools/call", {"name": "fragile", "arguments": {}}),
            bob.request("tools/call", {"name": "sturdy", "arguments": {}}),
        )
    assert broken.status == 200
    assert broken.error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    assert fine.result["content"] == text("sturdy")
    sessions = {c.session_id for c in fake.calls_of("tools/call")}
    assert len(sessions) == 2


UNSENDABLE = "@@unsendable@@"


@pytest.fixture
def unsendable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy's encoder fails on any message holding UNSENDABLE, as it does on a string that is
    not valid Unicode (a lone surrogate): a request it cannot write upstream."""
    encode = jsonrpc.encode

    def failing(message: Any) -> bytes:
        data = encode(message)
        if UNSENDABLE.encode() in data:
            "\udcff".encode()  # raises UnicodeEncodeError
        return data

    monkeypatch.setattr(jsonrpc, "encode", failing)


async def test_a_call_whose_request_cannot_be_sent_upstream_fails_at_once_and_frees_its_session(
    client: ModernClient, fake: FakeLegacy, unsendable: None
) -> None:
    """An interactive call (its reader is a task of the call): the failure reaches the client now,
    not after upstream.request_timeout_s, and the session serves the next call."""
    fake.handlers["tools/call"] = respond_with(tool_result("deployed"))
    async with asyncio.timeout(WAIT):
        failed = await client.request("tools/call", {"name": "deploy", "arguments": {"env": UNSENDABLE}})
        fine = await client.request("tools/call", DEPLOY)
    assert failed.status == 200
    assert failed.error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    assert "could not be sent" in failed.error["message"]
    assert fine.result["content"] == text("deployed")
    assert [c.params["arguments"] for c in fake.calls_of("tools/call")] == [{"env": "prod"}]
    assert len(fake.sessions) == 1


async def test_a_call_reader_that_fails_for_a_reason_of_the_proxys_own_fails_the_call_at_once(
    client: ModernClient, fake: FakeLegacy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever ends an interactive call's reader ends the call: never a reader gone silently and
    a client left waiting for its deadline."""
    feed = ParkedCall.upstream_message

    def broken(self: ParkedCall, message: JSONDict) -> Any:
        if "crash" in json.dumps(message):
            raise RuntimeError("a fault in the proxy")
        return feed(self, message)

    monkeypatch.setattr(ParkedCall, "upstream_message", broken)
    fake.handlers["tools/call"] = respond_with(tool_result("crash"))
    async with asyncio.timeout(WAIT):
        failed = await client.request("tools/call", DEPLOY)
    assert failed.error["code"] == jsonrpc.INTERNAL_ERROR
    fake.handlers["tools/call"] = respond_with(tool_result("fine"))
    async with asyncio.timeout(WAIT):
        fine = await client.request("tools/call", DEPLOY)
    assert fine.result["content"] == text("fine")
    assert len(fake.sessions) == 1  # the failed call released its session


async def test_a_request_read_in_its_handler_that_cannot_be_sent_upstream_fails_with_a_json_rpc_error(
    proxy: Proxy, fake: FakeLegacy, unsendable: None
) -> None:
    client = proxy.modern("Bearer alice", capabilities={})  # no input capability: read inline
    async with asyncio.timeout(WAIT):
        failed = await client.request("tools/list", {"cursor": UNSENDABLE})
        fine = await client.request("tools/list")
    assert failed.status == 200
    assert failed.error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    assert fine.result["tools"] == []


async def test_answers_that_cannot_be_delivered_upstream_fail_the_retry_with_a_json_rpc_error(
    client: ModernClient, fake: FakeLegacy, unsendable: None
) -> None:
    fake.handlers["tools/call"] = confirm_then_deploy
    async with asyncio.timeout(WAIT):
        result, upstream, asked = await parked(client, fake)
        answer = {"action": "accept", "content": {"note": UNSENDABLE}}
        failed = await client.request("tools/call", retry(DEPLOY, result["requestState"], {f"s{asked.id}": answer}))
        await upstream.cancelled.wait()  # the parked call was given up upstream
    assert failed.error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    [cancelled] = fake.calls_of("notifications/cancelled")
    assert cancelled.params == {"requestId": upstream.id, "reason": "could not deliver the client's answers"}


async def test_a_server_request_the_server_cancels_before_parking_is_not_asked(
    client: ModernClient, fake: FakeLegacy
) -> None:
    async def deploy(call: Call) -> Outcome:
        confirm = await call.request("elicitation/create", ELICIT_PARAMS)
        draft = await call.request("sampling/createMessage", SAMPLE_PARAMS)
        await call.withdraw(confirm, "no longer needed")
        await draft.answer()
        return tool_result("drafted")

    fake.handlers["tools/call"] = deploy
    async with asyncio.timeout(WAIT):
        result = input_required(await client.request("tools/call", DEPLOY))
        [upstream] = fake.calls_of("tools/call")
        _, draft = upstream.asked
        final = await client.request("tools/call", retry(DEPLOY, result["requestState"], {f"s{draft.id}": SAMPLED}))
    assert result["inputRequests"] == {f"s{draft.id}": {"method": "sampling/createMessage", "params": SAMPLE_PARAMS}}
    assert final.result["content"] == text("drafted")


async def test_a_server_ping_during_a_call_is_answered_locally(client: ModernClient, fake: FakeLegacy) -> None:
    pongs: list[JSONDict] = []

    async def deploy(call: Call) -> Outcome:
        pongs.append(await call.ask("ping"))
        return tool_result("alive")

    fake.handlers["tools/call"] = deploy
    async with asyncio.timeout(WAIT):
        reply = await client.request("tools/call", DEPLOY)
    [upstream] = fake.calls_of("tools/call")
    [asked] = upstream.asked
    assert pongs == [{"jsonrpc": "2.0", "id": asked.id, "result": {}}]
    assert reply.result["content"] == text("alive")


async def test_a_server_request_on_the_get_stream_outside_any_call_is_refused_upstream(
    client: ModernClient, fake: FakeLegacy
) -> None:
    async with asyncio.timeout(WAIT):
        await client.request("tools/list")
        [session] = fake.sessions
        await session.stream()
        answer = await session.request("sampling/createMessage", SAMPLE_PARAMS).answer()
    assert "result" not in answer
    assert answer["error"]["code"] == jsonrpc.INTERNAL_ERROR


# ---------------------------------------------------------------------------- 5. logging


async def chatty(call: Call) -> Outcome:
    for level in ("debug", "info", "warning", "error"):
        await call.log(level, f"{level} message", logger="deploy")
    return tool_result("done")


def levels(reply: McpReply) -> list[str]:
    return [n["params"]["level"] for n in reply.notes if n["method"] == "notifications/message"]


async def test_a_log_level_sets_the_session_level_once_and_relays_only_that_level_and_above(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    fake.handlers["tools/call"] = chatty
    client = proxy.modern("Bearer alice", capabilities={})
    async with asyncio.timeout(WAIT):
        warning = await client.request("tools/call", CALL, log_level="warning")
        warning_again = await client.request("tools/call", CALL, log_level="warning")
        error_only = await client.request("tools/call", CALL, log_level="error")
        everything = await client.request("tools/call", CALL, log_level="debug")
    [session] = fake.sessions
    assert session.log_levels == ["warning", "debug"]
    posted = [c.method for c in fake.posted]
    assert posted.index("logging/setLevel") < posted.index("tools/call")
    assert levels(warning) == levels(warning_again) == ["warning", "error"]
    assert levels(error_only) == ["error"]
    assert levels(everything) == ["debug", "info", "warning", "error"]
    assert warning.notes[0] == notification(
        "notifications/message", {"level": "warning", "data": "warning message", "logger": "deploy"}
    )


async def test_a_request_without_a_log_level_receives_no_log_messages(proxy: Proxy, fake: FakeLegacy) -> None:
    fake.handlers["tools/call"] = chatty
    client = proxy.modern("Bearer alice", capabilities={})
    async with asyncio.timeout(WAIT):
        await client.request("tools/call", CALL, log_level="debug")  # the session now logs everything
        quiet = await client.request("tools/call", CALL)
    assert quiet.notes == []
    assert quiet.result["content"] == text("done")


# ---------------------------------------------------------------------------- 6. subscriptions/listen


async def open_listen(client: ModernClient, notifications: JSONDict, listen_id: Any) -> tuple[ModernStream, JSONDict]:
    message, response = await client.send("subscriptions/listen", {"notifications": notifications}, id=listen_id)
    stream = client.stream(response, message)
    ack = await stream.next()
    assert ack is not None
    return stream, ack


def listen_session(fake: FakeLegacy) -> Session:
    [subscribe] = fake.calls_of("resources/subscribe")
    assert subscribe.session is not None
    return subscribe.session


@pytest.mark.parametrize("listen_id", ["listen-1", 42])
async def test_listen_is_acknowledged_first_with_the_listen_id_and_only_what_the_upstream_supports(
    client: ModernClient, fake: FakeLegacy, listen_id: Any
) -> None:
    fake.initialize_result["capabilities"]["prompts"] = {}  # no prompts/list_changed
    wanted = {"toolsListChanged": True, "promptsListChanged": True, "resourceSubscriptions": [WATCHED]}
    async with asyncio.timeout(WAIT):
        stream, ack = await open_listen(client, wanted, listen_id)
        stream.close()
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["notifications"] == {"toolsListChanged": True, "resourceSubscriptions": [WATCHED]}
    subscription_id = ack["params"]["_meta"][meta.SUBSCRIPTION_ID]
    assert subscription_id == listen_id
    assert type(subscription_id) is type(listen_id)
    assert listen_session(fake).subscribed == [WATCHED]


async def test_listen_relays_only_requested_notifications_tagged_with_the_subscription_id(
    client: ModernClient, fake: FakeLegacy
) -> None:
    wanted = {"toolsListChanged": True, "resourceSubscriptions": [WATCHED]}
    async with asyncio.timeout(WAIT):
        stream, _ = await open_listen(client, wanted, "sub-7")
        session = listen_session(fake)
        await session.stream()
        session.push("notifications/prompts/list_changed")  # not requested
        session.push("notifications/resources/list_changed")  # not requested
        session.push("notifications/resources/updated", {"uri": "file:///other.txt"})  # another URI
        session.push("notifications/message", {"level": "error", "data": "never on a listen stream"})
        session.push("notifications/tools/list_changed")
        session.push("notifications/resources/updated", {"uri": WATCHED})
        first = await stream.next()
        second = await stream.next()
        stream.close()
    tag = {"_meta": {meta.SUBSCRIPTION_ID: "sub-7"}}
    assert first == notification("notifications/tools/list_changed", tag)
    assert second == notification("notifications/resources/updated", {"uri": WATCHED, **tag})


async def test_closing_a_listen_unsubscribes_and_deletes_its_upstream_session(
    client: ModernClient, fake: FakeLegacy
) -> None:
    async with asyncio.timeout(WAIT):
        stream, _ = await open_listen(client, {"resourceSubscriptions": [WATCHED]}, "sub-1")
        session = listen_session(fake)
        stream.close()
        unsubscribe = await fake.next_call("resources/unsubscribe")
        delete = await fake.next_call("DELETE")
        await session.deleted.wait()
    assert unsubscribe.params == {"uri": WATCHED}
    assert unsubscribe.session_id == session.id
    assert delete.session_id == session.id


async def test_a_listen_the_proxy_ends_gets_the_graceful_completion_result(proxy: Proxy, client: ModernClient) -> None:
    async with asyncio.timeout(WAIT):
        stream, _ = await open_listen(client, {"toolsListChanged": True}, "sub-9")
        await proxy.app[MODERN_TO_LEGACY].close_all()  # what shutdown does
        closing = await stream.next()
        end = await stream.next()
    assert closing == {
        "jsonrpc": "2.0",
        "id": "sub-9",
        "result": {"resultType": "complete", "_meta": {meta.SUBSCRIPTION_ID: "sub-9"}},
    }
    assert end is None


async def test_listen_asks_nothing_it_cannot_deliver_when_the_upstream_refuses_get_streams(
    client: ModernClient, fake: FakeLegacy
) -> None:
    fake.get_status = 405
    async with asyncio.timeout(WAIT):
        stream, ack = await open_listen(client, {"toolsListChanged": True, "resourceSubscriptions": [WATCHED]}, 9)
        stream.close()
    assert ack["params"]["notifications"] == {}
    assert fake.calls_of("resources/subscribe") == []


async def test_listen_for_task_ids_is_http_400_missing_capability(client: ModernClient, fake: FakeLegacy) -> None:
    async with asyncio.timeout(WAIT):
        reply = await client.request("subscriptions/listen", {"notifications": {"taskIds": ["task-1"]}}, id="l-1")
    assert reply.status == 400
    assert reply.error["code"] == jsonrpc.MISSING_REQUIRED_CAPABILITY
    assert "io.modelcontextprotocol/tasks" in reply.error["data"]["requiredCapabilities"]["extensions"]
    assert fake.calls == []


# ---------------------------------------------------------------------------- 7. legacy clients pass through


async def test_a_legacy_client_is_passed_through_to_the_legacy_upstream_unchanged(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    fake.handlers["tools/call"] = confirm_then_deploy
    async with asyncio.timeout(WAIT):
        peer = await LegacyClient.connect(proxy.http)
        [session] = fake.sessions
        await session.initialized.wait()
        request_id, response = await peer.send("tools/call", {"name": "deploy", "arguments": {"env": "prod"}})
        reader = SseReader(response)
        asked = await reader.message()
        assert asked is not None
        peer.check(asked)
        assert await peer.respond(asked["id"], ACCEPTED) == 202
        final = await reader.message()
        get = await peer.get_stream({"Last-Event-ID": "evt-7"})
        stream = await session.stream()
        session.push("notifications/tools/list_changed")
        pushed = await SseReader(get).message()
        get.close()
        deleted = await peer.delete()
        await deleted.read()
        await session.deleted.wait()
    assert peer.session_id == session.id
    assert session.capabilities == legacy_client.FULL_CAPABILITIES
    assert session.client_info == legacy_client.CLIENT_INFO
    assert session.requested_version == LATEST_LEGACY
    [upstream] = fake.calls_of("tools/call")
    assert upstream.body == {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "deploy", "arguments": {"env": "prod"}},
    }
    [pending] = upstream.asked
    assert asked == pending.message
    assert pending.response.result() == {"jsonrpc": "2.0", "id": pending.id, "result": ACCEPTED}
    assert final == {"jsonrpc": "2.0", "id": request_id, "result": tool_result("deployed: accept")}
    assert stream.last_event_id == "evt-7"
    assert pushed == notification("notifications/tools/list_changed")
    assert deleted.status == 200
    [delete] = [c for c in fake.calls if c.http_method == "DELETE"]
    assert delete.session_id == session.id


async def test_a_passed_through_message_is_logged_with_its_session_and_a_clients_answer_as_a_response(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    """The upstream's own session (hashed, never the id) on each line of its messages, as on a
    translated session's; the client's answer to the server's question says `response`. Both
    were None."""
    fake.handlers["tools/call"] = confirm_then_deploy
    async with asyncio.timeout(WAIT):
        with capture_logs() as logs:
            peer = await LegacyClient.connect(proxy.http)
            _, response = await peer.send("tools/call", {"name": "deploy", "arguments": {"env": "prod"}})
            reader = SseReader(response)
            asked = await reader.message()
            assert asked is not None
            assert await peer.respond(asked["id"], ACCEPTED) == 202
            await reader.message()
    assert peer.session_id is not None
    lines = [(e["method"], e["session"]) for e in logs if e["event"] == "request"]
    hashed = short_hash(peer.session_id)
    assert lines == [
        ("initialize", hashed),
        ("notifications/initialized", hashed),
        ("response", hashed),  # answered while the call is still streaming
        ("tools/call", hashed),
    ]
    counted = proxy.app[METRICS].registry.get_sample_value(
        "mcp_era_proxy_requests_total",
        {"method": "response", "downstream_era": "legacy", "upstream_era": "legacy", "outcome": "ok"},
    )
    assert counted == 1


async def test_a_legacy_upstream_that_cannot_be_reached_is_counted_like_any_other_upstream_failure(
    make_proxy: MakeProxy,
) -> None:
    """One place maps and counts upstream failures: a legacy upstream's are counted too."""
    proxy = await make_proxy(**{"upstream.url": closed_port_url()})
    async with asyncio.timeout(WAIT):
        reply = await proxy.modern("Bearer alice").request("tools/list")
    assert reply.error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    counted = proxy.app[METRICS].registry.get_sample_value(
        "mcp_era_proxy_upstream_errors_total", {"upstream": UPSTREAM_NAME, "kind": "unavailable"}
    )
    assert counted == 1


# ---------------------------------------------------------------------------- readiness


async def test_readiness_opens_and_ends_a_legacy_session_as_a_new_client_would(proxy: Proxy, fake: FakeLegacy) -> None:
    async with asyncio.timeout(WAIT):
        ready = await proxy.http.get("/readyz")
    assert ready.status == 200 and (await ready.json())["ready"] is True
    [session] = fake.sessions
    handshake = [c.method or c.http_method for c in fake.calls if c.session in (None, session)]
    assert handshake[:2] == ["initialize", "notifications/initialized"] and handshake[-1] == "DELETE"
    assert not session.known  # ended: it holds nothing on the server


async def test_a_request_whose_initialize_fails_ends_readiness_at_once_until_a_handshake_works(
    proxy: Proxy, client: ModernClient, fake: FakeLegacy
) -> None:
    async with asyncio.timeout(WAIT):
        assert (await proxy.http.get("/readyz")).status == 200  # within readiness.window_s from now
        fake.initialize_error = {"code": jsonrpc.METHOD_NOT_FOUND, "message": "Method not found"}
        with capture_logs() as logs:
            failed = await client.request("tools/list")
            assert failed.error["code"] == jsonrpc.INTERNAL_ERROR
            for _ in range(2):  # each poll asks again, and it still fails
                refused = await proxy.http.get("/readyz")
                assert refused.status == 503
                body = await refused.json()
                assert body["ready"] is False and "initialize" in body["error"] and "Method not found" in body["error"]
        fake.initialize_error = None
        assert (await proxy.http.get("/readyz")).status == 200
    assert len(fake.calls_of("initialize")) == 5  # the first poll, the request, two polls, the last poll
    assert [e["event"] for e in logs if e["event"].startswith("upstream_handshake")] == ["upstream_handshake_failed"]
