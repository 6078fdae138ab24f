"""How the HTTP upstream reads a whole (not streamed) reply (proxy/upstream/http.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from multidict import CIMultiDict

from proxy import __version__
from proxy.config import UpstreamConfig
from proxy.protocol import jsonrpc
from proxy.upstream.errors import UpstreamProtocolError
from proxy.upstream.http import HttpUpstream, _media_type

REPLY = jsonrpc.result_response(1, {"resultType": "complete", "content": [{"type": "text", "text": "x" * 1600}]})


class ArrivingInParts:
    """A body whose parts arrive one per read, like one a server writes in two parts 200 ms apart:
    a read returns what has arrived so far (aiohttp's StreamReader.read(n) does the same)."""

    def __init__(self, *parts: bytes) -> None:
        self._parts = [part for part in parts if part]

    async def read(self, n: int = -1) -> bytes:
        if not self._parts:
            return b""
        part = self._parts[0]
        if 0 <= n < len(part):
            self._parts[0] = part[n:]
            return part[:n]
        self._parts.pop(0)
        return part

    def at_eof(self) -> bool:
        return not self._parts

    def is_eof(self) -> bool:
        return False  # the end has not arrived yet


class Arrived:
    """A body that had all arrived when it is read, as a small reply has with its head: taken as
    it is (aiohttp's read_nowait), with no read to await."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def is_eof(self) -> bool:
        return True

    def read_nowait(self) -> bytes:
        body, self._body = self._body, b""
        return body

    async def read(self, n: int = -1) -> bytes:
        raise AssertionError("awaited a read of a body that had arrived")


class Response:
    def __init__(self, *parts: bytes, status: int = 200, length: int | None = None) -> None:
        self.status = status
        self.headers = CIMultiDict({"Content-Type": "application/json"})
        self.content_length = length
        self.content = ArrivingInParts(*parts)

    def close(self) -> None:
        pass


def upstream(**config: Any) -> HttpUpstream:
    # A client session that is never asked for a connection: these tests hand replies in.
    unused = SimpleNamespace(connector=object(), timeout=None, headers={})
    return HttpUpstream(UpstreamConfig(url="http://127.0.0.1:1/mcp", **config), session=unused)  # type: ignore[arg-type]


async def messages(up: HttpUpstream, response: Response) -> list[Any]:
    return await up._body_messages(response, "application/json")  # type: ignore[arg-type]


async def test_a_reply_that_arrives_in_two_reads_is_read_whole() -> None:
    """The body was read with one read of 64 KiB: the first part alone is not JSON (-32012)."""
    raw = json.dumps(REPLY).encode()
    assert len(raw) > 1600
    assert await messages(upstream(), Response(raw[:700], raw[700:])) == [REPLY]


async def test_a_reply_of_many_small_reads_is_read_whole() -> None:
    raw = json.dumps(REPLY).encode()
    parts = [raw[i : i + 10] for i in range(0, len(raw), 10)]
    assert await messages(upstream(), Response(*parts)) == [REPLY]


async def test_a_reply_that_has_all_arrived_is_taken_without_a_read_and_within_the_bound() -> None:
    raw = json.dumps(REPLY).encode()
    response = Response()
    response.content = Arrived(raw)  # type: ignore[assignment]
    assert await messages(upstream(max_reply_bytes=len(raw)), response) == [REPLY]
    response.content = Arrived(raw)  # type: ignore[assignment]
    with pytest.raises(UpstreamProtocolError, match=r"upstream\.max_reply_bytes"):
        await messages(upstream(max_reply_bytes=len(raw) - 1), response)


@pytest.mark.parametrize("announced", [True, False], ids=["content-length", "chunked"])
async def test_a_reply_over_max_reply_bytes_fails_naming_the_bound(announced: bool) -> None:
    raw = json.dumps(REPLY).encode()
    response = Response(raw[:1000], raw[1000:], length=len(raw) if announced else None)
    with pytest.raises(UpstreamProtocolError, match=r"upstream\.max_reply_bytes \(1000 bytes\)"):
        await messages(upstream(max_reply_bytes=1000), response)


async def test_a_reply_exactly_max_reply_bytes_long_is_read() -> None:
    raw = json.dumps(REPLY).encode()
    assert await messages(upstream(max_reply_bytes=len(raw)), Response(raw[:5], raw[5:])) == [REPLY]


@pytest.mark.parametrize("status", [200, 201])
@pytest.mark.parametrize("body", [b"", b" \r\n\t"], ids=["empty", "blank"])
async def test_an_empty_or_blank_success_body_holds_no_messages(status: int, body: bytes) -> None:
    assert await messages(upstream(), Response(body, status=status)) == []


@pytest.mark.parametrize("status", [200, 201])
async def test_a_success_body_that_is_not_json_rpc_fails(status: int) -> None:
    up = upstream()
    with pytest.raises(UpstreamProtocolError, match="not JSON"):
        await messages(up, Response(b"{nope", status=status))
    with pytest.raises(UpstreamProtocolError, match="not JSON-RPC"):
        await messages(up, Response(b'{"jsonrpc": "2.0"}', status=status))


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Application/JSON; charset=utf-8", "application/json"),
        (" text/event-stream ;x=1", "text/event-stream"),
        ("", ""),
    ],
)
def test_a_media_type_is_read_without_parameters_in_lower_case(header: str, expected: str) -> None:
    assert _media_type(header) == expected


class Requests:
    """Answers every request with the one response it was given (as proxy/upstream/wire.py's)."""

    def __init__(self, response: Response) -> None:
        self.response = response

    async def send(self, method: str, target: Any, body: bytes | None, headers: dict[str, str]) -> Response:
        return self.response


REPLIES = [
    (200, "application/json", json.dumps(REPLY).encode()),
    (200, "application/json", json.dumps([REPLY, REPLY]).encode()),
    (200, "application/json", b""),
    (200, "application/json", b"\n "),
    (200, "application/json", b"{nope"),
    (200, "application/json", b'{"jsonrpc": "2.0"}'),
    (200, "application/json; charset=utf-8", json.dumps(REPLY).encode()),
    (200, "text/plain", json.dumps(REPLY).encode()),
    (200, "text/html", b"<html>"),
    (201, "application/json", json.dumps(REPLY).encode()),
    (202, "application/json", b""),
    (400, "application/json", json.dumps(REPLY).encode()),
    (500, "text/plain", b"boom"),
]


@pytest.mark.parametrize(("status", "content_type", "body"), REPLIES)
async def test_an_exchange_reads_a_whole_reply_as_the_general_reader_does(
    status: int, content_type: str, body: bytes
) -> None:
    """The usual reply (200, application/json) is read on a shorter path: same messages, same
    errors as there."""

    async def outcome(read: Any) -> Any:
        up = upstream()
        try:
            result: Any = await read(up)
        except Exception as exc:
            result = (type(exc), str(exc))
        return result

    def response() -> Response:
        reply = Response(body, status=status)
        reply.headers = CIMultiDict({"Content-Type": content_type})
        return reply

    async def through_exchange(up: HttpUpstream) -> list[Any]:
        up._requests = Requests(response())  # type: ignore[assignment]
        async with up.exchange(jsonrpc.request(1, "ping"), {}) as reply:
            assert reply.status == status
            return [message async for message in reply]

    async def general(up: HttpUpstream) -> list[Any]:
        return await up._body_messages(response(), _media_type(content_type))  # type: ignore[arg-type]

    assert await outcome(through_exchange) == await outcome(general)


@pytest.mark.parametrize(
    "configured",
    [
        {},
        {"Authorization": "Bearer t", "X-Tenant": "a"},
        {"accept": "application/json", "user-agent": "custom/1"},  # the base ones, in another case
        {"Content-Type": "application/json; charset=utf-8"},  # never a default: sent per request
        {"content-type": "text/plain", "X-Key": "k"},
    ],
    ids=["none", "extra", "base-overridden", "content-type", "content-type-lower"],
)
async def test_the_own_client_session_sends_the_same_headers_as_any_other(
    aiohttp_server: Any, configured: dict[str, str]
) -> None:
    """Each request, with a body or without, reaches the upstream with exactly the headers it
    should, whichever client session the connections come from."""
    import aiohttp
    from aiohttp import web

    seen: list[list[tuple[str, str]]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(sorted((name.lower(), value) for name, value in request.headers.items()))
        return web.json_response(jsonrpc.result_response(1, {}))

    app = web.Application()
    app.router.add_route("*", "/mcp", record)
    server = await aiohttp_server(app)
    config = UpstreamConfig(url=str(server.make_url("/mcp")), headers=configured)
    extra = {"Mcp-Session-Id": "s1", "accept": "text/event-stream"}

    async def headers_sent(session: aiohttp.ClientSession) -> list[list[tuple[str, str]]]:
        seen.clear()
        up = HttpUpstream(config, session)
        async with up.exchange(jsonrpc.request(1, "ping"), extra) as reply:
            assert [message async for message in reply] == [jsonrpc.result_response(1, {})]
        async with up.exchange(None, extra, method="GET") as reply:
            pass
        for method, body in (("POST", b"{}"), ("DELETE", None)):
            response = await up.forwarding(method, body, {"X-Other": "o"})
            await response.content.read()
            response.close()
        await session.close()
        return list(seen)

    own = await headers_sent(HttpUpstream.client_session(config))
    assert own == await headers_sent(aiohttp.ClientSession(headers={"X-Session-Default": "not sent"}))
    # What each request carried: the base headers with upstream.headers over them (of any case),
    # the request's own over both, and a Content-Type only with a body.
    configured_lower = {name.lower(): value for name, value in configured.items()}
    base = {"accept": "application/json, text/event-stream", "user-agent": f"mcp-era-proxy/{__version__}"}
    every = {**base, **configured_lower, "accept-encoding": "gzip, deflate"}
    content_type = every.pop("content-type", "application/json")
    for (method, sent), body_length, extras in zip(
        (("POST", own[0]), ("GET", own[1]), ("POST", own[2]), ("DELETE", own[3])),
        (len(jsonrpc.encode(jsonrpc.request(1, "ping"))), None, 2, None),
        (extra, extra, {"X-Other": "o"}, {"X-Other": "o"}),
        strict=True,
    ):
        expected = {**every, **{name.lower(): value for name, value in extras.items()}}
        expected["host"] = f"127.0.0.1:{server.port}"
        if body_length is not None:
            expected |= {"content-type": content_type, "content-length": str(body_length)}
        elif method == "DELETE":
            expected["content-length"] = "0"  # as aiohttp's client says of a bodiless DELETE
        assert sent == sorted(expected.items()), method


async def test_a_body_that_has_all_arrived_is_read_without_a_coroutine() -> None:
    raw = json.dumps(REPLY).encode()
    response = Response()
    assert upstream().arrived_body(response) is None  # still arriving: read_body waits for it
    response.content = Arrived(raw)  # type: ignore[assignment]
    assert upstream().arrived_body(response) == raw  # type: ignore[arg-type]
    response.content = Arrived(raw)  # type: ignore[assignment]
    with pytest.raises(UpstreamProtocolError, match=r"upstream\.max_reply_bytes"):
        upstream(max_reply_bytes=len(raw) - 1).arrived_body(response)  # type: ignore[arg-type]
    response.content, response.content_length = Arrived(raw), len(raw)  # type: ignore[assignment]
    with pytest.raises(UpstreamProtocolError, match=r"upstream\.max_reply_bytes"):
        upstream(max_reply_bytes=len(raw) - 1).arrived_body(response)  # type: ignore[arg-type]


async def test_upstream_max_connections_bounds_the_requests_in_flight(aiohttp_server: Any) -> None:
    """The requests are written onto the client session's pool: at most `upstream.max_connections`
    reach the upstream at once, and the others wait for a connection rather than fail."""
    import asyncio

    from aiohttp import web

    in_flight, most, release = 0, 0, asyncio.Event()

    async def hold(request: web.Request) -> web.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await release.wait()
        in_flight -= 1
        return web.json_response(jsonrpc.result_response(1, {}))

    app = web.Application()
    app.router.add_post("/mcp", hold)
    server = await aiohttp_server(app)
    config = UpstreamConfig(url=str(server.make_url("/mcp")), max_connections=2)
    up = HttpUpstream(config, HttpUpstream.client_session(config))

    async def call() -> list[Any]:
        async with up.exchange(jsonrpc.request(1, "ping"), {}) as reply:
            return [message async for message in reply]

    calls = [asyncio.ensure_future(call()) for _ in range(5)]
    try:
        async with asyncio.timeout(5):
            while in_flight < 2:  # noqa: ASYNC110  # bounded by the timeout above
                await asyncio.sleep(0.01)
            for _ in range(20):  # the other three had every chance to get through
                await asyncio.sleep(0)
            held = in_flight
    finally:
        release.set()
        answers = await asyncio.gather(*calls, return_exceptions=True)
        await up.close()
    assert held == 2
    assert answers == [[jsonrpc.result_response(1, {})]] * 5
    assert most == 2
