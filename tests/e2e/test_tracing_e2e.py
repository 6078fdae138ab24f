"""One trace end to end, read back from a real OTLP receiver.

A real legacy client (mcp==1.30.0, sending a W3C `traceparent` header) calls an elicitation tool
through the proxy on a real modern server (mcp==2.3.0, whose own OpenTelemetryMiddleware makes a
SERVER span per request parented on the request's `_meta` traceparent). Both the proxy and the
server export OTLP/HTTP to Arize Phoenix (the `phoenix` virtualenv of scripts/setup-peers.sh), on
127.0.0.1, and the test reads the trace back through Phoenix's REST API: the proxy's downstream
span is the child of the client's span, each input round is an upstream span of the proxy's under
it, and each of the server's spans is the child of one of those.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import ProxyFactory
from tests.support import peers
from tests.support.procs import Process, on_reserved_port, reserved_port, serving
from tests.support.sdk_drivers import run_legacy_client

pytestmark = pytest.mark.e2e

JSONDict = dict[str, Any]
READ_BACK_S = 60.0  # Phoenix ingests asynchronously: the spans are polled for, this long at most
TOOL = "tools/call elicit"


@pytest.fixture(scope="module")
def receiver(logs_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Phoenix on 127.0.0.1 (its HTTP port takes OTLP on /v1/traces and serves the REST API)."""
    # Phoenix takes its ports from the environment, so it is told reserved ones (tests.support.procs).
    work = tmp_path_factory.mktemp("phoenix")

    def launch(port: int) -> Process:
        env = {
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(port),
            "PHOENIX_GRPC_PORT": str(reserved_port()),  # its OTLP/gRPC listener: never 4317
            "PHOENIX_WORKING_DIR": str(work / str(port)),  # a fresh SQLite database
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        return Process([str(peers.phoenix_bin()), "serve"], logs_dir / f"phoenix-{port}.log", env)

    # The first start migrates a new database: slower than a peer's usual start.
    with on_reserved_port(launch, timeout=120) as phoenix:
        yield f"http://127.0.0.1:{phoenix.port}"


@pytest.fixture(scope="module")
def traced_server(receiver: str, logs_dir: Path) -> Iterator[str]:
    argv = [
        str(peers.mcp2otel_python()),
        str(peers.PEER_SCRIPTS / "traced_modern_server.py"),
        "--otlp-endpoint",
        f"{receiver}/v1/traces",
        "--port",
        "0",
    ]
    with serving(argv, logs_dir / "traced-modern-server.log") as server:
        yield f"http://127.0.0.1:{server.port}/mcp"


def spans_of(receiver: str, trace_id: str) -> list[JSONDict]:
    spans: list[JSONDict] = []
    cursor: str | None = None
    while True:
        query = f"trace_id={trace_id}&limit=1000" + (f"&cursor={cursor}" if cursor else "")
        with urllib.request.urlopen(f"{receiver}/v1/projects/default/spans?{query}", timeout=10) as response:
            page = json.load(response)
        spans.extend(page["data"])
        cursor = page.get("next_cursor")
        if not cursor:
            return spans


def read_back(receiver: str, trace_id: str, ready: Any) -> list[JSONDict]:
    """The trace's spans once `ready(spans)` holds (bounded polling)."""
    deadline = time.monotonic() + READ_BACK_S
    while True:
        spans = spans_of(receiver, trace_id)
        if ready(spans) or time.monotonic() > deadline:
            return spans
        time.sleep(0.2)


def proxy_spans(spans: list[JSONDict], key: str) -> list[JSONDict]:
    return [s for s in spans if s["name"] == TOOL and key in s["attributes"]]


def test_a_translated_elicitation_call_is_one_trace_from_client_to_upstream_server(
    start_proxy: ProxyFactory, traced_server: str, receiver: str
) -> None:
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    traceparent = f"00-{trace_id}-{client_span}-01"
    with start_proxy(
        traced_server,
        tracing__otlp_endpoint=f"{receiver}/v1/traces",
        tracing__service_name="mcp-era-proxy-e2e",
    ) as url:
        observed = run_legacy_client(
            url,
            "elicitation",
            {"tool": "elicit", "arguments": {"message": "who?"}, "headers": {"traceparent": traceparent}},
        )
        assert observed["_exit"] == 0, observed
        assert "elicited: action=accept" in json.dumps(observed["result"]), observed["result"]
    # The proxy stopped (SIGTERM): its batch of spans was flushed on the way out.

    def complete(spans: list[JSONDict]) -> bool:
        sdk = [
            s for s in spans if s["name"] == TOOL and not any(k.startswith("mcp_era_proxy.") for k in s["attributes"])
        ]
        return len(proxy_spans(spans, "mcp_era_proxy.round")) >= 2 and len(sdk) >= 2

    spans = read_back(receiver, trace_id, complete)
    names = sorted(s["name"] for s in spans)
    assert all(s["context"]["trace_id"] == trace_id for s in spans)

    downstream = proxy_spans(spans, "mcp_era_proxy.downstream_era")
    assert len(downstream) == 1, names
    (call,) = downstream
    assert call["parent_id"] == client_span  # the client's traceparent header
    attributes = call["attributes"]
    assert attributes["mcp_era_proxy.downstream_era"] == "legacy"
    assert attributes["mcp_era_proxy.upstream_era"] == "modern"
    assert attributes["mcp_era_proxy.outcome"] == "ok"
    assert attributes["mcp_era_proxy.input_rounds"] == 1
    assert attributes["gen_ai.tool.name"] == "elicit"

    rounds = sorted(proxy_spans(spans, "mcp_era_proxy.round"), key=lambda s: s["attributes"]["mcp_era_proxy.round"])
    assert [s["attributes"]["mcp_era_proxy.round"] for s in rounds] == [0, 1], names
    assert all(s["parent_id"] == call["context"]["span_id"] for s in rounds)

    # The server's own spans (no attribute of the proxy's): one per round, each the child of the
    # proxy's exchange that carried it, as it read it from the request's `_meta`.
    server = [s for s in spans if s["name"] == TOOL and s not in downstream and s not in rounds]
    assert len(server) == 2, names
    assert sorted(s["parent_id"] for s in server) == sorted(s["context"]["span_id"] for s in rounds)
    assert all(s["attributes"].get("gen_ai.tool.name") == "elicit" for s in server)
