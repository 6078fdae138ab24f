"""The migration report and the status page with real clients (proxy/downstream/clients.py,
proxy/downstream/status_page.py; docs/migrate.md, "Retiring the bridge"): after the mcp 1.30 legacy client, the
TypeScript SDK v1 (a legacy host), the mcp 2.3 modern client and a client whose name holds markup
made requests through the proxy, GET /clients and the metric name each with its version, protocol
version and era, and the status page, loaded in a real headless browser (Chromium from Debian's
packages, installed by scripts/setup-services.sh), shows them, the markup as text."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.support.mcp_client import ACCEPT
from tests.support.procs import proxy_listener, serving
from tests.support.sdk_drivers import run_legacy_client, run_modern_client, run_node_host

pytestmark = pytest.mark.e2e


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return bytes(response.read())


MARKUP_NAME = '<img src=x onerror="document.title=1"><b>bold</b>'


def dump_dom(url: str) -> str:
    """The page as the browser built it (after parsing, as a user would see it)."""
    chromium = shutil.which("chromium")
    assert chromium is not None, "chromium missing: run `bash scripts/setup-services.sh`"
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}", "--dump-dom", url],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
    assert done.returncode == 0 and "<html" in done.stdout, done.stderr[-2000:]
    return done.stdout


class Page(HTMLParser):
    """The elements and the text of the page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []
        self.rows: list[list[str]] = []
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "tr":
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._row is not None and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


@pytest.fixture(scope="module")
def reported(legacy_server: str, logs_dir: Path) -> Iterator[str]:
    """The admin URL of a proxy in front of the mcp 1.30 server once every client made its requests."""
    argv = [sys.executable, "-m", "proxy", "--upstream", legacy_server, "--listen", "127.0.0.1:0"]
    argv += ["--admin-listen", "127.0.0.1:0"]
    with serving(argv, logs_dir / "migration-report.log", announced=proxy_listener()) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/mcp"
        for run in (run_legacy_client, run_modern_client):
            observed = run(url, "tools", {"tool": "echo", "arguments": {"text": "report"}})
            assert "error" not in observed, observed
        run_node_host("apps_host.cjs", {"sdk": "v1", "url": url, "call": []})  # the TypeScript SDK v1
        hostile = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": MARKUP_NAME, "version": "6.6"},
            },
        }
        headers = {"Content-Type": "application/json", "Accept": ACCEPT}
        request = urllib.request.Request(url, data=json.dumps(hostile).encode(), headers=headers)
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert b"protocolVersion" in reply.read()  # answered (a client that left is not counted)
        admin = f"http://127.0.0.1:{proxy.announced(proxy_listener('admin'))}"
        get(f"{admin}/readyz")  # answered: ready
        yield admin


def test_clients_and_the_metric_name_every_real_client_with_its_version_protocol_and_era(reported: str) -> None:
    rows = json.loads(get(f"{reported}/clients"))["clients"]
    metrics = get(f"{reported}/metrics").decode()
    by_name = {(row["name"], row["era"]): row for row in rows}
    python_legacy = by_name[("legacy-client-peer", "legacy")]
    assert python_legacy["version"] == "1.30.0" and python_legacy["protocolVersion"].startswith("2025-")
    assert python_legacy["sessions"] == 1 and python_legacy["requests"] >= 3  # initialize, initialized, the call
    ts_legacy = by_name[("apps-host", "legacy")]
    assert ts_legacy["version"] == "1.0.0" and ts_legacy["protocolVersion"].startswith("2025-")
    modern = by_name[("modern-client-peer", "modern")]
    assert modern["version"] == "2.3.0" and modern["protocolVersion"] == "2026-07-28" and modern["sessions"] == 0
    for row in (python_legacy, ts_legacy, modern):
        label = (
            f'mcp_era_proxy_client_requests_total{{client="{row["name"]}",client_version="{row["version"]}",'
            f'era="{row["era"]}",protocol_version="{row["protocolVersion"]}"}}'
        )
        assert label in metrics, label


def test_the_status_page_shows_the_upstream_readiness_and_every_client_as_text(reported: str) -> None:
    page = Page()
    page.feed(dump_dom(f"{reported}/"))
    text = " ".join(" ".join(page.text).split())
    assert "era legacy" in text and "Readiness: ready" in text
    clients = {row[0]: row for row in page.rows if len(row) == 9}
    python_legacy = clients["legacy-client-peer"]
    assert python_legacy[1] == "1.30.0" and python_legacy[2].startswith("2025-") and python_legacy[3] == "legacy"
    assert clients["apps-host"][1] == "1.0.0" and clients["apps-host"][3] == "legacy"
    assert clients["modern-client-peer"][1:4] == ["2.3.0", "2026-07-28", "modern"]
    # The markup arrived as a name: the browser built no element of it, and shows it as text.
    assert "img" not in page.tags and page.tags.count("b") == 2, page.tags  # the page's own <b>: upstream, era
    [marked] = [name for name in clients if "bold" in name]
    assert clients[marked][1] == "6.6"
