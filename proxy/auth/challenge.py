"""`WWW-Authenticate` challenges (RFC 9110 §11.6.1, RFC 6750 §3), as plain strings.

The proxy writes its own Bearer challenges (a token it refused) and rewrites the upstream's, so
that `resource_metadata` (RFC 9728 §5.1) names the proxy's metadata, not the upstream's address.
Everything else in a challenge passes through as it came.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

WELL_KNOWN_RESOURCE = "/.well-known/oauth-protected-resource"

# One auth-param whose name is resource_metadata: its value a quoted-string or a token.
_RESOURCE_METADATA = re.compile(r'(?i)(\bresource_metadata\s*=\s*)(?:"(?:[^"\\]|\\.)*"|[^\s,]*)')
_BEARER = re.compile(r"(?i)(?:^|,)\s*bearer(?=\s|,|$)")


def metadata_url(resource: str) -> str:
    """Where RFC 9728 §3.1 puts the metadata of `resource`: the well-known prefix before its path
    (https://h/mcp → https://h/.well-known/oauth-protected-resource/mcp)."""
    parts = urlsplit(resource)
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, WELL_KNOWN_RESOURCE + path, "", ""))


def quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def bearer(
    resource_metadata: str, error: str | None = None, description: str | None = None, scope: str | None = None
) -> str:
    """The proxy's own challenge."""
    params = []
    if error:
        params.append(f"error={quote(error)}")
    if description:
        params.append(f"error_description={quote(description)}")
    if scope:
        params.append(f"scope={quote(scope)}")
    params.append(f"resource_metadata={quote(resource_metadata)}")
    return "Bearer " + ", ".join(params)


def rewrite(header: str, resource_metadata: str) -> str:
    """The upstream's challenge with `resource_metadata` pointing at the proxy; a Bearer challenge
    without one gains it (so the client discovers the proxy's metadata, not nothing)."""
    rewritten, count = _RESOURCE_METADATA.subn(lambda m: m.group(1) + quote(resource_metadata), header)
    if count:
        return rewritten
    match = _BEARER.search(header)
    if match is None:
        return header  # no Bearer challenge (Basic, a custom scheme): not OAuth, left alone
    end = match.end()
    rest = header[end:]
    # `Bearer` alone, or followed by its auth-params: the new param goes first among them.
    if rest.strip() == "" or rest.lstrip().startswith(","):
        return header[:end] + " resource_metadata=" + quote(resource_metadata) + rest
    return header[:end] + " resource_metadata=" + quote(resource_metadata) + "," + rest
