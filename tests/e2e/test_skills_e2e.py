"""The Skills extension (SEP-2640, `io.modelcontextprotocol/skills`) across the era boundary with real
peers: a Skills server of either era on the TypeScript SDK v2 and its `ext/skills` catalog
(tests/peers/fixtures/skills-server.mjs serving tests/peers/fixtures/skills), judged through the
proxy by the conformance runner's `sep-2640-skills-*` scenarios and used by the SDK's own
SkillsClient (tests/e2e/peers/skills_host.cjs) of the other era, over Streamable HTTP or starting
`mcp-era-proxy stdio`.

The runner speaks 2026-07-28 by default; `--spec-version 2025-11-25 --force` makes it a legacy
client (it calls these extension scenarios "not on the spec timeline" and skips them unless forced).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import peers
from tests.support.conformance import not_passed, run_scenario, verdicts
from tests.support.procs import serving
from tests.support.sdk_drivers import run_node_host

pytestmark = pytest.mark.e2e

SCENARIOS = ["sep-2640-skills-enumeration", "sep-2640-skills-manifest", "sep-2640-skills-directory"]
# How the runner speaks each era.
WIRE = {"modern": (), "legacy": ("--spec-version", "2025-11-25", "--force")}
OTHER = {"legacy": "modern", "modern": "legacy"}
SKILLS = ["skill://tide-tables/SKILL.md", "skill://weather-report/SKILL.md"]


@pytest.fixture(scope="module")
def skills_servers(logs_dir: Path) -> Iterator[dict[str, str]]:
    """The Skills server in each era, by era."""
    with (
        serving(["bash", str(peers.peer_sh()), "skills-modern", "0"], logs_dir / "skills-modern.log") as modern,
        serving(["bash", str(peers.peer_sh()), "skills-legacy", "0"], logs_dir / "skills-legacy.log") as legacy,
    ):
        yield {"modern": f"http://127.0.0.1:{modern.port}/mcp", "legacy": f"http://127.0.0.1:{legacy.port}/mcp"}


@pytest.fixture(scope="module")
def proxies(start_proxy: Any, skills_servers: dict[str, str]) -> Iterator[dict[str, str]]:
    """A proxy in front of each server, by the server's era."""
    with start_proxy(skills_servers["modern"]) as to_modern, start_proxy(skills_servers["legacy"]) as to_legacy:
        yield {"modern": to_modern, "legacy": to_legacy}


@pytest.mark.parametrize("client", ["legacy", "modern"])
@pytest.mark.parametrize("server", ["legacy", "modern"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_runners_skills_scenarios_pass_through_the_proxy_wherever_they_pass_against_the_server(
    scenario: str,
    server: str,
    client: str,
    skills_servers: dict[str, str],
    proxies: dict[str, str],
    tmp_path: Path,
):
    # The reference: the runner speaking the client's era to the same server serving that era
    # directly (checks of one era only, the 2026-07-28 cache hints, are SKIPPED on the other).
    _, direct, _ = run_scenario(skills_servers[client], scenario, tmp_path / "direct", options=WIRE[client])
    _, proxied, printed = run_scenario(proxies[server], scenario, tmp_path / "proxied", options=WIRE[client])
    passed = {k for k, v in verdicts(direct).items() if v == "SUCCESS"}
    assert passed, direct  # the fixture is a real skills server: the scenario has something to judge
    assert passed <= {k for k, v in verdicts(proxied).items() if v == "SUCCESS"}, printed
    # Nothing fails either, the cache hints a 2026-07-28 client gets included.
    assert not_passed(proxied) == [], printed


def skills_host(era: str, **target: Any) -> dict[str, Any]:
    return run_node_host("skills_host.cjs", {"era": era, **target})


def skills_seen(observed: dict[str, Any]) -> dict[str, Any]:
    """What the host's user meets, without the cache hints (the server's own or the proxy's
    configured ones, `upstream.cache`)."""
    return {k: v for k, v in observed.items() if k != "listing"} | {"skills": observed["listing"]["skills"]}


@pytest.mark.parametrize("downstream", ["http", "stdio"])
@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_a_skills_host_gets_through_the_proxy_every_skill_a_server_of_its_own_era_serves(
    era: str, downstream: str, skills_servers: dict[str, str], proxies: dict[str, str], logs_dir: Path
):
    """The SDK's SkillsClient verifies every file against its entry (size, digest, frontmatter):
    through the proxy, in front of the server of the other era, it loads the same skills."""
    upstream = OTHER[era]
    if downstream == "http":
        target: dict[str, Any] = {"url": proxies[upstream]}
    else:
        log = logs_dir / f"skills-stdio-{era}.log"
        proxy = [sys.executable, "-m", "proxy", "stdio", "--log-file", str(log), "--upstream", skills_servers[upstream]]
        target = {"command": proxy[0], "args": proxy[1:], "cwd": str(peers.REPO)}
    proxied = skills_host(era, **target)
    direct = skills_host(era, url=skills_servers[era])
    assert skills_seen(proxied) == skills_seen(direct)
    assert proxied["supported"] and proxied["directoryRead"]
    assert [s["uri"] for s in proxied["listing"]["skills"]] == SKILLS
    assert all(f["verified"] for f in proxied["files"].values())
    assert "skill://weather-report/references/units.md" in proxied["files"]
    if era == "modern":  # a 2026-07-28 listing carries its cache hints (the SDK refuses one without)
        listing = proxied["listing"]
        assert isinstance(listing["ttlMs"], int) and listing["cacheScope"] in ("public", "private")
