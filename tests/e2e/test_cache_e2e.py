"""The response cache end to end: the proxy CLI in front of the real mcp==1.30.0 legacy server, with
cache hints configured for tools/list (`upstream.cache_methods`), a modern client listing tools.

A legacy server's tools/list_changed reaches the proxy only on the GET streams of the sessions the
proxy itself holds upstream (no client subscribed to anything): that is what must empty the entry.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import ProxyFactory
from tests.e2e.test_concurrent_modern_clients import ModernClient

pytestmark = pytest.mark.e2e
CACHE_TOOLS_LIST = '{"tools/list":{"ttl_ms":60000,"scope":"public"}}'
WAIT = 5.0  # how long the invalidation may take to come through


async def cache_samples(http: aiohttp.ClientSession, metrics_url: str) -> dict[tuple[str, tuple[Any, ...]], float]:
    """The proxy's cache metrics: (sample name, sorted labels) -> value."""
    async with asyncio.timeout(10), http.get(metrics_url) as response:
        assert response.status == 200
        text = await response.text()
    samples: dict[tuple[str, tuple[Any, ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("mcp_era_proxy_cache_"):
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def requests_of(samples: dict[tuple[str, tuple[Any, ...]], float], result: str) -> float:
    return samples.get(("mcp_era_proxy_cache_requests_total", (("result", result), ("scope", "public"))), 0.0)


def invalidations_of(samples: dict[tuple[str, tuple[Any, ...]], float]) -> float:
    return sum(value for (name, _), value in samples.items() if name == "mcp_era_proxy_cache_invalidations_total")


def tool_names(reply: dict[str, Any]) -> list[str]:
    return [tool["name"] for tool in reply["result"]["tools"]]


async def test_a_cached_tool_list_of_a_real_legacy_server_is_emptied_by_its_list_changed(
    start_proxy: ProxyFactory, legacy_server: str
) -> None:
    with start_proxy(legacy_server, upstream__cache_methods=CACHE_TOOLS_LIST) as url:
        metrics_url = url.removesuffix("/mcp") + "/metrics"
        async with aiohttp.ClientSession() as http:
            client = ModernClient(http, url, "cache-e2e", {})
            before = await cache_samples(http, metrics_url)
            status, first = await client.call("tools/list", {})
            assert status == 200, first
            status, second = await client.call("tools/list", {})
            assert status == 200, second
            listed = await cache_samples(http, metrics_url)
            # One miss and one hit for the two tools/list (nothing else cacheable was asked).
            assert requests_of(listed, "miss") - requests_of(before, "miss") == 1
            assert requests_of(listed, "hit") - requests_of(before, "hit") == 1
            assert (first["result"]["ttlMs"], first["result"]["cacheScope"]) == (60_000, "public")
            assert 0 < second["result"]["ttlMs"] < 60_000
            assert tool_names(second) == tool_names(first)

            status, added = await client.call("tools/call", {"name": "add_tool", "arguments": {}})
            assert status == 200, added
            match = re.fullmatch(r"added (dynamic_\d+)", added["result"]["content"][0]["text"])
            assert match, added
            new_tool = match.group(1)
            assert new_tool not in tool_names(second)
            # The entry is fresh for a minute: only the list_changed can make the new tool appear now.
            try:
                async with asyncio.timeout(WAIT):
                    while True:
                        status, latest = await client.call("tools/list", {})
                        assert status == 200, latest
                        if new_tool in tool_names(latest):
                            break
            except TimeoutError:
                pytest.fail(f"{new_tool} did not appear within {WAIT}s: the cached tools/list was not invalidated")
            after = await cache_samples(http, metrics_url)
    assert invalidations_of(after) - invalidations_of(before) >= 1
    assert latest["result"]["ttlMs"] == 60_000  # a fresh answer from the server
    assert requests_of(after, "miss") - requests_of(before, "miss") == 2
