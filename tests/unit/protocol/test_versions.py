"""Protocol revisions and eras (proxy/protocol/versions.py)."""

from __future__ import annotations

import pytest

from proxy.protocol.versions import (
    LATEST_LEGACY,
    LATEST_MODERN,
    LEGACY_VERSIONS,
    MODERN_VERSIONS,
    Era,
    era_of,
    legacy_at_least,
    negotiate_legacy,
    pick_modern,
)
from tests.support.schema import schema_path


def test_every_known_revision_has_an_official_schema_to_validate_against():
    for version in (*LEGACY_VERSIONS, *MODERN_VERSIONS):
        assert schema_path(version).is_file()


def test_the_eras_do_not_share_a_revision():
    assert not set(LEGACY_VERSIONS) & set(MODERN_VERSIONS)


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_handshake_revisions_belong_to_the_legacy_era(version):
    assert era_of(version) is Era.LEGACY


@pytest.mark.parametrize("version", MODERN_VERSIONS)
def test_stateless_revisions_belong_to_the_modern_era(version):
    assert era_of(version) is Era.MODERN


@pytest.mark.parametrize("version", [None, "", "2024-10-07", "2099-01-01", "2025-06-18 ", 20250618])
def test_unknown_revisions_belong_to_no_era(version):
    assert era_of(version) is None


def test_legacy_at_least_orders_revisions_oldest_to_newest():
    assert legacy_at_least("2025-06-18", "2025-03-26")
    assert legacy_at_least("2025-06-18", "2025-06-18")
    assert not legacy_at_least("2025-03-26", "2025-06-18")
    assert not legacy_at_least("2024-11-05", "2025-03-26")
    assert legacy_at_least(LATEST_LEGACY, LEGACY_VERSIONS[-1])
    assert not legacy_at_least(LEGACY_VERSIONS[-1], LATEST_LEGACY)


def test_legacy_at_least_is_a_total_order_consistent_with_the_tuple():
    for i, newer in enumerate(LEGACY_VERSIONS):
        for j, older in enumerate(LEGACY_VERSIONS):
            assert legacy_at_least(newer, older) is (i <= j)


@pytest.mark.parametrize("requested", LEGACY_VERSIONS)
def test_negotiation_echoes_a_legacy_revision_the_proxy_speaks(requested):
    assert negotiate_legacy(requested) == requested


@pytest.mark.parametrize("requested", [*MODERN_VERSIONS, "1999-01-01", "", None, 3, ["2025-06-18"]])
def test_negotiation_offers_the_newest_legacy_revision_for_anything_else(requested):
    assert negotiate_legacy(requested) == LATEST_LEGACY


def test_pick_modern_takes_the_newest_modern_revision_the_server_lists():
    assert pick_modern([*LEGACY_VERSIONS, LATEST_MODERN, "2099-01-01"]) == LATEST_MODERN
    assert pick_modern([LATEST_MODERN]) == LATEST_MODERN


@pytest.mark.parametrize("supported", [[], list(LEGACY_VERSIONS), ["2099-01-01"], None, LATEST_MODERN, {"v": 1}])
def test_pick_modern_finds_nothing_without_a_shared_modern_revision(supported):
    assert pick_modern(supported) is None


def test_legacy_at_least_refuses_what_is_no_legacy_version():
    with pytest.raises(ValueError):
        legacy_at_least("2026-07-28", LATEST_LEGACY)
    with pytest.raises(ValueError):
        legacy_at_least(LATEST_LEGACY, "draft")
