"""What of a client's request goes upstream (proxy/downstream/access.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from proxy.config import load_settings
from proxy.downstream.access import Access
from proxy.errors import ProxyError

HEADERS = [
    ("Host", "127.0.0.1:8080"),
    ("X-Forwarded-For", "10.0.0.1"),
    ("X-Forwarded-For", "10.0.0.2"),  # a repeated name before the Mcp-* ones: the pairs stay aligned
    ("Authorization", "Bearer opaque"),
    ("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    ("Content-Type", "application/json"),
    ("MCP-Protocol-Version", "2026-07-28"),
    ("Mcp-Method", "tools/call"),
    ("mcp-name", "echo"),
    ("Mcp-Param-Region", "eu"),
    ("Mcp-Session-Id", "s-1"),
    ("Last-Event-ID", "e-1"),
    ("X-Mcpish", "not ours"),
    ("Mcp-Param-Region", "us"),  # repeated: each value goes (the last wins in a dict)
]


def access(**overrides: Any) -> Access:
    return Access(load_settings(None, **{"upstream.url": "http://127.0.0.1:9/mcp", **overrides}))


def request(headers: list[tuple[str, str]]) -> Any:
    return make_mocked_request("POST", "/mcp", headers=CIMultiDict(headers))


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("forward_authorization", [False, True])
async def test_same_era_forwards_what_identifying_the_caller_again_would(
    legacy: bool, forward_authorization: bool
) -> None:
    checked = access(**{"upstream.forward_authorization": forward_authorization})
    caller = await checked.caller(request(HEADERS))
    again = await checked.caller(request(HEADERS), same_era=True, legacy=legacy)
    assert checked.same_era(request(HEADERS), caller, legacy=legacy) == again
    forwarded = again.forwarded
    expected = dict(caller.credentials)  # what goes: each Mcp-* header (and for legacy Last-Event-ID) as it came
    for name, value in HEADERS:
        if name.lower().startswith("mcp-") and (legacy or name.lower() != "mcp-session-id"):
            expected[name] = value
        elif legacy and name.lower() == "last-event-id":
            expected[name] = value
    assert forwarded == expected
    assert forwarded["mcp-name"] == "echo" and forwarded["Mcp-Param-Region"] == "us"
    assert forwarded["MCP-Protocol-Version"] == "2026-07-28" and "X-Mcpish" not in forwarded
    assert ("Mcp-Session-Id" in forwarded) is legacy and ("Last-Event-ID" in forwarded) is legacy
    assert ("Authorization" in forwarded) is forward_authorization
    assert "traceparent" in forwarded and "Content-Type" not in forwarded


@pytest.mark.parametrize("name", ["Authorization", "traceparent", "X-User"])
def test_a_header_read_as_text_must_be_utf8(name: str) -> None:
    """As aiohttp hands them over: bytes that are not UTF-8 decoded with surrogate escapes."""
    checked = access(**{"security.identity_header": "X-User"})

    def headers(*pairs: tuple[str, str]) -> Any:
        return SimpleNamespace(headers=CIMultiDict(pairs))

    checked.check_headers(headers(("Host", "h"), (name, "ok"), (name, "café")))
    with pytest.raises(ProxyError) as refused:
        checked.check_headers(headers(("Host", "h"), (name, "ok"), (name, "caf\udcc3\udca9")))
    assert name.lower() in refused.value.message
    checked.check_headers(headers(("Host", "h"), ("X-Other", "caf\udcc3\udca9")))  # not read: not checked


async def test_a_post_s_caller_is_the_caller_without_the_memo() -> None:
    checked = access(**{"upstream.forward_authorization": True})
    assert await checked.post_caller(request(HEADERS)) == await checked.caller(request(HEADERS))
