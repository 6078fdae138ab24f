"""2024-11-05 HTTP+SSE clients (downstream.sse; proxy/downstream/legacy_sse.py): GET /sse opens the
session's stream, whose `endpoint` event names the POST URL; replies come on the stream. In front
of the scripted modern upstream, in-process: the endpoint event, the session served through the
Streamable HTTP endpoint's translation, the session ending with its stream, the bounds, and the
errors a bad POST gets.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import strategies as st

from proxy.app import METRICS
from proxy.metrics import PREFIX
from proxy.protocol import jsonrpc
from tests.hostile import strategies as hs
from tests.support import answers, tally
from tests.support.fake_modern import Call, FakeModern, complete
from tests.support.legacy_sse_client import WAIT, SseClient
from tests.support.legacy_sse_client import sse_client as open_stream
from tests.support.schema import schema_path

from .conftest import MakeProxy, Proxy


@asynccontextmanager
async def sse_client(proxy: Proxy, headers: dict[str, str] | None = None) -> AsyncIterator[SseClient]:
    async with open_stream(proxy.client, headers) as client:
        yield client


def sessions_open(proxy: Proxy) -> float:
    sample = proxy.app[METRICS].registry.get_sample_value(f"{PREFIX}sessions_open", {"downstream_era": "legacy"})
    return sample or 0.0


def streams_open(proxy: Proxy) -> float:
    sample = proxy.app[METRICS].registry.get_sample_value(f"{PREFIX}streams_open", {"kind": "downstream_sse"})
    return sample or 0.0


async def until(predicate: Any, within_s: float = WAIT) -> bool:
    deadline = asyncio.get_running_loop().time() + within_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def echo_tool(fake: FakeModern) -> None:
    fake.tools = [{"name": "echo", "inputSchema": {"type": "object"}}]

    async def call_tool(call: Call) -> Any:
        return complete(content=[{"type": "text", "text": f"echo {call.body['params']['arguments'].get('text')}"}])

    fake.handlers["tools/call"] = call_tool


async def test_the_stream_names_its_endpoint_and_the_session_is_translated(proxy: Proxy, fake: FakeModern):
    echo_tool(fake)
    async with sse_client(proxy) as client:
        endpoint = urlsplit(client.endpoint)
        assert endpoint.path == "/messages" and endpoint.query.startswith("session_id=")
        initialized = await client.initialize()
        assert initialized["result"]["protocolVersion"] == "2024-11-05"  # the client's own revision
        assert initialized["result"]["serverInfo"]["name"] == "fake-modern"
        tools = await client.request(1, "tools/list")
        assert [tool["name"] for tool in tools["result"]["tools"]] == ["echo"]
        called = await client.request(2, "tools/call", {"name": "echo", "arguments": {"text": "hi"}})
        assert called["result"]["content"] == [{"type": "text", "text": "echo hi"}]
        assert await client.request(3, "ping") == {"jsonrpc": "2.0", "id": 3, "result": {}}
        assert sessions_open(proxy) == 1 and streams_open(proxy) == 1


async def test_the_session_ends_with_its_stream(proxy: Proxy, fake: FakeModern):
    async with sse_client(proxy) as client:
        await client.initialize()
        assert sessions_open(proxy) == 1
        endpoint = client.endpoint
    # The client went away: its session is ended at the endpoint (not left to expire).
    assert await until(lambda: sessions_open(proxy) == 0 and streams_open(proxy) == 0)
    late = await proxy.client.post(endpoint, json={"jsonrpc": "2.0", "id": 9, "method": "ping"})
    assert late.status == 404
    assert (await late.json())["error"]["message"] == "Session not found"


async def test_two_streams_are_two_sessions(proxy: Proxy, fake: FakeModern):
    async with sse_client(proxy) as one, sse_client(proxy) as two:
        await one.initialize()
        await two.initialize()
        assert one.endpoint != two.endpoint
        assert sessions_open(proxy) == 2


async def test_a_post_that_is_not_json_rpc_gets_a_json_rpc_error_and_the_stream_goes_on(proxy: Proxy, fake: FakeModern):
    async with sse_client(proxy) as client:
        await client.initialize()
        garbage = await client.post(b"{not json")
        assert garbage.status == 400
        assert (await garbage.json())["error"]["code"] == jsonrpc.PARSE_ERROR
        invalid = await client.post({"jsonrpc": "2.0", "id": 4})
        assert invalid.status == 400
        assert (await invalid.json())["error"]["code"] == jsonrpc.INVALID_REQUEST
        assert (await client.request(5, "ping"))["result"] == {}


async def test_a_post_without_a_session_or_with_a_forged_one_is_refused(proxy: Proxy, fake: FakeModern):
    missing = await proxy.client.post("/messages", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert missing.status == 400
    assert (await missing.json())["error"]["code"] == jsonrpc.INVALID_REQUEST
    forged = await proxy.client.post("/messages?session_id=abc", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert forged.status == 404
    assert (await forged.json())["error"]["message"] == "Session not found"


async def test_the_session_opens_only_for_the_caller_who_opened_the_stream(proxy: Proxy, fake: FakeModern):
    async with sse_client(proxy, {"Authorization": "Bearer alice"}) as client:
        await client.initialize()
        other = await client.post({"jsonrpc": "2.0", "id": 7, "method": "ping"}, {"Authorization": "Bearer mallory"})
        assert other.status == 404
        assert (await client.request(8, "ping"))["result"] == {}  # the owner's still works


async def test_streams_past_the_bound_are_refused_with_503(make_proxy: MakeProxy, fake: FakeModern):
    proxy = await make_proxy(**{"downstream.sse.max_connections": 1})
    async with sse_client(proxy):
        refused = await proxy.client.get("/sse", headers={"Accept": "text/event-stream"})
        assert refused.status == 503
        assert refused.headers["Content-Type"].startswith("application/json")
        assert "Retry-After" in refused.headers
        assert (await refused.json())["error"]["code"] == jsonrpc.INTERNAL_ERROR
    assert await until(lambda: streams_open(proxy) == 0)
    async with sse_client(proxy) as again:  # the slot is free once the first stream ended
        await again.initialize()


async def test_the_wrong_method_on_either_path_is_405_json(proxy: Proxy, fake: FakeModern):
    for method, path, allow in (("POST", "/sse", "GET"), ("GET", "/messages", "POST"), ("HEAD", "/sse", "GET")):
        response = await proxy.client.request(method, path)
        assert response.status == 405, (method, path)
        assert response.headers["Allow"] == allow
        if method != "HEAD":
            assert (await response.json())["error"]["code"] == jsonrpc.INVALID_REQUEST


async def test_disabled_the_paths_are_not_served(make_proxy: MakeProxy, fake: FakeModern):
    proxy = await make_proxy(**{"downstream.sse.enabled": False})
    response = await proxy.client.get("/sse", headers={"Accept": "text/event-stream"})
    assert response.status == 404
    assert response.headers["Content-Type"].startswith("application/json")


async def test_a_foreign_origin_is_refused_on_both_paths(proxy: Proxy, fake: FakeModern):
    for method, path in (("GET", "/sse"), ("POST", "/messages?session_id=x")):
        response = await proxy.client.request(method, path, headers={"Origin": "https://evil.example"})
        assert response.status == 403, (method, path)


async def test_shutdown_ends_the_streams(make_proxy: MakeProxy, fake: FakeModern):
    proxy = await make_proxy()
    async with sse_client(proxy) as client:
        await client.initialize()
        await proxy.client.server.close()  # the listener stops: streams end, and the session with them
        assert await client.event() is None
    assert sessions_open(proxy) == 0


@pytest.mark.parametrize(
    ("stream_path", "message_path", "named"),
    [("/sse", "/messages", "messages"), ("/a/sse", "/a/post", "post"), ("/sse", "/x/messages", "/x/messages")],
)
async def test_the_endpoint_is_named_relative_to_the_stream_when_they_share_a_folder(
    make_proxy: MakeProxy, fake: FakeModern, stream_path: str, message_path: str, named: str
):
    proxy = await make_proxy(**{"downstream.sse.path": stream_path, "downstream.sse.message_path": message_path})
    response = await proxy.client.get(stream_path, headers={"Accept": "text/event-stream"})
    client = SseClient(proxy.client, response, {})
    first = await client.event()
    response.close()
    assert first is not None and first[0] == "endpoint"
    assert first[1].split("?")[0] == named


# ---------------------------------------------------------------- hostile bodies

HOSTILE_EXAMPLES = 150  # per state


def hostile_bodies(count: int) -> list[bytes]:
    """Generated POST bodies (tests/hostile/strategies.py): messages with any member of any JSON
    type, batches of them, raw bytes and truncated JSON; the same ones every run."""
    encoded = st.one_of(
        hs.messages().map(hs.encode),
        st.lists(hs.messages(), max_size=4).map(hs.encode),
        st.binary(max_size=300),
        hs.messages().map(lambda m: hs.encode(m)[: max(1, len(hs.encode(m)) // 2)]),
    )
    return hs.examples(encoded, count)


def stream_problems(client: SseClient) -> list[str]:
    """What came on the stream that must not: anything but JSON-RPC, or the proxy's answer to an
    error it did not handle (tests/support/answers.py)."""
    found = [f"not JSON-RPC: {message}" for message in client.seen if jsonrpc.kind(message) == "invalid"]
    for message in client.seen:
        error = message.get("error")
        if isinstance(error, dict) and error.get("message") in answers.UNHANDLED:
            found.append(f"an unhandled error: {message}")
    return found


async def initialized(client: SseClient, state: str) -> None:
    """The client in `state`: its stream open (`before-initialize`), or its session initialized."""
    if state == "after-initialize":
        await client.initialize()


async def served_on(client: SseClient, state: str) -> None:
    """The session answers as ever (initialized first, when it was not)."""
    if state == "before-initialize":
        await client.initialize()
    final = await client.request("after-the-storm", "ping")
    assert final["result"] == {}


@pytest.mark.parametrize("state", ["before-initialize", "after-initialize"])
async def test_every_hostile_post_gets_202_or_a_json_rpc_error_and_the_session_keeps_serving(
    proxy: Proxy, fake: FakeModern, state: str
):
    bodies = hostile_bodies(HOSTILE_EXAMPLES)
    tally.count("hostile.proxy", len(bodies))
    tally.count("hostile.proxy.legacy-sse", len(bodies))
    async with sse_client(proxy) as client:
        await initialized(client, state)
        for body in bodies:
            posted = await client.post(body)
            assert posted.status in (202, 400), (posted.status, body)
            if posted.status == 400:
                error = (await posted.json())["error"]
                assert error["code"] in (jsonrpc.PARSE_ERROR, jsonrpc.INVALID_REQUEST), (error, body)
        # Whatever came on the stream meanwhile is JSON-RPC, and the session still answers.
        await served_on(client, state)
        assert not stream_problems(client), stream_problems(client)
    forget_foreign(fake, [_decoded(body) for body in bodies])


@pytest.mark.parametrize("state", ["before-initialize", "after-initialize"])
async def test_every_member_of_every_json_type_gets_the_documented_answer(proxy: Proxy, fake: FakeModern, state: str):
    """A request and a client's answer with `jsonrpc`, `id`, `method`, `params`, `result`, `error`
    each of every JSON type: what is no JSON-RPC message is refused (400 -32600, with its id when
    it can be read); every request that is gets its answer on the stream, never the proxy's own
    failure; and the session serves on."""
    request = {"jsonrpc": "2.0", "id": "mistyped", "method": "tools/list"}
    answer = {"jsonrpc": "2.0", "id": "mistyped", "result": {}}
    cases = [*hs.mistyped(request, hs.REQUEST_MEMBERS), *hs.mistyped(answer, hs.ANSWER_MEMBERS)]
    tally.count("hostile.proxy", len(cases))
    tally.count("hostile.proxy.legacy-sse", len(cases))
    async with sse_client(proxy) as client:
        await initialized(client, state)
        for name, message in cases:
            posted = await client.post(message)
            if not answers.well_formed(message):
                refused = await posted.json()
                assert (posted.status, refused["error"]["code"]) == (400, jsonrpc.INVALID_REQUEST), (name, refused)
                assert refused.get("id") == jsonrpc.id_of(message), (name, refused)
                continue
            assert posted.status == 202, (name, await posted.text())
            if "method" in message and "id" in message:  # a request: its answer comes on the stream
                reply = await client.message(lambda m, i=message["id"]: m.get("id") == i and "method" not in m)
                assert "result" in reply or reply["error"]["message"] not in answers.UNHANDLED, (name, reply)
        await served_on(client, state)
        assert not stream_problems(client), stream_problems(client)


def forget_foreign(fake: FakeModern, sent: list[Any]) -> None:
    """A method the spec does not define is passed on as it came (extensions are not the proxy's
    to refuse), so the upstream sees requests no schema describes: those, and only those, are taken
    out of the schema check `fake` makes of everything else it received."""
    methods = [m.get("method") for m in sent for m in (m if isinstance(m, list) else [m]) if isinstance(m, dict)]
    defined = spec_methods()
    foreign = [c for c in fake.calls if c.method not in defined]
    assert all(c.method in methods for c in foreign), [c.method for c in foreign]
    fake.calls[:] = [c for c in fake.calls if c.method in defined]


def _decoded(body: bytes) -> Any:
    try:
        decoded = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested past what json.loads reads
        return {}
    return decoded if isinstance(decoded, (dict, list)) else {}


def spec_methods() -> set[str]:
    """Every request method the 2026-07-28 schema defines."""
    definitions = json.loads(schema_path("2026-07-28").read_text())["$defs"]
    found = set()
    for definition in definitions.values():
        method = definition.get("properties", {}).get("method", {}) if isinstance(definition, dict) else {}
        if isinstance(method, dict) and isinstance(method.get("const"), str):
            found.add(method["const"])
    return found
