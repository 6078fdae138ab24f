"""A clone is enough: the test command needs nothing beside the repository (its peers are pinned in
tests/peers, the official schemas vendored in tests/schemas)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from proxy.protocol.versions import LEGACY_VERSIONS, MODERN_VERSIONS

REPO = Path(__file__).resolve().parents[1]
# Where a folder outside the clone would be named: "<repo>/../<name>" or an absolute machine path.
# Spelt from parts, so that the only file naming those paths is not this guard either.
_SIBLING = "sha" + "red"
OUTSIDE = (f"../{_SIBLING}", f"/work/{_SIBLING}", f'parent / "{_SIBLING}"', "REPO.parent")
SCANNED = ["scripts", "tests", "bench", ".ci", "docker", "deploy", "docs", "pyproject.toml", "README.md"]


def scanned_files() -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        root = REPO / name
        candidates = [root] if root.is_file() else sorted(root.rglob("*")) if root.is_dir() else []
        files += [
            p
            for p in candidates
            if p.is_file() and p.suffix not in (".png", ".json", ".pyc") and p != Path(__file__).resolve()
        ]
    return files


def test_the_scan_reads_the_scripts_and_the_tests() -> None:
    names = {p.relative_to(REPO).as_posix() for p in scanned_files()}
    assert {"scripts/test.sh", "scripts/setup-peers.sh", "tests/support/schema.py", ".ci/run"} <= names


@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_nothing_refers_to_a_folder_outside_the_clone(path: Path) -> None:
    text = path.read_text(errors="replace")
    assert [needle for needle in OUTSIDE if needle in text] == []


def test_every_revision_has_its_official_schema_vendored() -> None:
    for revision in (*LEGACY_VERSIONS, *MODERN_VERSIONS):
        schema = json.loads((REPO / "tests" / "schemas" / f"schema-{revision}.json").read_text())
        assert schema.get("definitions") or schema.get("$defs"), revision


def test_the_npm_peers_are_pinned_in_the_clone() -> None:
    peers = REPO / "tests" / "peers"
    manifest = json.loads((peers / "package.json").read_text())
    lock = json.loads((peers / "package-lock.json").read_text())
    for name, version in manifest["dependencies"].items():
        assert lock["packages"][f"node_modules/{name}"]["version"] == version, name
    assert (peers / "fixtures" / "conformance-fixture-v2.mjs").is_file()
    assert (peers / "peer.sh").is_file() and (peers / "env.sh").is_file()


def _floors_declared() -> dict[str, str]:
    """Each runtime dependency pyproject.toml declares (extras included), with its lowest version."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in ("redis", "otel"):
        requirements += project["optional-dependencies"][extra]
    floors: dict[str, str] = {}
    for requirement in requirements:
        found = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?([^;]*)", requirement)
        assert found is not None, requirement
        lowest = [part.strip()[2:] for part in found[2].split(",") if part.strip().startswith(">=")]
        assert len(lowest) == 1, f"{requirement}: a runtime dependency declares its lowest version (>=)"
        floors[found[1].lower()] = lowest[0]
    return floors


def test_the_floors_tier_pins_the_lowest_version_pyproject_declares_of_every_runtime_dependency() -> None:
    pinned = {}
    for line in (REPO / "tests" / "floors" / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pinned[name.strip().lower()] = version.strip()
    declared = _floors_declared()
    assert set(pinned) == set(declared)
    for name, version in declared.items():
        # ">=2.7" is proved by 2.7.0: the same release, spelt in full
        assert pinned[name] == version or pinned[name] == version + ".0" * (3 - version.count(".") - 1), name


def test_the_floors_tier_runs_suites_that_exist() -> None:
    suites = [
        line.split()[0]
        for line in (REPO / "tests" / "floors" / "suites.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert any("tests/unit/seams/".startswith(suite.rstrip("/") + "/") for suite in suites)  # the seams' own
    assert all((REPO / suite).exists() for suite in suites), suites
