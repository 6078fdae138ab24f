"""Protocol revisions and eras, as enumerated sets (never compared as strings)."""

from __future__ import annotations

from enum import StrEnum


class Era(StrEnum):
    LEGACY = "legacy"  # initialize handshake, Mcp-Session-Id (2024-11-05 .. 2025-11-25)
    MODERN = "modern"  # stateless, per-request _meta (2026-07-28)


# Newest first. Position in the tuple is the only ordering we use.
LEGACY_VERSIONS: tuple[str, ...] = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
MODERN_VERSIONS: tuple[str, ...] = ("2026-07-28",)
LATEST_LEGACY = LEGACY_VERSIONS[0]
LATEST_MODERN = MODERN_VERSIONS[0]


def era_of(version: str | None) -> Era | None:
    if version in MODERN_VERSIONS:
        return Era.MODERN
    if version in LEGACY_VERSIONS:
        return Era.LEGACY
    return None


# Every pair answered in advance: asked on every legacy request.
_AT_LEAST = {
    (version, floor): newer <= older
    for newer, version in enumerate(LEGACY_VERSIONS)
    for older, floor in enumerate(LEGACY_VERSIONS)
}


def legacy_at_least(version: str, floor: str) -> bool:
    """True when legacy `version` is `floor` or newer."""
    at_least = _AT_LEAST.get((version, floor))
    if at_least is None:
        raise ValueError(f"not a pair of legacy versions: {version!r}, {floor!r}")
    return at_least


def negotiate_legacy(requested: object) -> str:
    """Echo a legacy version we speak, else offer our newest (the client may then disconnect)."""
    if isinstance(requested, str) and requested in LEGACY_VERSIONS:
        return requested
    return LATEST_LEGACY


def pick_modern(supported: object) -> str | None:
    """Newest modern version present in a server's `supportedVersions`, if any."""
    if not isinstance(supported, list):
        return None
    for version in MODERN_VERSIONS:
        if version in supported:
            return version
    return None
