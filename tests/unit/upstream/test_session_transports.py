"""What the transports of a legacy upstream session put on every message and learn from the server
(proxy/upstream/session_transports.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from proxy.protocol.headers import PROTOCOL_VERSION_HEADER, SESSION_HEADER
from proxy.upstream.session_transports import HttpSessionTransport, StdioSessionTransport

AUTH = {"Authorization": "Bearer t"}


@dataclass
class Session:
    """A session as a transport sees it (CarriedSession)."""

    id: str | None = None
    version: str = ""
    auth_headers: dict[str, str] = field(default_factory=lambda: dict(AUTH))
    closed: bool = False
    push_channel: bool = False
    dispatched: list[dict[str, Any]] = field(default_factory=list)

    def dispatch(self, message: dict[str, Any]) -> None:
        self.dispatched.append(message)


@dataclass
class Headers:
    headers: dict[str, str]
    status: int = 200


class Upstream:
    """An HttpUpstream as far as a session transport holds one: headers and adopt never reach it."""

    name = "up"

    def __init__(self) -> None:
        self.exchanged: list[tuple[dict[str, Any], Mapping[str, str]]] = []

    def exchange(self, message: dict[str, Any], headers: Mapping[str, str]) -> str:
        self.exchanged.append((message, headers))
        return "the upstream's exchange"


def http(upstream: Upstream | None = None) -> HttpSessionTransport:
    return HttpSessionTransport(cast(Any, upstream or Upstream()))


def test_an_http_session_exchanges_through_its_upstream_as_it_is():
    upstream = Upstream()
    message = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert http(upstream).exchange(message, AUTH) == "the upstream's exchange"
    assert upstream.exchanged == [(message, AUTH)]


def test_before_initialize_an_http_session_sends_only_the_callers_credentials():
    assert http().headers(Session()) == AUTH


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("2024-11-05", {}),
        ("2025-03-26", {}),  # the version header did not exist before 2025-06-18
        ("2025-06-18", {PROTOCOL_VERSION_HEADER: "2025-06-18"}),
        ("2025-11-25", {PROTOCOL_VERSION_HEADER: "2025-11-25"}),
    ],
)
def test_an_http_session_sends_its_id_and_from_2025_06_18_its_version(version: str, expected: dict[str, str]):
    session = Session(id="s-1", version=version)
    assert http().headers(session) == {**AUTH, SESSION_HEADER: "s-1", **expected}


def test_an_http_session_learns_its_id_from_the_reply_to_initialize():
    session = Session()
    http().adopt(session, Headers({SESSION_HEADER: "s-9"}))
    assert session.id == "s-9"
    http().adopt(session, Headers({}))  # a server that keeps no sessions
    assert session.id is None


async def test_a_stdio_session_has_no_headers_and_its_stdout_carries_everything():
    transport = StdioSessionTransport(lambda *a, **k: None, "local", 1.0)  # no process is started
    session = Session()
    assert transport.name == "local"
    assert transport.headers(session) == {}
    assert await transport.open_push(session, 0.0) is True
