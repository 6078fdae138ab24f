"""Requests written straight onto aiohttp's pooled connections (proxy/upstream/wire.py), against
aiohttp's server and against a server on a bare socket where a reply must be malformed or odd; the
same behaviour through ClientSession.request (`SessionRequests`, the fallback where the installed
aiohttp lacks the shape the first relies on)."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.upstream.wire import Requests, SessionRequests, Target

WAIT = 5.0
EVERY = {"Accept": "application/json, text/event-stream", "User-Agent": "test/1", "X-Static": "s"}


class Conversation:
    """One connection to the bare server: the requests it has read, and what to answer them."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def request(self) -> bytes | None:
        """The next request, head and body; None when the client closed the connection."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return head + await self.reader.readexactly(length)


Serve = Callable[[Conversation, int], Awaitable[None]]


def answering(raw: bytes, *, close: bool = False) -> Serve:
    """Answers a connection's first request with `raw`, then closes the connection (`close`: the
    end of a body without a length) or waits for the client to."""

    async def serve(conversation: Conversation, _: int) -> None:
        await conversation.request()
        conversation.writer.write(raw)
        await conversation.writer.drain()
        if not close:
            await conversation.request()

    return serve


@pytest.fixture
async def bare_server() -> AsyncIterator[Callable[[Serve], Awaitable[str]]]:
    """A server on a bare socket: `serve(conversation, n)` runs each connection, numbered from 0."""
    servers: list[asyncio.Server] = []
    handlers: set[asyncio.Task[None]] = set()

    async def start(serve: Serve) -> str:
        connections = 0

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            number, connections = connections, connections + 1
            task = asyncio.current_task()
            assert task is not None
            handlers.add(task)
            try:
                await serve(Conversation(reader, writer), number)
            finally:
                writer.close()
                handlers.discard(task)

        server = await asyncio.start_server(accepted, "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/mcp"

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()
    for task in list(handlers):
        task.cancel()


@pytest.fixture(params=[Requests, SessionRequests], ids=["pooled", "session"])
def make_requests(request: pytest.FixtureRequest) -> type[Requests] | type[SessionRequests]:
    """Each test runs on both ways of sending the upstream's requests."""
    made: type[Requests] | type[SessionRequests] = request.param
    return made


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    client = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
    yield client
    await client.close()


async def recording_server(aiohttp_server: Any) -> tuple[str, list[tuple[list[tuple[str, str]], bytes, Any]]]:
    """An aiohttp server that answers `{}` and records each request's headers, body and peer."""
    seen: list[tuple[list[tuple[str, str]], bytes, Any]] = []

    async def record(request: web.Request) -> web.Response:
        headers = sorted((name.lower(), value) for name, value in request.headers.items())
        peer = request.transport.get_extra_info("peername") if request.transport else None
        seen.append((headers, await request.read(), peer))
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/mcp", record)
    server = await aiohttp_server(app)
    return str(server.make_url("/mcp?tenant=a")), seen


@pytest.mark.parametrize(
    ("method", "body", "headers"),
    [
        (
            "POST",
            b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
            {"Content-Type": "application/json", "Mcp-Method": "ping"},
        ),
        ("GET", None, {"accept": "text/event-stream", "Mcp-Session-Id": "s1"}),  # replaces a default
        ("DELETE", None, {"x-static": "mine", "Authorization": "Bearer t"}),
        (
            "POST",
            b"{}",
            {
                "Content-Type": "application/json",
                "Mcp-Name": "caf=C3=A9",
                "Traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
            },
        ),
    ],
)
async def test_a_request_reaches_the_server_as_aiohttp_s_client_sends_it(
    make_requests: Any,
    aiohttp_server: Any,
    session: aiohttp.ClientSession,
    method: str,
    body: bytes | None,
    headers: dict[str, str],
) -> None:
    url, seen = await recording_server(aiohttp_server)
    async with asyncio.timeout(WAIT):
        reply = await make_requests(session, EVERY).send(method, Target(url), body, headers)
        assert (reply.status, await reply.content.read()) == (200, b"{}")
        merged = {name: value for name, value in EVERY.items() if name.lower() not in {n.lower() for n in headers}}
        async with session.request(method, url, data=body, headers={**merged, **headers}) as response:
            assert await response.read() == b"{}"
    ours, theirs = seen
    assert ours[:2] == theirs[:2]
    assert ("x-static", "s") in ours[0] or "x-static" in {n.lower() for n in headers}


async def test_a_line_break_in_a_header_is_refused_before_anything_is_sent(
    make_requests: Any, aiohttp_server: Any, session: aiohttp.ClientSession
) -> None:
    url, seen = await recording_server(aiohttp_server)
    requests = make_requests(session, EVERY)
    for headers in ({"Mcp-Name": "a\r\nX-Injected: 1"}, {"Mcp-Name": "a\nb"}, {"X-A\r\nB": "v"}):
        with pytest.raises(ValueError, match="line break"):
            await requests.send("POST", Target(url), b"{}", headers)
    async with asyncio.timeout(WAIT):
        reply = await requests.send("POST", Target(url), b"{}", {"Mcp-Name": "fine"})
        await reply.content.read()
    assert len(seen) == 1


async def test_a_reply_read_to_its_end_gives_its_connection_back_for_the_next_request(
    make_requests: Any, aiohttp_server: Any, session: aiohttp.ClientSession
) -> None:
    url, seen = await recording_server(aiohttp_server)
    requests = make_requests(session, EVERY)
    async with asyncio.timeout(WAIT):
        for _ in range(3):
            reply = await requests.send("POST", Target(url), b"{}", {})
            assert await reply.content.read() == b"{}"
            assert reply.closed  # given back at the body's end, before anyone closes it
            reply.close()  # nothing more to do
    assert len({peer for _, _, peer in seen}) == 1


async def test_closing_a_reply_before_its_end_closes_its_connection(
    make_requests: Any, aiohttp_server: Any, session: aiohttp.ClientSession
) -> None:
    """How a 2026-07-28 server learns that its request was cancelled: the connection closes."""
    disconnected = asyncio.Event()
    peers: list[Any] = []

    async def stream(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: {}\n\n")
        if len(peers) == 1:
            try:
                await asyncio.Event().wait()  # until the client goes
            finally:
                disconnected.set()
        return response

    app = web.Application()
    app.router.add_get("/mcp", stream)
    server = await aiohttp_server(app)
    url = str(server.make_url("/mcp"))
    requests = make_requests(session, EVERY)
    async with asyncio.timeout(WAIT):
        reply = await requests.send("GET", Target(url), None, {})
        assert await reply.content.readany() == b"data: {}\n\n"
        waiting = asyncio.ensure_future(reply.content.readany())
        await asyncio.sleep(0)
        reply.close()
        with pytest.raises(aiohttp.ClientConnectionError):
            await waiting
        await disconnected.wait()
        second = await requests.send("GET", Target(url), None, {})
        assert await second.content.read() == b"data: {}\n\n"
    assert peers[0] != peers[1]  # the closed connection was not given back


async def test_informational_replies_are_passed_over(
    make_requests: Any, bare_server: Any, session: aiohttp.ClientSession
) -> None:
    url = await bare_server(
        answering(
            b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        )
    )
    async with asyncio.timeout(WAIT):
        reply = await make_requests(session, EVERY).send("POST", Target(url), b"{}", {})
        assert reply.status == 200
        assert reply.headers["Content-Type"] == "application/json"
        assert await reply.content.read() == b"{}"


async def test_a_reply_without_a_length_is_read_to_the_end_of_its_connection(
    make_requests: Any, bare_server: Any, session: aiohttp.ClientSession
) -> None:
    url = await bare_server(answering(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"a": 1}', close=True))
    async with asyncio.timeout(WAIT):
        reply = await make_requests(session, EVERY).send("POST", Target(url), b"{}", {})
        assert reply.content_length is None
        assert await reply.content.read() == b'{"a": 1}'


async def test_a_reply_that_is_not_http_fails_as_a_client_error(
    make_requests: Any, bare_server: Any, session: aiohttp.ClientSession
) -> None:
    url = await bare_server(answering(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"))
    async with asyncio.timeout(WAIT):
        with pytest.raises(aiohttp.ClientResponseError):
            await make_requests(session, EVERY).send("POST", Target(url), b"{}", {})


@pytest.mark.parametrize(("method", "sent_again"), [("GET", True), ("DELETE", True), ("POST", False)])
async def test_a_request_on_a_connection_the_server_dropped_is_sent_again_once_only_when_idempotent(
    make_requests: Any, bare_server: Any, session: aiohttp.ClientSession, method: str, sent_again: bool
) -> None:
    """As aiohttp's client: the server closed a kept-alive connection as the request went on it."""
    received: list[int] = []
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"

    async def serve(conversation: Conversation, number: int) -> None:
        while await conversation.request() is not None:
            received.append(number)
            if number == 0 and len(received) == 2:
                return  # the second request on the first connection: dropped unanswered
            conversation.writer.write(answer)

    url = await bare_server(serve)
    requests = make_requests(session, EVERY)
    async with asyncio.timeout(WAIT):
        first = await requests.send(method, Target(url), b"{}" if method == "POST" else None, {})
        assert await first.content.read() == b"{}"
        if sent_again:
            second = await requests.send(method, Target(url), None, {})
            assert await second.content.read() == b"{}"
            assert received == [0, 0, 1]
        else:
            with pytest.raises(aiohttp.ServerDisconnectedError):
                await requests.send(method, Target(url), b"{}", {})
            assert received == [0, 0]


def test_a_target_is_an_http_url_with_its_path_and_query_and_host() -> None:
    target = Target("https://Example.com:8443/a/mcp?x=1")
    assert (target.path, target.host) == ("/a/mcp?x=1", "example.com:8443")
    assert Target("http://127.0.0.1/").path == "/"
    assert Target("http://[::1]:9/mcp").host == "[::1]:9"
    with pytest.raises(ValueError, match="not an http"):
        Target("ftp://example.com/mcp")


def _tls_contexts(tmp_path: Any) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a certificate for `localhost` from a throwaway authority, and a
    client context that trusts only that authority."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def certificate(subject: str, key: Any, issuer: str, signer: Any, ca: bool) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate("test authority", ca_key, "test authority", ca_key, True)
    leaf = certificate("localhost", key, "test authority", ca_key, False)
    pem = serialization.Encoding.PEM
    chain, key_file = tmp_path / "chain.pem", tmp_path / "key.pem"
    chain.write_bytes(leaf.public_bytes(pem))
    key_file.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(chain, key_file)
    client = ssl.create_default_context(cadata=ca.public_bytes(pem).decode())
    return server, client


async def test_an_https_upstream_is_reached_over_verified_tls(
    make_requests: Any, aiohttp_server: Any, tmp_path: Any
) -> None:
    """TLS is the connector's: the certificate is verified for the URL's host name (SNI included)."""
    server_context, client_context = _tls_contexts(tmp_path)

    async def answer(request: web.Request) -> web.Response:
        return web.json_response({"tls": request.secure})

    app = web.Application()
    app.router.add_post("/mcp", answer)
    server = await aiohttp_server(app, ssl=server_context)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context))
    try:
        requests = make_requests(session, EVERY)
        async with asyncio.timeout(WAIT):
            reply = await requests.send("POST", Target(f"https://localhost:{server.port}/mcp"), b"{}", {})
            assert (reply.status, await reply.content.read()) == (200, b'{"tls": true}')
            with pytest.raises(aiohttp.ClientConnectorCertificateError):  # the certificate names localhost only
                await requests.send("POST", Target(f"https://127.0.0.1:{server.port}/mcp"), b"{}", {})
    finally:
        await session.close()
