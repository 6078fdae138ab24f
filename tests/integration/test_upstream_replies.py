"""What the proxy does with upstream replies that are broken, invalid or merely unusual, on the
paths that relay them byte for byte (modern client and modern upstream; legacy client and legacy
upstream, in the upstream's own session) and on the translated ones.

The upstream here is `tests/support/raw_upstream.RawUpstream`, which writes exactly the bytes a test
scripts; the raw HTTP client's keep-alive `raw_exchange` (tests/support/raw_http_client.py) records
every byte and tells one reply from two.
docs/design.md §Errors: once a reply has started, the only honest ending is to end it.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from proxy.protocol import jsonrpc
from proxy.protocol.headers import PROTOCOL_VERSION_HEADER, SESSION_HEADER
from proxy.protocol.versions import LATEST_LEGACY
from tests.integration.conftest import MakeProxy, Proxy, closed_port_url, serve
from tests.support.fake_modern import Call, FakeModern, Outcome, Reply, complete
from tests.support.legacy_client import initialize_message
from tests.support.mcp_client import ACCEPT
from tests.support.modern_client import ModernClient, read_reply
from tests.support.raw_http_client import Reply as RawReply
from tests.support.raw_http_client import build, raw_exchange
from tests.support.raw_http_client import exchange as raw_http_exchange
from tests.support.raw_upstream import LAST_CHUNK, RawRequest, RawUpstream, chunk, head, sse, whole

WAIT = 5.0  # upper bound for anything a test waits for
SESSION = "upstream-session-1"
PROGRESS = jsonrpc.notification("notifications/progress", {"progressToken": "p", "progress": 1})


@pytest.fixture
async def raw() -> AsyncIterator[RawUpstream]:
    upstream = RawUpstream()
    await upstream.start()
    yield upstream
    await upstream.stop()


class Era:
    """One of the two byte-for-byte paths: who the client is, and what it posts."""

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def config(self) -> dict[str, Any]:
        return {"upstream.era": self.name}

    def request(self) -> tuple[bytes, dict[str, str]]:
        """A tools/call with id 7 (never cached, so relayed byte for byte) and its headers."""
        if self.name == "modern":
            peer = ModernClient(None)  # type: ignore[arg-type]  # only builds messages
            message = peer.message("tools/call", {"name": "slow", "arguments": {}}, id=7)
            return json.dumps(message).encode(), peer.headers(message)
        message = jsonrpc.request(7, "tools/call", {"name": "slow", "arguments": {}})
        headers = {
            "Accept": ACCEPT,
            "Content-Type": "application/json",
            SESSION_HEADER: SESSION,
            PROTOCOL_VERSION_HEADER: LATEST_LEGACY,
        }
        return json.dumps(message).encode(), headers


ERAS = [pytest.param(Era("modern"), id="modern"), pytest.param(Era("legacy"), id="legacy")]


async def exchange(proxy: Proxy, era: Era, *, until_close: bool = False) -> RawReply:
    body, headers = era.request()
    server = proxy.client.server
    return await raw_exchange(
        str(server.host), int(server.port or 0), body, headers, wait_s=WAIT, until_close=until_close
    )


def proxy_metadata(proxy: Proxy) -> str:
    """The metadata URL the proxy names in challenges: derived from the Host raw_exchange sends."""
    server = proxy.client.server
    return f"http://{server.host}:{server.port}/.well-known/oauth-protected-resource/mcp"


def one_reply(reply: RawReply) -> None:
    """Exactly one HTTP response, ended as its framing says, and then the connection closed."""
    assert reply.status == 200, reply.head
    assert b"HTTP/1.1" not in reply.body + reply.after, reply.data
    assert reply.complete, reply.data
    assert reply.closed, f"the connection was left open after {reply.data[-200:]!r}"


# ---------------------------------------------------------------------------- a started reply ends, once


def broken_stream(*events: bytes, tail: bytes = b'data: {"jsonrpc": "2.0", "id": 7, "res') -> Any:
    """An SSE reply whose connection drops in the middle of an event, after `events`."""

    async def script(request: RawRequest, writer: asyncio.StreamWriter) -> None:
        writer.write(head(200, "text/event-stream"))
        for event in events:
            writer.write(chunk(event))
        writer.write(chunk(tail))  # then the connection closes, without the last chunk

    return script


@pytest.mark.parametrize("era", ERAS)
async def test_a_stream_the_upstream_breaks_ends_with_an_error_event_and_a_closed_connection(
    make_proxy: MakeProxy, raw: RawUpstream, era: Era
) -> None:
    """The broken reply had started (a progress notification went out): the proxy used to write a
    second HTTP response, a 500, inside the chunked body, and leave the connection open."""
    proxy = await make_proxy(upstream_url=raw.url, **era.config)
    raw.script = broken_stream(sse(PROGRESS))
    async with asyncio.timeout(WAIT):
        reply = await exchange(proxy, era, until_close=True)
    one_reply(reply)
    assert reply.events[0] == PROGRESS
    [final] = reply.events[1:]  # the half event never reaches the client
    assert final["id"] == 7 and final["error"]["code"] == jsonrpc.UPSTREAM_UNAVAILABLE, final
    assert b"event: message\n" in reply.body
    assert reply.body.endswith(b"\n\n")


@pytest.mark.parametrize("era", ERAS)
async def test_a_stream_that_breaks_after_its_response_gets_no_second_answer(
    make_proxy: MakeProxy, raw: RawUpstream, era: Era
) -> None:
    proxy = await make_proxy(upstream_url=raw.url, **era.config)
    answer = jsonrpc.result_response(7, {"content": []})
    raw.script = broken_stream(sse(answer), tail=b": keep")
    async with asyncio.timeout(WAIT):
        reply = await exchange(proxy, era, until_close=True)
    one_reply(reply)
    assert reply.events == [answer]


@pytest.mark.parametrize("era", ERAS)
async def test_the_request_timeout_in_the_middle_of_a_stream_ends_it_with_a_timeout_error(
    make_proxy: MakeProxy, raw: RawUpstream, era: Era
) -> None:
    """The timeout used to add a whole `200 ... -32011` response inside the started body; a
    keep-alive client then waited for the rest of the first one until its own timeout."""
    proxy = await make_proxy(upstream_url=raw.url, **{"upstream.request_timeout_s": 0.3, **era.config})

    async def hang_after_progress(request: RawRequest, writer: asyncio.StreamWriter) -> None:
        writer.write(head(200, "text/event-stream") + chunk(sse(PROGRESS)))
        await writer.drain()
        await raw.release.wait()

    raw.script = hang_after_progress
    async with asyncio.timeout(WAIT):
        reply = await exchange(proxy, era, until_close=True)
    one_reply(reply)
    assert reply.events[0] == PROGRESS
    [final] = reply.events[1:]
    assert final["id"] == 7 and final["error"]["code"] == jsonrpc.UPSTREAM_TIMEOUT, final


async def test_a_legacy_stream_that_ends_before_its_answer_but_can_be_resumed_ends_as_it_came(
    make_proxy: MakeProxy, raw: RawUpstream
) -> None:
    """A legacy server may close a POST's stream once it has sent an event id: the client resumes
    it with Last-Event-ID (2025-11-25)."""
    proxy = await make_proxy(upstream_url=raw.url, **{"upstream.era": "legacy"})
    stream = b"id: e1\nretry: 100\ndata: \n\n" + sse(PROGRESS)
    raw.script = whole(200, "text/event-stream", stream)
    async with asyncio.timeout(WAIT):
        reply = await exchange(proxy, Era("legacy"))
    assert reply.status == 200 and reply.complete and reply.body == stream


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize(
    ("stream", "says"),
    [
        pytest.param(sse(PROGRESS), "without a reply", id="no-event-id"),
        pytest.param(b"id: e1\ndata: \n\n" + b'data: {"jsonrpc": "2.0", "id": ', "middle of an event", id="cut"),
    ],
)
async def test_a_stream_that_ends_cleanly_but_cannot_be_resumed_ends_with_an_error(
    make_proxy: MakeProxy, raw: RawUpstream, era: Era, stream: bytes, says: str
) -> None:
    """Without an event id a legacy client has nothing to resume from; an event cut in half is a
    broken stream whatever the HTTP framing says."""
    proxy = await make_proxy(upstream_url=raw.url, **era.config)
    raw.script = whole(200, "text/event-stream", stream)
    async with asyncio.timeout(WAIT):
        reply = await exchange(proxy, era, until_close=True)
    one_reply(reply)
    final = reply.events[-1]
    assert final["id"] == 7 and final["error"]["code"] == jsonrpc.UPSTREAM_UNAVAILABLE, final
    assert says in final["error"]["message"]


# ---------------------------------------------------------------------------- replies that are no answer are refused


HTML_PAGE = (
    b"<!DOCTYPE html><html><head><title>502 Bad Gateway</title><style>body{font:14px sans-serif}</style>"
    b"</head><body><h1>Bad Gateway</h1><p>The upstream server is unavailable."
    + b" Please try again later." * 200
    + b"</p></body></html>"
)


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize(
    ("script", "code", "says"),
    [
        pytest.param(whole(502, "text/html", HTML_PAGE), jsonrpc.UPSTREAM_UNAVAILABLE, "502", id="html-502"),
        pytest.param(whole(200, "application/json", b"{not json"), jsonrpc.UPSTREAM_INVALID, "JSON", id="not-json"),
        pytest.param(whole(200, "application/json", b'{"hello": 1}'), jsonrpc.UPSTREAM_INVALID, "JSON-RPC", id="rpc"),
        pytest.param(whole(200, "application/json", b""), jsonrpc.UPSTREAM_INVALID, "no reply", id="empty-200"),
        pytest.param(
            whole(200, "application/json", json.dumps(jsonrpc.result_response(8, {})).encode()),
            jsonrpc.UPSTREAM_INVALID,
            "another",
            id="another-id",
        ),
        pytest.param(whole(200, "text/plain", b"OK"), jsonrpc.UPSTREAM_INVALID, "text/plain", id="text-200"),
        pytest.param(whole(500, None, b""), jsonrpc.UPSTREAM_UNAVAILABLE, "500", id="bare-500"),
        pytest.param(
            whole(200, "text/event-stream", b"data: {not json\n\n"), jsonrpc.UPSTREAM_INVALID, "JSON", id="sse-not-json"
        ),
        pytest.param(
            whole(200, "text/event-stream", sse(jsonrpc.result_response(8, {}))),
            jsonrpc.UPSTREAM_INVALID,
            "another",
            id="sse-another-id",
        ),
    ],
)
async def test_an_invalid_upstream_reply_becomes_a_short_json_rpc_error(
    make_proxy: MakeProxy, raw: RawUpstream, era: Era, script: Any, code: int, says: str
) -> None:
    proxy = await make_proxy(upstream_url=raw.url, **era.config)
    raw.script = script
    async with asyncio.timeout(WAIT):
        reply = await exchange(proxy, era)
    assert reply.status == 200, reply.head
    if "text/event-stream" in reply.head:
        [message] = reply.events
    else:
        assert "application/json" in reply.head.lower(), reply.head
        message = json.loads(reply.body)
    assert message["id"] == 7
    error = message["error"]
    assert error["code"] == code, error
    assert says in error["message"], error
    assert len(json.dumps(error)) < 400 and "<" not in json.dumps(error), error


@pytest.mark.parametrize("era", ERAS)
async def test_a_truncated_upstream_body_is_upstream_unavailable(
    make_proxy: MakeProxy, raw: RawUpstream, era: Era
) -> None:
    """It was a 500 with -32603, as if the proxy had failed."""
    proxy = await make_proxy(upstream_url=raw.url, **era.config)
    body = json.dumps(jsonrpc.result_response(7, {"content": [{"type": "text", "text": "x" * 100}]})).encode()

    async def truncated(request: RawRequest, writer: asyncio.StreamWriter) -> None:
        writer.write(head(200, "application/json", length=len(body)) + body[:50])

    raw.script = truncated
    async with asyncio.timeout(WAIT):
        reply = await exchange(proxy, era)
    assert reply.status == 200, reply.head
    error = json.loads(reply.body)["error"]
    assert error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE, error


@pytest.mark.parametrize("era", ERAS)
async def test_valid_replies_still_pass_through_unchanged(make_proxy: MakeProxy, raw: RawUpstream, era: Era) -> None:
    proxy = await make_proxy(upstream_url=raw.url, **era.config)
    body = b'{"jsonrpc":"2.0","id":7,"result":{"content":[],"unknown":{"kept":true}}}'
    raw.script = whole(200, "application/json", body)
    async with asyncio.timeout(WAIT):
        plain = await exchange(proxy, era)
    assert plain.status == 200 and plain.body == body
    events = sse(PROGRESS) + b": keep-alive\n\n" + b"id: e1\ndata: " + body + b"\n\n"
    raw.script = whole(200, "text/event-stream", events)
    async with asyncio.timeout(WAIT):
        streamed = await exchange(proxy, era)
    assert streamed.status == 200 and streamed.body == events


@pytest.mark.parametrize("era", ERAS)
async def test_a_header_whose_bytes_are_not_utf8_reaches_the_upstream_as_the_client_sent_it(
    make_proxy: MakeProxy, raw: RawUpstream, era: Era
) -> None:
    """A header the proxy passes on (`Mcp-*`) whose bytes are not UTF-8 (obs-text, RFC 9110
    §5.5) goes upstream byte for byte: not dropped, not altered, not a 500."""
    proxy = await make_proxy(upstream_url=raw.url, **era.config)
    answer = b'{"jsonrpc":"2.0","id":7,"result":{"content":[]}}'
    raw.script = whole(200, "application/json", answer)
    body, headers = era.request()
    value = b"caf\xe9 \x80\xff"
    server = proxy.client.server
    request = build(
        "POST", "/mcp", [*headers.items(), ("Mcp-Param-City", value)], body, host=f"{server.host}:{server.port}"
    )
    async with asyncio.timeout(WAIT):
        reply = await asyncio.to_thread(raw_http_exchange, int(server.port or 0), request, timeout=WAIT)
    assert (reply.status, reply.body) == (200, answer), reply.head
    [seen] = raw.requests
    assert seen.headers["mcp-param-city"].encode("latin-1") == value  # RawUpstream reads heads as latin-1


@pytest.mark.parametrize("era", ERAS)
async def test_credentials_in_the_upstream_url_go_with_every_request_as_basic_authorization(
    make_proxy: MakeProxy, raw: RawUpstream, era: Era
) -> None:
    """`upstream.url` may carry a user and password (hidden in --check-config): each request
    carries them as Basic credentials, over any other Authorization, and they are not in the path."""
    url = raw.url.replace("http://", "http://proxy-user:p%40ss@")
    proxy = await make_proxy(upstream_url=url, **era.config)
    answer = b'{"jsonrpc":"2.0","id":7,"result":{"content":[]}}'
    raw.script = whole(200, "application/json", answer)
    async with asyncio.timeout(WAIT):
        reply = await exchange(proxy, era)
    assert (reply.status, reply.body) == (200, answer), reply.head
    expected = "Basic " + base64.b64encode(b"proxy-user:p@ss").decode()
    assert raw.requests and all(seen.headers["authorization"] == expected for seen in raw.requests)
    assert all(seen.path == "/mcp" for seen in raw.requests)


@pytest.mark.parametrize("era", ERAS)
async def test_a_notification_accepted_with_202_stays_a_202(make_proxy: MakeProxy, raw: RawUpstream, era: Era) -> None:
    proxy = await make_proxy(upstream_url=raw.url, **era.config)
    raw.script = whole(202, None, b"")
    _, headers = era.request()
    server = proxy.client.server
    note = json.dumps(jsonrpc.notification("notifications/cancelled", {"requestId": 1})).encode()
    async with asyncio.timeout(WAIT):
        reply = await raw_exchange(str(server.host), int(server.port or 0), note, headers, wait_s=WAIT)
    if era.name == "modern":
        assert reply.status == 202 and raw.requests == []  # not forwarded at all
    else:
        assert reply.status == 202 and len(raw.requests) == 1


@pytest.mark.parametrize("era", ERAS)
async def test_a_401_with_www_authenticate_is_relayed_as_it_came(
    make_proxy: MakeProxy, raw: RawUpstream, era: Era
) -> None:
    """...as it came, but for `resource_metadata`: the proxy's metadata, not the upstream's
    (tests/integration/test_oauth_discovery.py covers the rewriting)."""
    proxy = await make_proxy(upstream_url=raw.url, **era.config)
    body = b'{"error": "invalid_token"}'
    challenge = 'Bearer error="invalid_token", resource_metadata="http://10.0.0.9/.well-known/oauth-protected-resource"'
    raw.script = whole(401, "application/json", body, extra=f"WWW-Authenticate: {challenge}")
    async with asyncio.timeout(WAIT):
        reply = await exchange(proxy, era)
    assert reply.status == 401 and reply.body == body
    relayed = 'Bearer error="invalid_token", resource_metadata="' + proxy_metadata(proxy) + '"'
    assert f"WWW-Authenticate: {relayed}" in reply.head.split("\r\n")


@pytest.mark.parametrize("era", ERAS)
async def test_a_401_with_a_login_page_keeps_its_status_and_challenge_and_loses_the_page(
    make_proxy: MakeProxy, raw: RawUpstream, era: Era
) -> None:
    proxy = await make_proxy(upstream_url=raw.url, **era.config)
    challenge = 'Bearer realm="mcp"'
    raw.script = whole(401, "text/html", b"<html><title>Sign in</title></html>", extra=f"WWW-Authenticate: {challenge}")
    async with asyncio.timeout(WAIT):
        reply = await exchange(proxy, era)
    relayed = f'Bearer resource_metadata="{proxy_metadata(proxy)}", realm="mcp"'
    assert reply.status == 401 and f"www-authenticate: {relayed}".lower() in reply.head.lower()
    message = json.loads(reply.body)
    assert message["id"] == 7 and message["error"]["code"] == jsonrpc.INVALID_REQUEST
    assert message["error"]["message"] == "upstream refused the credentials (HTTP 401)"


async def test_a_session_404_with_a_json_rpc_body_is_relayed_as_it_came(
    make_proxy: MakeProxy, raw: RawUpstream
) -> None:
    proxy = await make_proxy(upstream_url=raw.url, **{"upstream.era": "legacy"})
    body = b'{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"},"id":null}'
    raw.script = whole(404, "application/json", body)
    async with asyncio.timeout(WAIT):
        reply = await exchange(proxy, Era("legacy"))
    assert reply.status == 404 and reply.body == body


async def test_a_session_404_without_a_json_body_keeps_its_status(make_proxy: MakeProxy, raw: RawUpstream) -> None:
    """A legacy client reads a 404 to a request in its session as the session's end, whatever the body."""
    proxy = await make_proxy(upstream_url=raw.url, **{"upstream.era": "legacy"})
    raw.script = whole(404, "text/html", b"<html><body><h1>Not Found</h1></body></html>")
    async with asyncio.timeout(WAIT):
        reply = await exchange(proxy, Era("legacy"))
    assert reply.status == 404
    error = json.loads(reply.body)["error"]
    assert "404" in error["message"] and "<" not in error["message"]


async def test_a_get_stream_refused_with_a_page_keeps_its_status_and_loses_the_page(
    make_proxy: MakeProxy, raw: RawUpstream
) -> None:
    """A 405 to a GET says the server offers no stream: the client must still see the 405."""
    proxy = await make_proxy(upstream_url=raw.url, **{"upstream.era": "legacy"})
    raw.script = whole(405, "text/html", b"<title>405 Method Not Allowed</title>", extra="Allow: POST, DELETE")
    headers = {"Accept": "text/event-stream", SESSION_HEADER: SESSION, PROTOCOL_VERSION_HEADER: LATEST_LEGACY}
    async with asyncio.timeout(WAIT):
        response = await proxy.client.get("/mcp", headers=headers)
        message = json.loads(await response.read())
    assert response.status == 405 and response.headers["Allow"] == "POST, DELETE"
    assert message["error"]["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    assert message["error"]["message"] == "upstream 'fake-modern-upstream' answered HTTP 405: 405 Method Not Allowed"
    assert raw.requests[0].method == "GET" and raw.requests[0].headers[SESSION_HEADER.lower()] == SESSION


async def test_a_translated_request_quotes_an_html_error_page_by_its_title(proxy: Proxy, fake: FakeModern) -> None:
    """The message quoted the first 200 characters of the page's markup."""

    async def bad_gateway(call: Call) -> Outcome:
        return Reply(502, HTML_PAGE, "text/html")

    fake.handlers["tools/call"] = bad_gateway
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        reply = await peer.request("tools/call", {"name": "x", "arguments": {}})
    assert reply.error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    assert reply.error["message"] == "upstream 'fake-modern-upstream' answered HTTP 502: 502 Bad Gateway"


@pytest.mark.parametrize(
    "era",
    [
        pytest.param("auto", id="detected-legacy-relayed"),  # detection takes a page for a legacy server
        pytest.param("modern", id="configured-modern-translated"),  # answered from server/discover
    ],
)
async def test_a_legacy_initialize_in_front_of_a_server_that_is_not_mcp_is_a_short_json_rpc_error(
    make_proxy: MakeProxy, raw: RawUpstream, era: str
) -> None:
    """Relayed byte for byte, the initialize got the HTML page itself."""
    proxy = await make_proxy(upstream_url=raw.url, **{"upstream.era": era})
    raw.script = whole(404, "text/html; charset=utf-8", HTML_PAGE.replace(b"502 Bad Gateway", b"404 Not Found"))
    async with asyncio.timeout(WAIT):
        response = await proxy.client.post("/mcp", json=initialize_message(), headers={"Accept": ACCEPT})
        body = await response.read()
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("application/json")
    assert SESSION_HEADER not in response.headers
    message = json.loads(body)
    assert message["id"] == 0
    assert message["error"]["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
    assert message["error"]["message"] == "upstream 'fake-modern-upstream' answered HTTP 404: 404 Not Found"


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(jsonrpc.result_response("someone-else", {"resultType": "complete", "tools": []}), id="result"),
        pytest.param(jsonrpc.error_response("someone-else", -32603, "not yours"), id="error"),
    ],
)
async def test_a_cacheable_request_answered_under_another_id_is_upstream_invalid(
    proxy: Proxy, fake: FakeModern, answer: Any
) -> None:
    """Relayed message by message (for the cache): the reply used to be taken whatever its id,
    and given the client's."""

    async def elsewhere(call: Call) -> Outcome:
        return answer

    fake.handlers["tools/list"] = elsewhere
    async with asyncio.timeout(WAIT):
        reply = await ModernClient(proxy.client).request("tools/list")
    assert reply.status == 200
    assert reply.error["code"] == jsonrpc.UPSTREAM_INVALID
    assert "another request" in reply.error["message"]


# ---------------------------------------------------------------------------- whole replies are read whole


async def test_a_reply_over_64_kib_through_a_modern_upstream_reaches_the_legacy_client(
    proxy: Proxy, fake: FakeModern
) -> None:
    """A prompts/get with a 70 000-character argument, echoed: the reply was read in one 64 KiB
    read and refused as not JSON."""
    argument = "a" * 70_000

    async def echo(call: Call) -> Outcome:
        text = call.params["arguments"]["text"]
        return complete(messages=[{"role": "user", "content": {"type": "text", "text": text}}])

    fake.handlers["prompts/get"] = echo
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        reply = await peer.request("prompts/get", {"name": "echo", "arguments": {"text": argument}})
    assert reply.result["messages"][0]["content"]["text"] == argument


async def test_a_reply_over_the_configured_bound_is_upstream_invalid_naming_the_bound(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    proxy = await make_proxy(**{"upstream.max_reply_bytes": 10_000})

    async def big(call: Call) -> Outcome:
        return complete(messages=[{"role": "user", "content": {"type": "text", "text": "b" * 20_000}}])

    fake.handlers["prompts/get"] = big
    async with asyncio.timeout(WAIT):
        peer = await proxy.connect()
        reply = await peer.request("prompts/get", {"name": "big"})
    assert reply.error["code"] == jsonrpc.UPSTREAM_INVALID
    assert "upstream.max_reply_bytes" in reply.error["message"] and "10000" in reply.error["message"]


@pytest.mark.parametrize("era", ERAS)
async def test_a_byte_for_byte_reply_over_the_bound_is_upstream_invalid(
    make_proxy: MakeProxy, raw: RawUpstream, era: Era
) -> None:
    proxy = await make_proxy(upstream_url=raw.url, **{"upstream.max_reply_bytes": 1000, **era.config})
    body = json.dumps(jsonrpc.result_response(7, {"content": [{"type": "text", "text": "b" * 2000}]})).encode()
    raw.script = whole(200, "application/json", body)
    async with asyncio.timeout(WAIT):
        reply = await exchange(proxy, era)
    error = json.loads(reply.body)["error"]
    assert error["code"] == jsonrpc.UPSTREAM_INVALID and "upstream.max_reply_bytes" in error["message"]


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize("size", [990, 2000], ids=["within", "over"])
async def test_a_chunked_reply_that_arrives_whole_is_held_to_the_bound_too(
    make_proxy: MakeProxy, raw: RawUpstream, era: Era, size: int
) -> None:
    """No Content-Length to refuse it by, and all of it there at once (read without a wait)."""
    proxy = await make_proxy(upstream_url=raw.url, **{"upstream.max_reply_bytes": 1000, **era.config})
    answer = jsonrpc.result_response(7, {"content": [{"type": "text", "text": ""}]})
    padding = size - len(json.dumps(answer).encode())
    answer["result"]["content"][0]["text"] = "b" * padding
    body = json.dumps(answer).encode()
    assert len(body) == size

    async def script(request: RawRequest, writer: asyncio.StreamWriter) -> None:
        writer.write(head(200, "application/json") + chunk(body) + LAST_CHUNK)

    raw.script = script
    async with asyncio.timeout(WAIT):
        reply = await exchange(proxy, era)
    if size <= 1000:
        assert json.loads(reply.body) == answer
    else:
        error = json.loads(reply.body)["error"]
        assert error["code"] == jsonrpc.UPSTREAM_INVALID and "upstream.max_reply_bytes" in error["message"]


# ---------------------------------------------------------------------------- an upstream that cannot be reached


async def test_an_unreachable_upstream_is_named_by_host_and_port_not_by_tls_defaults(make_proxy: MakeProxy) -> None:
    url = closed_port_url()
    port = url.split(":")[2].split("/")[0]
    proxy = await make_proxy(upstream_url=url)
    peer = ModernClient(proxy.client)
    async with asyncio.timeout(WAIT):
        translated = await proxy.client.post("/mcp", json=initialize_message(), headers={"Accept": ACCEPT})
        initialize_error = json.loads(await translated.read())["error"]
        message, response = await peer.send("tools/call", {"name": "x", "arguments": {}})
        relayed = await read_reply(response, message)
    for error in (initialize_error, relayed.error):
        assert error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
        assert f"127.0.0.1:{port}" in error["message"], error
        assert "ssl" not in error["message"] and "refused" in error["message"].lower(), error


@pytest.mark.parametrize("era", ERAS)
async def test_a_whole_reply_that_never_comes_ends_at_the_request_timeout(
    make_proxy: MakeProxy, raw: RawUpstream, era: Era
) -> None:
    """No head at all: the request's deadline ends the exchange, and the client gets -32011."""
    proxy = await make_proxy(upstream_url=raw.url, **{"upstream.request_timeout_s": 0.3, **era.config})

    async def hang(request: RawRequest, writer: asyncio.StreamWriter) -> None:
        await raw.release.wait()

    raw.script = hang
    async with asyncio.timeout(WAIT):
        reply = await exchange(proxy, era)
    error = json.loads(reply.body)
    assert error["id"] == 7 and error["error"]["code"] == jsonrpc.UPSTREAM_TIMEOUT, reply.data


# ---------------------------------------------------------------------------- a client that leaves once answered


def call_outcomes(text: str) -> list[str]:
    """The outcomes `requests_total` has counted tools/call under so far."""
    return [
        dict(labels)["outcome"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "mcp_era_proxy_requests_total"
        for labels in [sample.labels]
        if labels.get("method") == "tools/call" and sample.value > 0
    ]


@pytest.mark.parametrize("era", ERAS)
async def test_a_client_that_leaves_once_answered_while_the_upstream_stream_goes_on_had_its_reply(
    make_proxy: MakeProxy, raw: RawUpstream, era: Era
) -> None:
    """The upstream's stream goes on after the answer (it may close it late): a client that closes
    the connection once it has its answer cancels the relay, but the request was answered (ok, not
    a 499)."""
    proxy = await make_proxy(upstream_url=raw.url, **era.config)
    ended = asyncio.Event()

    async def answered_then_open(request: RawRequest, writer: asyncio.StreamWriter) -> None:
        writer.write(head(200, "text/event-stream"))
        writer.write(chunk(sse(jsonrpc.result_response(7, {"content": []}))))
        await writer.drain()
        await ended.wait()  # the stream's end, not yet

    raw.script = answered_then_open
    body, headers = era.request()
    server = proxy.client.server
    reader, writer = await asyncio.open_connection(str(server.host), int(server.port or 0))
    try:
        writer.write(build("POST", "/mcp", list(headers.items()), body, host=f"{server.host}:{server.port}"))
        seen = b""
        async with asyncio.timeout(WAIT):
            while b'"id": 7' not in seen:
                data = await reader.read(4096)
                assert data, f"the proxy closed the connection after {seen!r}"
                seen += data
    finally:
        writer.close()  # the client has its answer, and goes
    try:
        async with asyncio.timeout(WAIT):
            # Polled within the bound: the handler ends once the proxy sees the close.
            while not (outcomes := call_outcomes(await (await proxy.client.get("/metrics")).text())):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
    finally:
        ended.set()
    assert outcomes == ["ok"]


# ---------------------------------------------------------------------------- cookies an upstream sets


async def test_a_cookie_the_upstream_sets_never_goes_with_a_later_request(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    """The upstream client keeps no cookies: one that a reply to one caller set would otherwise go
    with every later request, whoever made it. Clients' own cookies never go upstream either, so a
    cookie the upstream sets has nobody to go back to. The upstream is named `localhost`: a client
    cookie jar refuses cookies from an IP address anyway, so on 127.0.0.1 the test could not fail."""
    assert fake.url is not None
    proxy = await make_proxy(upstream_url=fake.url.replace("127.0.0.1", "localhost"))

    async def sets_a_cookie(call: Call) -> Outcome:
        result = jsonrpc.result_response(call.id, complete(content=[]))
        return Reply(body=result, headers={"Set-Cookie": f"sid=of-call-{call.id}; Path=/"})

    fake.handlers["tools/call"] = sets_a_cookie
    modern = ModernClient(proxy.client)
    async with asyncio.timeout(WAIT):
        for _ in range(2):  # relayed byte for byte
            assert (await modern.request("tools/call", {"name": "x", "arguments": {}})).status == 200
        legacy = await proxy.connect()
        for _ in range(2):  # translated
            await legacy.request("tools/call", {"name": "x", "arguments": {}})
    calls = fake.calls_of("tools/call")
    assert len(calls) == 4
    assert [call.headers.get("Cookie") for call in calls] == [None] * 4


# ---------------------------------------------------------------------------- redirects


@pytest.fixture
async def redirecting(aiohttp_server: Any) -> AsyncIterator[tuple[FakeModern, str]]:
    """A modern server at /mcp whose /old answers every request with 307 to /mcp (its own origin)."""
    fake = FakeModern()

    async def moved(request: web.Request) -> web.StreamResponse:
        await request.read()
        raise web.HTTPTemporaryRedirect("/mcp")

    fake.app.router.add_route("*", "/old", moved)
    server = await serve(aiohttp_server, fake.app)
    fake.url = str(server.make_url("/mcp"))
    yield fake, str(server.make_url("/old"))


async def test_a_redirect_to_the_upstreams_own_origin_is_followed_with_the_request_whole(
    make_proxy: MakeProxy, redirecting: tuple[FakeModern, str]
) -> None:
    """As a server mounted at /mcp/ answers /mcp (Starlette's trailing-slash redirect): a 307 or 308
    keeps the method and the body, on both the byte path and the translated one."""
    fake, old = redirecting

    async def answered(call: Call) -> Outcome:
        return complete(content=[{"type": "text", "text": f"at {call.request.path}"}])

    fake.handlers["tools/call"] = answered
    proxy = await make_proxy(upstream_url=old, **{"upstream.headers": {"X-Api-Key": "k"}})
    params = {"name": "x", "arguments": {}}
    async with asyncio.timeout(WAIT):
        relayed = await ModernClient(proxy.client).request("tools/call", params)
        legacy = await proxy.connect()
        translated = await legacy.request("tools/call", params)
    for result in (relayed.result, translated.result):
        assert result["content"] == [{"type": "text", "text": "at /mcp"}], result
    assert [call.headers.get("X-Api-Key") for call in fake.calls_of("tools/call")] == ["k", "k"]


async def test_a_redirect_to_another_origin_is_refused_and_nothing_goes_there(
    make_proxy: MakeProxy, aiohttp_server: Any, fake: FakeModern
) -> None:
    """Each request carries upstream.headers (the proxy's own credentials) and the caller's message:
    neither goes to a host the operator did not name. aiohttp drops only Authorization and Cookie
    on such a redirect."""
    assert fake.url is not None

    async def elsewhere(request: web.Request) -> web.StreamResponse:
        await request.read()
        raise web.HTTPTemporaryRedirect(fake.url)  # another port: another origin

    app = web.Application()
    app.router.add_route("*", "/mcp", elsewhere)
    server = await serve(aiohttp_server, app)
    proxy = await make_proxy(upstream_url=str(server.make_url("/mcp")), **{"upstream.headers": {"X-Api-Key": "k"}})
    async with asyncio.timeout(WAIT):
        reply = await ModernClient(proxy.client).request("tools/call", {"name": "x", "arguments": {}})
        translated = await proxy.client.post("/mcp", json=initialize_message(), headers={"Accept": ACCEPT})
        initialize_error = json.loads(await translated.read())["error"]
    assert fake.calls == []
    for error in (reply.error, initialize_error):
        assert error["code"] == jsonrpc.UPSTREAM_UNAVAILABLE, error
        assert "redirected" in error["message"] and fake.url.split("/mcp")[0] in error["message"], error


@pytest.mark.parametrize(
    ("status", "location", "code", "says"),
    [
        (307, "/mcp", jsonrpc.UPSTREAM_INVALID, "more than 5 times"),  # to itself, round and round
        (308, None, jsonrpc.UPSTREAM_UNAVAILABLE, "answered HTTP 308"),  # nowhere to go
        (301, "/elsewhere", jsonrpc.UPSTREAM_UNAVAILABLE, "answered HTTP 301"),  # a POST would lose its body
    ],
)
async def test_a_redirect_that_leads_nowhere_is_the_clients_error_naming_it(
    make_proxy: MakeProxy, aiohttp_server: Any, status: int, location: str | None, code: int, says: str
) -> None:
    hits: list[str] = []

    async def redirect(request: web.Request) -> web.StreamResponse:
        hits.append(request.path)
        await request.read()
        return web.Response(status=status, headers={"Location": location} if location else {})

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", redirect)
    server = await serve(aiohttp_server, app)
    proxy = await make_proxy(upstream_url=str(server.make_url("/mcp")))
    async with asyncio.timeout(WAIT):
        reply = await ModernClient(proxy.client).request("tools/call", {"name": "x", "arguments": {}})
    assert reply.error["code"] == code and says in reply.error["message"], reply.error
    assert hits == ["/mcp"] * (6 if status == 307 else 1)
