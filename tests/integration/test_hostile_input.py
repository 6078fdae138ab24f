"""Hostile client input over every route: a clear JSON-RPC error, never an internal error, a
traceback or a call that waits out its deadline, and the proxy serves the next request as before.

Routes (docs/design.md §Routing): a legacy client of a modern upstream (translated), a modern client
of a legacy upstream (translated), and the two same-era pass-throughs. The requests go over a raw
socket to 127.0.0.1, because some of them carry header bytes an HTTP client library refuses to send.
Edge rules: docs/translation.md §7.24.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from proxy.app import create_app
from proxy.config import DownstreamConfig, load_settings
from proxy.downstream.server import Runner
from proxy.protocol import jsonrpc, meta
from proxy.protocol.headers import PROTOCOL_VERSION_HEADER, SESSION_HEADER
from proxy.protocol.versions import LATEST_LEGACY, MODERN_VERSIONS
from tests.hostile import strategies as hs
from tests.integration.conftest import serve
from tests.support import answers, tally
from tests.support.fake_legacy import FakeLegacy
from tests.support.fake_modern import PATH, FakeModern
from tests.support.legacy_client import LegacyClient, initialize_message
from tests.support.modern_client import ModernClient
from tests.support.raw_http_client import Reply

JSONDict = dict[str, Any]
WAIT = 5.0  # upper bound for anything a test waits for
LONG = 12345678901234567890123  # 23 digits: the body goes through the exact (stdlib) JSON codec
LONE = "@@lone-surrogate@@"  # replaced by the JSON escape of a lone surrogate in the body's text
ROUTES = ["legacy-to-modern", "legacy-pass-through", "modern-to-legacy", "modern-pass-through"]


@dataclass
class RawReply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def message(self) -> JSONDict:
        assert self.headers.get("content-type", "").startswith("application/json"), (self.status, self.headers)
        decoded = json.loads(self.body)
        assert isinstance(decoded, dict), decoded
        return decoded


def _dechunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return out


async def raw_post(port: int, headers: list[tuple[bytes, bytes]], body: bytes) -> RawReply:
    """One POST over its own connection, header bytes exactly as given."""
    lines = [b"POST " + PATH.encode() + b" HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close"]
    lines += [name + b": " + value for name, value in headers]
    lines.append(b"Content-Length: " + str(len(body)).encode())
    return await raw_request(port, b"\r\n".join(lines) + b"\r\n\r\n" + body)


async def raw_request(port: int, data: bytes) -> RawReply:
    """Send `data` on a connection of its own; the reply, read until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        data = await reader.read()  # Connection: close, so the reply ends with the connection
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, payload = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    reply_headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        reply_headers[name.strip().lower()] = value.strip()
    if reply_headers.get("transfer-encoding") == "chunked":
        payload = _dechunk(payload)
    return RawReply(int(status_line.split()[1]), reply_headers, payload)


@dataclass
class Edge:
    """The proxy on one route, and a well-behaved client of the right era."""

    route: str
    port: int
    fake: FakeModern | FakeLegacy
    modern: ModernClient | None = None
    session: list[tuple[bytes, bytes]] = field(default_factory=list)  # a legacy client's session headers

    @property
    def legacy_client(self) -> bool:
        return self.modern is None

    def message(self, method: str, params: JSONDict | None = None, *, id: Any = 7) -> JSONDict:
        """A valid request of the client's era (a notification with `id=None`)."""
        if self.modern is not None:
            message = self.modern.message(method, params or {}, id=0 if id is None else id)
        else:
            message = {"jsonrpc": "2.0", "id": id, "method": method, "params": params or {}}
        if id is None:
            del message["id"]
        return message

    def headers(self, message: JSONDict, drop: tuple[str, ...] = ()) -> list[tuple[bytes, bytes]]:
        if self.modern is None:
            base = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
            pairs = [(k.encode(), v.encode()) for k, v in base.items()] + self.session
        else:
            pairs = [(k.encode(), v.encode()) for k, v in self.modern.headers(message).items()]
        return [(k, v) for k, v in pairs if k.decode().lower() not in drop]

    async def post(self, body: bytes, headers: list[tuple[bytes, bytes]]) -> RawReply:
        async with asyncio.timeout(WAIT):
            return await raw_post(self.port, headers, body)

    async def serves_a_normal_request(self) -> None:
        message = self.message("tools/list", id="after")
        reply = await self.post(json.dumps(message).encode(), self.headers(message))
        assert reply.status == 200, (reply.status, reply.body)
        assert reply.message["id"] == "after" and "tools" in reply.message["result"], reply.message


class ProxyServer(TestServer):
    """A test server on the runner the command line uses: its connections answer even HTTP that
    aiohttp cannot parse with a JSON-RPC error."""

    async def _make_runner(self, **kwargs: Any) -> web.BaseRunner:
        return Runner(self.app, DownstreamConfig(), **kwargs)


@pytest.fixture(params=ROUTES)
async def edge(request: pytest.FixtureRequest, aiohttp_server: Any, aiohttp_client: Any) -> AsyncIterator[Edge]:
    route: str = request.param
    modern_upstream = route in ("legacy-to-modern", "modern-pass-through")
    fake: FakeModern | FakeLegacy = FakeModern() if modern_upstream else FakeLegacy()
    upstream = await serve(aiohttp_server, fake.app)
    fake.url = str(upstream.make_url(PATH))
    settings = load_settings(
        None,
        **{
            "upstream.url": fake.url,
            "upstream.era": "modern" if modern_upstream else "legacy",
            "cache.watch": False,
        },
    )
    app, _ = create_app(settings)
    server = ProxyServer(app, host="127.0.0.1")
    client = await aiohttp_client(server)  # starts the server, and closes it at the end
    assert server.runner is not None and server.runner._kwargs.get("handler_cancellation") is True
    assert server.port is not None
    edge = Edge(route, server.port, fake)
    if route.startswith("legacy"):
        peer = await LegacyClient.connect(client)
        edge.session = [
            (SESSION_HEADER.encode(), peer.session_id.encode()),
            (PROTOCOL_VERSION_HEADER.encode(), LATEST_LEGACY.encode()),
        ]
    else:
        edge.modern = ModernClient(client)
    yield edge
    problems = fake.schema_problems() if isinstance(fake, FakeModern) else fake.protocol_problems()
    assert not problems, f"the proxy sent the upstream what it must refuse: {problems}"


def nested(depth: int) -> str:
    """Stands for arrays nested `depth` deep (written by body_of: json.dumps could not)."""
    return f"@@nested-{depth}@@"


def body_of(message: JSONDict) -> bytes:
    """The message as JSON text, with a lone surrogate escape where `LONE` stands and the nested
    arrays `nested()` stands for."""
    text = json.dumps(message).replace(json.dumps(LONE), '"\\ud800"')
    text = re.sub(r'"@@nested-(\d+)@@"', lambda m: "[" * int(m[1]) + "]" * int(m[1]), text)
    return text.encode()


# Each case: the request to send (body, headers) and what the proxy must answer, per client era:
# (HTTP status, JSON-RPC code, whether the error carries the request's id), or 202 (no body).
Build = Callable[[Edge], tuple[bytes, list[tuple[bytes, bytes]]]]


def _request(method: str, params: JSONDict, *, id: Any = 7, extra: list[tuple[bytes, bytes]] | None = None) -> Build:
    def build(edge: Edge) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        message = edge.message(method, params, id=id)
        return body_of(message), edge.headers(message) + (extra or [])

    return build


def _notification(method: str, params: JSONDict) -> Build:
    def build(edge: Edge) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        message = edge.message(method, params, id=None)
        return body_of(message), edge.headers(message)

    return build


def _control_char_method(edge: Edge) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    message = edge.message("tools/li\x01st")
    # A modern client could not mirror it into Mcp-Method (aiohttp refuses such a header line).
    return body_of(message), edge.headers(message, drop=("mcp-method",))


def _with_text(build: Build, old: bytes, new: bytes) -> Build:
    def rebuilt(edge: Edge) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        body, headers = build(edge)
        assert old in body
        return body.replace(old, new), headers

    return rebuilt


def _gzip_claimed(edge: Edge) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    message = edge.message("tools/list")
    return body_of(message), [*edge.headers(message), (b"Content-Encoding", b"gzip")]


BAD_REQUEST = (400, jsonrpc.INVALID_REQUEST, True)
BAD_REQUEST_NO_ID = (400, jsonrpc.INVALID_REQUEST, False)
PARSE_ERROR = (400, jsonrpc.PARSE_ERROR, False)
INVALID_PARAMS = (400, jsonrpc.INVALID_PARAMS, True)

CASES: dict[str, tuple[Build, Any, Any]] = {
    # name: (build, for a legacy client, for a modern client)
    "params-nested-300-deep": (_request("tools/list", {"filter": nested(300)}), BAD_REQUEST, BAD_REQUEST),
    "arguments-nested-1000-deep": (
        _request("tools/call", {"name": "t", "arguments": {"a": nested(1000)}}),
        BAD_REQUEST,
        BAD_REQUEST,
    ),
    # Deeper than the JSON decoder goes (orjson: 1024 levels): too deep all the same, not a parse
    # error; its id cannot be read.
    "params-nested-2000-deep": (_request("tools/list", {"filter": nested(2000)}), BAD_REQUEST_NO_ID, BAD_REQUEST_NO_ID),
    "lone-surrogate-in-the-id": (_request("tools/list", {"n": LONG}, id=LONE), PARSE_ERROR, PARSE_ERROR),
    "lone-surrogate-in-arguments": (
        _request("tools/call", {"name": "t", "arguments": {"a": LONE, "n": LONG}}),
        PARSE_ERROR,
        PARSE_ERROR,
    ),
    "nan-beside-a-long-number": (_request("tools/list", {"n": LONG, "x": float("nan")}), PARSE_ERROR, PARSE_ERROR),
    "infinity-beside-a-long-number": (
        _request("tools/list", {"n": LONG, "x": float("inf")}),
        PARSE_ERROR,
        PARSE_ERROR,
    ),
    "utf8-encoded-surrogate-beside-a-long-number": (
        _with_text(_request("tools/list", {"n": LONG, "x": "here"}), b'"here"', b'"\xed\xa0\x80"'),
        PARSE_ERROR,
        PARSE_ERROR,
    ),
    "authorization-not-utf8": (
        _request("tools/list", {}, extra=[(b"Authorization", b"Bearer \xff\xfe")]),
        BAD_REQUEST,
        BAD_REQUEST,
    ),
    "traceparent-not-utf8": (
        _request("tools/call", {"name": "t", "arguments": {}}, extra=[(b"traceparent", b"00-\xff")]),
        BAD_REQUEST,
        BAD_REQUEST,
    ),
    "tracestate-not-utf8": (
        _request("tools/call", {"name": "t", "arguments": {}}, extra=[(b"tracestate", b"a=\xc3")]),
        BAD_REQUEST,
        BAD_REQUEST,
    ),
    "baggage-not-utf8": (
        _request("tools/call", {"name": "t", "arguments": {}}, extra=[(b"baggage", b"k=\xe2\x82")]),
        BAD_REQUEST,
        BAD_REQUEST,
    ),
    "gzip-claimed-not-gzip": (_gzip_claimed, PARSE_ERROR, PARSE_ERROR),
    "tool-name-an-object": (_request("tools/call", {"name": {}, "arguments": {}}), INVALID_PARAMS, INVALID_PARAMS),
    "resource-uri-an-object": (_request("resources/read", {"uri": {"x": 1}}), INVALID_PARAMS, INVALID_PARAMS),
    # A modern notification is accepted and ignored (docs/translation.md §4.1 row 4).
    "cancelled-request-id-an-object": (
        _notification("notifications/cancelled", {"requestId": {}}),
        (400, jsonrpc.INVALID_PARAMS, False),
        202,
    ),
    "control-character-in-the-method": (_control_char_method, BAD_REQUEST, BAD_REQUEST),
}


def _problems(logs: list[JSONDict], records: list[logging.LogRecord]) -> list[Any]:
    """Log entries that say the proxy failed: errors, tracebacks, failed tasks."""
    bad: list[Any] = [
        entry
        for entry in logs
        if entry.get("log_level") in ("error", "critical", "exception")
        or entry.get("exc_info")
        or entry.get("event") in ("task_failed", "unhandled_error")
    ]
    bad += [r.getMessage() for r in records if r.levelno >= logging.ERROR or r.exc_info]
    return bad


@pytest.mark.parametrize("case", list(CASES))
async def test_hostile_input_gets_a_clear_json_rpc_error_and_the_proxy_serves_on(
    edge: Edge, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    build, for_legacy, for_modern = CASES[case]
    expected = for_legacy if edge.legacy_client else for_modern
    body, headers = build(edge)
    upstream_before = len(edge.fake.calls)
    with capture_logs() as logs, caplog.at_level(logging.WARNING):
        reply = await edge.post(body, headers)
        if expected == 202:
            assert (reply.status, reply.body) == (202, b"")
        else:
            status, code, with_id = expected
            assert reply.status == status, (reply.status, reply.body)
            error = reply.message["error"]
            assert error["code"] == code, error
            assert isinstance(error["message"], str) and error["message"]
            assert ("id" in reply.message) is with_id, reply.message
            if with_id:
                assert reply.message["id"] == 7
        assert len(edge.fake.calls) == upstream_before, "a refused request reached the upstream"
        await edge.serves_a_normal_request()
    assert not _problems(logs, caplog.records)


async def test_a_long_integer_in_a_cacheable_request_is_relayed_and_answered(edge: Edge) -> None:
    """Valid JSON the fast codec cannot write (an integer beyond 64 bits) is served, not an error:
    the cache key and the pool key are written exactly."""
    message = edge.message("tools/list", {"filter": LONG}, id="long")
    with capture_logs() as logs:
        reply = await edge.post(body_of(message), edge.headers(message))
    assert reply.status == 200, (reply.status, reply.body)
    assert reply.message["id"] == "long" and "tools" in reply.message["result"]
    [call] = [c for c in edge.fake.calls if c.method == "tools/list" and c.body["params"].get("filter") == LONG]
    assert call.raw.count(str(LONG).encode()) == 1  # the exact number, not a float
    assert not _problems(logs, [])


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"HELLO\r\n\r\n", id="no-request-line"),
        pytest.param(b"POST /mcp HTTP/9.x\r\nHost: 127.0.0.1\r\n\r\n", id="bad-http-version"),
        pytest.param(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nNo-Colon-Here\r\n\r\n", id="header-line-without-colon"),
        pytest.param(
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nMcp-Method: tools/li\x01st\r\nContent-Length: 2\r\n\r\n{}",
            id="control-character-in-a-header",
        ),
        pytest.param(
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n", id="header-too-long"
        ),
    ],
)
async def test_http_that_cannot_be_parsed_gets_a_json_rpc_error_body(
    edge: Edge, data: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Not aiohttp's plain-text page: a request that never reaches a handler is answered as JSON-RPC
    too, with aiohttp's status, and logged as one line rather than a traceback."""
    with capture_logs() as logs, caplog.at_level(logging.WARNING):
        async with asyncio.timeout(WAIT):
            reply = await raw_request(edge.port, data)
        assert 400 <= reply.status < 500, (reply.status, reply.body)
        message = reply.message
        assert "id" not in message
        assert message["error"]["code"] == jsonrpc.INVALID_REQUEST
        assert message["error"]["message"].startswith("Bad request")
        await edge.serves_a_normal_request()
    assert not _problems(logs, caplog.records)
    assert [entry["status"] for entry in logs if entry["event"] == "malformed_http_request"] == [reply.status]


@pytest.mark.parametrize("case", ["params-nested-300-deep", "authorization-not-utf8", "tool-name-an-object"])
async def test_a_refused_request_is_logged_with_the_method_its_body_names(edge: Edge, case: str) -> None:
    build, _, _ = CASES[case]
    body, headers = build(edge)
    with capture_logs() as logs:
        reply = await edge.post(body, headers)
    assert reply.status == 400
    [line] = [entry for entry in logs if entry["event"] == "request"]
    assert line["method"] == json.loads(body)["method"]
    assert line["outcome"] == "rejected" and line["status"] == 400


@pytest.mark.parametrize("edge", ["legacy-to-modern", "legacy-pass-through"], indirect=True)
@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_a_get_or_delete_with_an_authorization_header_that_is_not_utf8_is_refused(
    edge: Edge, method: str
) -> None:
    """The session's GET stream and DELETE read the caller's identity too (legacy clients only:
    a modern client has no session)."""
    lines = [f"{method} {PATH} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
    lines += [name + b": " + value for name, value in edge.session]
    lines.append(b"Authorization: Bearer \xff")
    with capture_logs() as logs:
        async with asyncio.timeout(WAIT):
            reply = await raw_request(edge.port, b"\r\n".join(lines) + b"\r\n\r\n")
    assert reply.status == 400
    assert reply.message["error"]["code"] == jsonrpc.INVALID_REQUEST
    await edge.serves_a_normal_request()
    assert not _problems(logs, [])


# ---------------------------------------------------------------- every member of every JSON type

# A request, and a client's answer (to no request of the server's), with each member in turn of
# every JSON type (tests/hostile/strategies.py), in every state a client can be in on this edge.


def sweep(edge: Edge, state: str) -> Iterator[tuple[str, JSONDict, list[tuple[bytes, bytes]]]]:
    """(what was changed, the message, its headers) for the client of `edge` in `state`: `session`
    (a legacy client in its session, or a modern client), `no-session` (a legacy client's message
    without a session id), `initialize` (a legacy client's initialize, before any session)."""
    if state == "initialize":
        base = initialize_message(LATEST_LEGACY, {}, {"name": "hostile", "version": "1"})
        cases = [*hs.mistyped(base, hs.REQUEST_MEMBERS)]
        for member in ("protocolVersion", "capabilities", "clientInfo"):
            for value in hs.EVERY_JSON_TYPE:
                cases.append(
                    (f"params.{member}={json.dumps(value)}", {**base, "params": {**base["params"], member: value}})
                )
        for member in ("name", "version"):
            for value in hs.EVERY_JSON_TYPE:
                info = {"name": "hostile", "version": "1", member: value}
                cases.append(
                    (
                        f"clientInfo.{member}={json.dumps(value)}",
                        {**base, "params": {**base["params"], "clientInfo": info}},
                    )
                )
        for name, message in cases:
            yield name, message, edge.headers(message, drop=("mcp-session-id", "mcp-protocol-version"))
        return
    request = edge.message("tools/list", id="mistyped")
    answer = {"jsonrpc": "2.0", "id": "mistyped", "result": {}}
    drop = ("mcp-session-id",) if state == "no-session" else ()
    for name, message in (*hs.mistyped(request, hs.REQUEST_MEMBERS), *hs.mistyped(answer, hs.ANSWER_MEMBERS)):
        yield name, message, edge.headers(message, drop=drop)


def answer_problems(reply: RawReply, message: Any, headers: list[tuple[bytes, bytes]]) -> list[str]:
    """What is wrong with the answer to one message: the invariant every answer holds
    (tests/support/answers.py) and, for what is no JSON-RPC message, the documented refusal: 400
    -32600, with the id when it can be read (docs/translation.md §7.24; -32602 where the POST's
    MCP-Protocol-Version names a 2026-07-28 version and its `_meta` none: §1.1 rungs 4 and 6 come
    first). A batch: the invariant."""
    found = answers.problems(Reply(reply.status, "", list(reply.headers.items()), reply.body, b""))
    if isinstance(message, list) or answers.well_formed(message):
        return found
    readable = isinstance(message, dict) and isinstance(message.get("id"), str | int)
    readable = readable and not isinstance(message["id"], bool)
    try:
        error = reply.message["error"]
    except (AssertionError, KeyError, ValueError):
        return [*found, f"not a JSON-RPC error: HTTP {reply.status} {reply.body[:200]!r}"]
    codes = {jsonrpc.INVALID_REQUEST}
    modern = any(
        name.lower() == b"mcp-protocol-version" and value.decode() in MODERN_VERSIONS for name, value in headers
    )
    if modern and meta_version(message) is None:
        codes.add(jsonrpc.INVALID_PARAMS)
    if reply.status != 400 or error.get("code") not in codes:
        found.append(f"HTTP {reply.status} {error}, not 400 {sorted(codes)}")
    if ("id" in reply.message) is not readable and error.get("code") == jsonrpc.INVALID_REQUEST:
        found.append(f"the id {'missing' if readable else 'made up'}: {reply.message}")
    return found


def meta_version(message: Any) -> Any:
    params = message.get("params") if isinstance(message, dict) else None
    request_meta = params.get("_meta") if isinstance(params, dict) else None
    return request_meta.get(meta.PROTOCOL_VERSION) if isinstance(request_meta, dict) else None


def routes_in_states(*states: str) -> Any:
    """Each route in each of `states` it has: a 2026-07-28 client has no session and no
    initialize, so its routes are swept once ("session" stands for its every request)."""
    return pytest.mark.parametrize(
        ("edge", "state"),
        [(route, state) for route in ROUTES for state in states if route.startswith("legacy") or state == "session"],
        indirect=["edge"],
    )


@routes_in_states("session", "no-session", "initialize")
async def test_every_member_of_every_json_type_gets_the_documented_answer_and_the_proxy_serves_on(
    edge: Edge, state: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`method` (and `id`, `params`, `jsonrpc`, `result`, `error`) of each JSON type, in and out
    of a session: never a 500, an unreadable answer or a crash."""
    found: dict[str, list[str]] = {}
    sent: list[JSONDict] = []
    with capture_logs() as logs, caplog.at_level(logging.WARNING):
        for name, message, headers in sweep(edge, state):
            tally.count("hostile.proxy")
            tally.count("hostile.proxy.mistyped")
            sent.append(message)
            reply = await edge.post(body_of(message), headers)
            if problems := answer_problems(reply, message, headers):
                found[name] = problems
        await edge.serves_a_normal_request()
    assert not found, json.dumps(found, indent=1)[:4000]
    assert not _problems(logs, caplog.records)
    forget_relayed(edge, sent)


def forget_relayed(edge: Edge, sent: list[Any]) -> None:
    """A pass-through relays a JSON-RPC message as the client sent it (§7.24 lists what it
    refuses): what the upstream's schema says of its params or result is the upstream's to answer.
    Those are taken out of the check the `edge` fixture makes of everything else the upstream got."""
    if edge.route.endswith("pass-through"):
        relayed = [body for body in sent if all(map(answers.well_formed, body if isinstance(body, list) else [body]))]
        edge.fake.calls[:] = [call for call in edge.fake.calls if call.body not in relayed]


GENERATED_EXAMPLES = 100  # per route and state: in-process, so the test command's time stays bounded


@routes_in_states("session", "no-session")
async def test_generated_messages_in_and_out_of_a_session_get_the_documented_answer(
    edge: Edge, state: str, caplog: pytest.LogCaptureFixture
) -> None:
    """tests/hostile/strategies.py's bodies (any member of any JSON type, batches, any JSON value),
    the same ones every run."""
    found: list[str] = []
    sent: list[Any] = []
    drop = ("mcp-session-id",) if state == "no-session" else ()
    with capture_logs() as logs, caplog.at_level(logging.WARNING):
        for body in hs.examples(hs.bodies, GENERATED_EXAMPLES):
            tally.count("hostile.proxy")
            tally.count("hostile.proxy.generated")
            sent.append(body)
            headers = edge.headers(body, drop=drop)
            reply = await edge.post(hs.encode(body), headers)
            if problems := answer_problems(reply, body, headers):
                found.append(f"{hs.encode(body)[:300]!r}: {problems}")
        await edge.serves_a_normal_request()
    assert not found, "\n".join(found[:10])
    assert not _problems(logs, caplog.records)
    forget_relayed(edge, sent)
