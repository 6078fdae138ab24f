"""The `endpoint` event of a 2024-11-05 HTTP+SSE server, resolved and checked (proxy/upstream/sse.py),
and the configuration of such an upstream (proxy/config.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from proxy.config import load_settings
from proxy.upstream.sse import EndpointError, resolve_endpoint

SSE = "http://127.0.0.1:3001/sse"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ("/message?sessionId=abc", "http://127.0.0.1:3001/message?sessionId=abc"),
        ("message?sessionId=abc", "http://127.0.0.1:3001/message?sessionId=abc"),
        ("  /message?sessionId=abc\n", "http://127.0.0.1:3001/message?sessionId=abc"),
        ("http://127.0.0.1:3001/m", "http://127.0.0.1:3001/m"),
        ("HTTP://127.0.0.1:3001/m", "http://127.0.0.1:3001/m"),
    ],
)
def test_an_endpoint_is_resolved_against_the_sse_url(data: str, expected: str):
    assert resolve_endpoint(SSE, data) == expected


def test_a_nested_sse_url_resolves_a_relative_endpoint_beside_it():
    assert resolve_endpoint("https://h.example/mcp/sse", "messages/?s=1") == "https://h.example/mcp/messages/?s=1"
    assert resolve_endpoint("https://h.example/sse", "https://h.example:443/m") == "https://h.example:443/m"


@pytest.mark.parametrize(
    "data",
    [
        "http://elsewhere.example/message",
        "https://127.0.0.1:3001/message",  # another scheme
        "http://127.0.0.1:3002/message",  # another port
        "//evil.example/message",  # scheme-relative: another host
        "http://127.0.0.1:99999/message",  # no port at all
    ],
)
def test_an_endpoint_on_another_origin_is_refused(data: str):
    with pytest.raises(EndpointError, match="origin"):
        resolve_endpoint(SSE, data)


def test_an_empty_endpoint_is_refused():
    with pytest.raises(EndpointError, match="empty"):
        resolve_endpoint(SSE, "  ")


def test_sse_url_is_a_third_upstream_transport_of_the_legacy_era():
    settings = load_settings(None, **{"upstream.sse_url": SSE})
    assert settings.upstream.transport == "sse"
    assert settings.upstream.sse.max_sessions == 32
    assert settings.upstream.sse.endpoint_timeout_s == 10.0


@pytest.mark.parametrize(
    "overrides",
    [
        {"upstream.sse_url": SSE, "upstream.url": "http://127.0.0.1:3001/mcp"},
        {"upstream.sse_url": SSE, "upstream.command": "server --stdio"},
        {"upstream.sse_url": "ftp://127.0.0.1/sse"},
        {"upstream.sse_url": SSE, "upstream.era": "modern"},
        {"upstream.sse_url": SSE, "upstream.sse.max_sessions": 0},
    ],
)
def test_invalid_sse_upstream_settings_are_refused(overrides: dict[str, object]):
    with pytest.raises((ValidationError, ValueError)):
        load_settings(None, **overrides)
