"""Hostile input against the running proxy, in front of real upstreams of both eras over HTTP and
stdio: generated requests across the envelope, `_meta`, headers, batch shapes, session ids,
`requestState`, `inputResponses`, encodings and raw bodies, sent byte by byte.

Every answer must hold the invariant of tests/support/answers.py; afterwards the proxy is alive,
serves a normal request, and its log holds no traceback. `HOSTILE_PROXY_EXAMPLES` (default 500)
sets how many requests each upstream gets.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.protocol.versions import LATEST_LEGACY, LATEST_MODERN
from tests.e2e.conftest import PROXY_LOGS, ProxyFactory, stdio_command
from tests.hostile import strategies as hs
from tests.support import legacy_client, modern_client, peers, tally
from tests.support.answers import assert_holds
from tests.support.mcp_client import Endpoint
from tests.support.raw_http_client import Reply, build, exchange

EXAMPLES = int(os.environ.get("HOSTILE_PROXY_EXAMPLES", "500"))
# Short bounds, so that a request the proxy rightly holds (an input round nobody answers) ends soon.
BOUNDS = {"upstream__request_timeout_s": "8", "input__round_timeout_s": "3", "input__park_timeout_s": "5"}
ACCEPT = "application/json, text/event-stream"
ELICITING = {"elicitation": {"form": {}}}  # what the modern requests of the fixture declare


@dataclass
class Target:
    name: str
    endpoint: Endpoint
    elicit_tool: str
    session: str | None = None
    request_state: str | None = None


def open_session(target: Target) -> str:
    return legacy_client.open_session(target.endpoint, {"elicitation": {}})


def input_required_state(target: Target) -> str | None:
    """A live requestState from the upstream's eliciting tool (legacy upstreams only)."""
    params = {"name": target.elicit_tool, "arguments": {"message": "name?"}}
    reply = modern_client.call(target.endpoint, 1, "tools/call", params, ELICITING)
    assert_holds(reply, "input_required")
    result = json.loads(reply.body).get("result", {}) if reply.content_type == "application/json" else {}
    state = result.get("requestState")
    return state if isinstance(state, str) else None


def healthy(target: Target) -> None:
    """The proxy still serves: a modern tools/list and a fresh legacy session both work.

    A server the hostile requests left broken may fail the first request that reaches it (the
    mcp==1.30.0 stdio server exits on the first message after a cancelled call that was waiting
    for an elicitation): that one gets -32010 and the next a new server process."""
    reply = modern_client.call(target.endpoint, 99, "tools/list", capabilities=ELICITING)
    if b'"code":-32010' in reply.body and b"exited" in reply.body:
        tally.note(f"hostile {target.name}: the upstream process exited; the proxy answered -32010 and started another")
        reply = modern_client.call(target.endpoint, 100, "tools/list", capabilities=ELICITING)
    assert reply.status == 200 and b'"tools"' in reply.body, reply
    session = open_session(target)
    listed = legacy_client.call(target.endpoint, session, 2, "tools/list")
    assert listed.status == 200 and b'"tools"' in listed.body, listed
    # The proxy's own lines (a stdio server's stderr, relayed as upstream_stderr, may hold its own).
    own = [
        line
        for line in PROXY_LOGS[target.endpoint.url].read_text(errors="replace").splitlines()
        if "upstream_stderr" not in line
    ]
    broken = [line for line in own if "Traceback" in line or '"level":"critical"' in line]
    assert not broken, "\n".join(broken[:3])


@pytest.fixture(scope="module")
def targets(start_proxy: ProxyFactory, fixture_modern: str, fixture_legacy: str) -> Iterator[dict[str, Target]]:
    with ExitStack() as stack:
        legacy_stdio = start_proxy(command=stdio_command(peers.mcp1_python(), "legacy_server.py"), **BOUNDS)
        urls = {
            "modern-http": (stack.enter_context(start_proxy(fixture_modern, **BOUNDS)), "test_elicitation"),
            "legacy-http": (stack.enter_context(start_proxy(fixture_legacy, **BOUNDS)), "test_elicitation"),
            "legacy-stdio": (stack.enter_context(legacy_stdio), "elicit"),
        }
        found = {name: Target(name, Endpoint(url, timeout=20.0), tool) for name, (url, tool) in urls.items()}
        for target in found.values():
            target.session = open_session(target)
            if target.name != "modern-http":
                target.request_state = input_required_state(target)
                assert target.request_state, f"{target.name}: no requestState to tamper with"
        yield found


# ---------------------------------------------------------------- what gets sent

header_values = st.one_of(
    hs.nasty_text.filter(lambda t: "\r" not in t and "\n" not in t).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"\xff\xfe", b"\x80abc", b"caf\xe9", b"x" * 9000, b"", b" ", b"\x7f"]),
    st.sampled_from([LATEST_MODERN, LATEST_LEGACY, "2024-11-05", "1999-01-01"]).map(str.encode),
)
header_names = st.sampled_from(
    [
        "Mcp-Protocol-Version",
        "Mcp-Session-Id",
        "Mcp-Method",
        "Mcp-Name",
        "Mcp-Param-City",
        "Authorization",
        "traceparent",
        "tracestate",
        "baggage",
        "Accept",
        "Content-Type",
        "Content-Encoding",
        "Origin",
        "Last-Event-ID",
        "X-Forwarded-For",
    ]
)


@dataclass
class Hostile:
    http_method: str
    body: bytes
    headers: list[tuple[str, bytes | str]]
    session: str  # none | valid | garbage
    state: str  # as sent | valid | tampered


@st.composite
def hostile_requests(draw: st.DrawFn) -> Hostile:
    value = draw(hs.bodies)
    style = draw(st.sampled_from(["modern", "legacy", "bare"]))
    headers: list[tuple[str, bytes | str]] = []
    if style != "bare":
        headers += [("Content-Type", "application/json"), ("Accept", ACCEPT)]
    if style == "modern" and isinstance(value, dict) and isinstance(value.get("method"), str):
        name = value.get("params", {}).get("name") if isinstance(value.get("params"), dict) else None
        headers += modern_client.routing_headers(
            value["method"], name if isinstance(name, str) else None, raw_name=True
        ).items()
    for _ in range(draw(st.integers(0, 3))):
        headers.append((draw(header_names), draw(header_values)))
    body = hs.encode(value)  # however deep it nests
    shape = draw(st.sampled_from(["json", "json", "json", "bytes", "gzip", "fake-gzip", "empty"]))
    if shape == "bytes":
        body = draw(
            st.one_of(
                st.binary(max_size=80),
                st.just(b'{"jsonrpc":"2.0","id":1,"method":"ping","n":12345678901234567890,"x":NaN}'),
            )
        )
    elif shape == "gzip":
        body = gzip.compress(body, mtime=0)  # no timestamp: the same draw, the same bytes
        headers.append(("Content-Encoding", "gzip"))
    elif shape == "fake-gzip":
        headers.append(("Content-Encoding", "gzip"))
    elif shape == "empty":
        body = b""
    return Hostile(
        draw(st.sampled_from(["POST"] * 12 + ["GET", "DELETE", "PUT", "OPTIONS"])),
        body,
        headers,
        draw(st.sampled_from(["none", "valid", "garbage"])),
        draw(st.sampled_from(["as sent", "valid", "tampered"])),
    )


def _with_state(body: bytes, token: str) -> bytes:
    """The body with its params.requestState replaced by `token`, when it is a request with params."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested past what json.loads reads
        return body
    if isinstance(value, dict) and isinstance(value.get("params"), dict):
        value["params"]["requestState"] = token
        return hs.encode(value)
    return body


def send(target: Target, hostile: Hostile) -> Reply | None:
    headers = list(hostile.headers)
    if hostile.session == "valid" and target.session:
        if hostile.http_method == "GET":
            return None  # a session's GET stream stays open by design: nothing to wait for
        headers.append(("Mcp-Session-Id", target.session))
    elif hostile.session == "garbage":
        headers.append(("Mcp-Session-Id", "forged-" + "A" * 40))
    body = hostile.body
    if hostile.state != "as sent" and target.request_state:
        token = target.request_state if hostile.state == "valid" else target.request_state[:-3] + "AAA"
        body = _with_state(body, token)
    if hostile.http_method != "POST":
        body = b""
    return exchange(target.endpoint.port, build(hostile.http_method, target.endpoint.path, headers, body))


hostile_settings = settings(
    max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


@pytest.mark.parametrize("name", ["modern-http", "legacy-http", "legacy-stdio"])
def test_every_hostile_request_gets_a_correct_answer_and_the_proxy_keeps_serving(
    targets: dict[str, Target], name: str
) -> None:
    target = targets[name]

    @hostile_settings
    @given(hostile_requests())
    def probe(hostile: Hostile) -> None:
        tally.count("hostile.proxy")
        tally.count(f"hostile.proxy.{name}")
        reply = send(target, hostile)
        if reply is not None:
            assert_holds(reply, f"{name}: {hostile}", hostile.http_method)
            if hostile.http_method == "DELETE" and hostile.session == "valid" and reply.status == 200:
                target.session = open_session(target)  # that ended it: the next ones get a live one

    probe()
    healthy(target)
