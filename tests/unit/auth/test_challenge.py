"""WWW-Authenticate challenges: the proxy's own, and the upstream's rewritten to the proxy's metadata."""

from __future__ import annotations

import pytest

from proxy.auth import challenge

PROXY = "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"


@pytest.mark.parametrize(
    ("resource", "url"),
    [
        ("https://mcp.example.com/mcp", PROXY),
        ("https://mcp.example.com/mcp/", PROXY),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080/.well-known/oauth-protected-resource"),
        ("https://h/a/b?q=1", "https://h/.well-known/oauth-protected-resource/a/b"),
    ],
)
def test_metadata_url_puts_the_well_known_prefix_before_the_path(resource: str, url: str):
    assert challenge.metadata_url(resource) == url


@pytest.mark.parametrize(
    ("upstream", "rewritten"),
    [
        (
            'Bearer error="invalid_token", resource_metadata="http://localhost:3000/.well-known/oauth-protected-resource"',
            f'Bearer error="invalid_token", resource_metadata="{PROXY}"',
        ),
        (
            'Bearer resource_metadata=http://10.0.0.5/x, scope="a b"',
            f'Bearer resource_metadata="{PROXY}", scope="a b"',
        ),
        (
            'Bearer RESOURCE_METADATA = "http://a/\\"b\\"", error="invalid_token"',
            f'Bearer RESOURCE_METADATA = "{PROXY}", error="invalid_token"',
        ),
        ('Bearer realm="mcp"', f'Bearer resource_metadata="{PROXY}", realm="mcp"'),
        ("Bearer", f'Bearer resource_metadata="{PROXY}"'),
        ('Basic realm="x", Bearer', f'Basic realm="x", Bearer resource_metadata="{PROXY}"'),
        ('Basic realm="bearer"', 'Basic realm="bearer"'),
        ('DPoP algs="ES256"', 'DPoP algs="ES256"'),
    ],
)
def test_rewrite_points_resource_metadata_at_the_proxy_and_keeps_the_rest(upstream: str, rewritten: str):
    assert challenge.rewrite(upstream, PROXY) == rewritten


def test_the_proxys_own_challenge_quotes_what_it_carries():
    header = challenge.bearer(PROXY, "invalid_token", 'the token "x" expired', scope="tools:call")
    assert header == (
        'Bearer error="invalid_token", error_description="the token \\"x\\" expired", '
        f'scope="tools:call", resource_metadata="{PROXY}"'
    )
    assert challenge.bearer(PROXY) == f'Bearer resource_metadata="{PROXY}"'
