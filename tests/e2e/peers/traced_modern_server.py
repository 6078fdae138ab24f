"""modern_server.py (the mcp==2.3.0 modern-only peer) with the SDK's own tracing exported.

mcp 2.3's server wraps every request in a SERVER span of its own (mcp/server/_otel.py,
OpenTelemetryMiddleware), parented on the request's `_meta` traceparent, on OpenTelemetry's
global tracer provider. This wrapper installs that provider, exporting each span as it ends over
OTLP/HTTP to --otlp-endpoint, then runs modern_server.py with the remaining arguments:

    traced_modern_server.py --otlp-endpoint http://127.0.0.1:PORT/v1/traces --port 0

Runs with the mcp2otel virtualenv (mcp==2.3.0 + opentelemetry-sdk + the OTLP/HTTP exporter;
scripts/setup-peers.sh).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--otlp-endpoint", required=True, help="OTLP/HTTP traces URL")
    parser.add_argument("--service-name", default="mcp2-modern-server")
    ns, rest = parser.parse_known_args()
    # Exported as each span ends (a test reads them back at once); flushed at exit by the provider.
    provider = TracerProvider(resource=Resource({"service.name": ns.service_name}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=ns.otlp_endpoint)))
    trace.set_tracer_provider(provider)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import modern_server

    try:
        return modern_server.main(rest)
    finally:
        provider.shutdown()


if __name__ == "__main__":
    sys.exit(main())
