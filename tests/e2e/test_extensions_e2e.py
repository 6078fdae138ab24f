"""Extensions across the era boundary with real peers (docs/translation.md §2.1): an MCP Apps server
of either era on the TypeScript SDK v2 and @modelcontextprotocol/ext-apps 2.0.4
(tests/peers/fixtures/apps-server.mjs), which offers its app tool and `ui://` resource only to hosts
that declare `io.modelcontextprotocol/ui`, and hosts on the TypeScript SDK (v1 a legacy host, v2 a
2026-07-28 one; tests/e2e/peers/apps_host.cjs) over Streamable HTTP or starting
`mcp-era-proxy stdio` themselves; and the same server over stdio, started by the proxy. Through the
proxy, each host sees what it sees from the same server serving its own era directly: the
server's declared extensions, the app tool with its `_meta.ui`, the resource's HTML and mime type,
the text-only offer without the extension; the server sees the extensions the host declared,
settings unchanged, and receives the host's notifications of an extension.
"""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import peers
from tests.support.procs import serving, wait_for
from tests.support.sdk_drivers import run_node_host

pytestmark = pytest.mark.e2e

UI = "io.modelcontextprotocol/ui"
TASKS = "io.modelcontextprotocol/tasks"
UI_HOST = {UI: {"mimeTypes": ["text/html;profile=mcp-app"]}, "com.example/trace": {"depth": {"max": 3}}}
PLAIN_HOST = {"com.example/trace": {"depth": {"max": 3}}}
HOST_SDK = {"legacy": "v1", "modern": "v2"}
OTHER = {"legacy": "modern", "modern": "legacy"}


@pytest.fixture(scope="module")
def apps_servers(logs_dir: Path) -> Iterator[dict[str, str]]:
    """The apps server in each era, by era."""
    urls: dict[str, str] = {}
    with (
        serving(["bash", str(peers.peer_sh()), "apps-modern", "0"], logs_dir / "apps-modern.log") as modern,
        serving(["bash", str(peers.peer_sh()), "apps-legacy", "0"], logs_dir / "apps-legacy.log") as legacy,
    ):
        urls["modern"] = f"http://127.0.0.1:{modern.port}/mcp"
        urls["legacy"] = f"http://127.0.0.1:{legacy.port}/mcp"
        yield urls


@pytest.fixture(scope="module")
def proxies(start_proxy: Any, apps_servers: dict[str, str]) -> Iterator[dict[str, str]]:
    """A proxy in front of each server, by the server's era."""
    with start_proxy(apps_servers["modern"]) as to_modern, start_proxy(apps_servers["legacy"]) as to_legacy:
        yield {"modern": to_modern, "legacy": to_legacy}


def host(era: str, extensions: dict[str, Any] | None, **target: Any) -> dict[str, Any]:
    """One run of the apps host of `era` (`url=...`, or `command=...` and `args=[...]`)."""
    spec = {"sdk": HOST_SDK[era], "extensions": extensions, "call": ["client-extensions", "weather"], **target}
    # (`target` may also name the calls, and notifications to send first: apps_host.cjs)
    return run_node_host("apps_host.cjs", spec)


def seen(observed: dict[str, Any]) -> dict[str, Any]:
    """What a host's user meets: the server's extensions (the tasks one is the proxy's to offer,
    docs/use/tasks.md), the tools with their `_meta` (`execution` is the proxy's task offer), the UI
    resources read, the call contents, and the extensions the server saw."""
    extensions = dict(observed["serverCapabilities"].get("extensions") or {})
    extensions.pop(TASKS, None)
    return {
        "extensions": extensions,
        "tools": {tool["name"]: {k: v for k, v in tool.items() if k != "execution"} for tool in observed["tools"]},
        "resources": observed["resources"],
        "calls": {name: result["content"] for name, result in observed["calls"].items()},
    }


def through(era: str, downstream: str, proxies: dict[str, str], apps_servers: dict[str, str], logs: Path) -> Any:
    """How a host of `era` reaches the server of the other era through the proxy."""
    if downstream == "http":
        return {"url": proxies[OTHER[era]]}
    proxy = [sys.executable, "-m", "proxy", "stdio", "--log-file", str(logs), "--upstream", apps_servers[OTHER[era]]]
    return {"command": proxy[0], "args": proxy[1:], "cwd": str(peers.REPO)}


@pytest.fixture(scope="module")
def direct(apps_servers: dict[str, str]) -> Any:
    """What a host of an era sees of the server of its own era, by (era, extensions): one run each,
    shared by the downstream transports."""
    found: dict[tuple[str, str], dict[str, Any]] = {}

    def reference(era: str, extensions: dict[str, Any] | None) -> dict[str, Any]:
        key = (era, json.dumps(extensions, sort_keys=True))
        if key not in found:
            found[key] = seen(host(era, extensions, url=apps_servers[era]))
        return found[key]

    return reference


@pytest.mark.parametrize("downstream", ["http", "stdio"])
@pytest.mark.parametrize("extensions", [UI_HOST, PLAIN_HOST, None], ids=["ui-host", "plain-host", "no-extensions"])
@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_a_host_sees_through_the_proxy_what_the_same_server_shows_it_in_its_own_era(
    era: str,
    extensions: dict[str, Any] | None,
    downstream: str,
    proxies: dict[str, str],
    apps_servers: dict[str, str],
    direct: Any,
    logs_dir: Path,
):
    log = logs_dir / f"apps-stdio-{era}-{len(extensions or {})}.log"
    proxied = seen(host(era, extensions, **through(era, downstream, proxies, apps_servers, log)))
    assert proxied == direct(era, extensions)
    # And what that is: the server's offer follows the host's UI capability, and the server saw
    # every extension the host declared, with its settings.
    assert proxied["extensions"] == {UI: {}, "com.example/weather-units": {"units": ["metric", "imperial"]}}
    app = proxied["tools"].get("show-weather")
    if extensions is UI_HOST:
        assert app is not None and app["_meta"]["ui"]["resourceUri"] == "ui://weather/app.html", proxied["tools"]
        [html] = proxied["resources"]["ui://weather/app.html"]
        assert html["mimeType"] == "text/html;profile=mcp-app" and "<!doctype html>" in html["text"]
    else:
        assert app is None and proxied["resources"] == {}
    assert json.loads(proxied["calls"]["client-extensions"][0]["text"]) == extensions


def test_two_modern_hosts_of_one_legacy_server_each_get_their_own_offer(proxies: dict[str, str]):
    """A legacy server learns its client's extensions once per session: the proxy's pooled
    sessions never let the UI host's offer reach the plain one, nor the reverse."""
    offers = [
        sorted(seen(host("modern", extensions, url=proxies["legacy"]))["tools"])
        for extensions in (UI_HOST, PLAIN_HOST, UI_HOST, None)
    ]
    plain = ["client-extensions", "client-notifications", "weather"]
    with_app = sorted([*plain, "show-weather"])
    assert offers == [with_app, plain, with_app, plain]


@pytest.fixture(scope="module")
def stdio_proxies(start_proxy: Any) -> Iterator[dict[str, str]]:
    """A proxy starting the apps server over stdio, by the server's era: a legacy server process per
    pooled session for modern hosts, one modern server process for every legacy host."""
    servers = {era: f"bash {peers.peer_sh()} apps-{era}-stdio" for era in ("modern", "legacy")}
    with start_proxy(command=servers["modern"]) as to_modern, start_proxy(command=servers["legacy"]) as to_legacy:
        yield {"modern": to_modern, "legacy": to_legacy}


@pytest.mark.parametrize("extensions", [UI_HOST, PLAIN_HOST], ids=["ui-host", "plain-host"])
@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_a_host_sees_through_the_proxy_what_a_stdio_server_shows_a_host_of_its_own_era(
    era: str, extensions: dict[str, Any], stdio_proxies: dict[str, str]
):
    """The server over stdio, started by the proxy: the host of each era sees what the same server
    shows a host of the server's own era declaring the same extensions, started by that host (a
    server of one era over stdio speaks only its own)."""
    server = OTHER[era]
    proxied = seen(host(era, extensions, url=stdio_proxies[server]))
    direct = seen(host(server, extensions, command="bash", args=[str(peers.peer_sh()), f"apps-{server}-stdio"]))
    assert proxied == direct
    assert proxied["extensions"] == {UI: {}, "com.example/weather-units": {"units": ["metric", "imperial"]}}
    assert json.loads(proxied["calls"]["client-extensions"][0]["text"]) == extensions
    # A modern host's extensions reached the legacy server's `initialize`, in the process the pool
    # started for that set: its offer follows them. (The modern server over stdio offers the app to
    # every host; see apps-server.mjs.)
    if extensions is UI_HOST or server == "modern":
        assert proxied["tools"]["show-weather"]["_meta"]["ui"]["resourceUri"] == "ui://weather/app.html"
        [html] = proxied["resources"]["ui://weather/app.html"]
        assert html["mimeType"] == "text/html;profile=mcp-app"
    else:
        assert "show-weather" not in proxied["tools"] and proxied["resources"] == {}


UNITS_CHANGED = "notifications/com.example/weather-units/changed"  # the apps server's third-party extension


@pytest.mark.parametrize(
    ("downstream", "upstream"), [("http", "http"), ("stdio", "http"), ("http", "stdio")], ids=lambda t: t
)
@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_an_extensions_notification_reaches_the_server_of_the_other_era(
    era: str,
    downstream: str,
    upstream: str,
    proxies: dict[str, str],
    stdio_proxies: dict[str, str],
    apps_servers: dict[str, str],
    logs_dir: Path,
):
    """A host's notification of an extension goes on to the server, its params unchanged, with what
    the host declared (docs/translation.md §2.1); the server says what it received."""
    params = {"units": "imperial", "nonce": secrets.token_hex(8)}
    if upstream == "stdio":
        target: dict[str, Any] = {"url": stdio_proxies[OTHER[era]]}
    else:
        target = through(era, downstream, proxies, apps_servers, logs_dir / f"apps-notify-{era}.log")
    note = {"method": UNITS_CHANGED, "params": params}
    observed = host(era, PLAIN_HOST, **target, notify=[note], call=["client-notifications"])

    def received(observed: dict[str, Any]) -> bool:
        return params in json.loads(observed["calls"]["client-notifications"]["content"][0]["text"])

    # Over stdio the bridge posts a notification beside the call that follows it: asked again
    # (bounded) until the server has it.
    again = {"url": (stdio_proxies if upstream == "stdio" else proxies)[OTHER[era]]}
    assert received(observed) or wait_for(
        lambda: received(host(era, PLAIN_HOST, **again, call=["client-notifications"])), 10.0
    )
