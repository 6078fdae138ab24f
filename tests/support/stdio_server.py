"""A scripted MCP server over stdio for integration tests of the proxy's stdio upstreams.

Run as `python stdio_server.py`; it speaks newline-delimited JSON-RPC, no MCP SDK. The era comes
from $STDIO_SERVER_ERA: `legacy` (the default: answers `initialize`, refuses `server/discover`
with -32601 as a legacy server does) or `modern` (answers `server/discover`, refuses
`initialize`). Either way it answers `ping`, `tools/list`, and `tools/call` by tool name:

  pid    {"content": [{"type": "text", "text": "<its pid>"}]}
  echo   its `text` argument
  hold   a progress notification when it has a progressToken, then nothing (a call in flight
         until the client cancels it; then it is answered with an error, as the mcp SDK does)

$STDIO_SERVER_FAULT makes the whole process misbehave, for fault injection: `garbage` (answers
every line with lines that are not JSON-RPC), `exit` (exits 3 at once), `hang` (reads, never
answers), `crash_on_call` (exits 4 on any tools/call).

Each process appends its pid to $STDIO_SERVER_STARTS (a file) when that is set, waits
$STDIO_SERVER_START_DELAY_S seconds before reading anything (a slow start), and exits 0 at the end
of its input.
"""

from __future__ import annotations

import json
import os
import sys
import time

LEGACY = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MODERN = "2026-07-28"
ERA = os.environ.get("STDIO_SERVER_ERA", "legacy")
FAULT = os.environ.get("STDIO_SERVER_FAULT", "")
FAULTS = ("garbage", "exit", "hang", "crash_on_call")
TOOLS = [{"name": name, "inputSchema": {"type": "object"}} for name in ("pid", "echo", "hold")]
INFO = {"name": "scripted-stdio-server", "version": "1.0.0"}


def send(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def result(request: dict[str, object], value: dict[str, object]) -> None:
    send({"jsonrpc": "2.0", "id": request["id"], "result": value})


def error(request: dict[str, object], code: int, text: str) -> None:
    send({"jsonrpc": "2.0", "id": request["id"], "error": {"code": code, "message": text}})


def text(value: str) -> dict[str, object]:
    content = {"content": [{"type": "text", "text": value}]}
    return {"resultType": "complete", **content} if ERA == "modern" else content


def main() -> None:
    starts = os.environ.get("STDIO_SERVER_STARTS")
    if starts:
        with open(starts, "a") as record:
            record.write(f"{os.getpid()}\n")
    if FAULT == "exit":
        sys.exit(3)
    # A server that takes this long to start (as `npx` installing a package does): reads nothing before.
    time.sleep(float(os.environ.get("STDIO_SERVER_START_DELAY_S", "0")))
    held: dict = {}  # the ids of `hold` calls in flight
    for line in sys.stdin:
        if FAULT == "garbage":
            sys.stdout.write("this is not JSON\n\x00\xff{{{\n")
            sys.stdout.flush()
            continue
        if FAULT == "hang":
            continue
        message = json.loads(line)
        method, params = message.get("method"), message.get("params") or {}
        if method == "notifications/cancelled" and params.get("requestId") in held:
            # As the mcp SDK's servers do: the cancelled call is answered with an error anyway.
            error({"id": held.pop(params["requestId"])}, 0, "Request cancelled")
            continue
        if method is None or "id" not in message:
            continue  # a notification or a reply
        if method == "initialize" and ERA == "legacy":
            version = params.get("protocolVersion")
            result(
                message,
                {
                    "protocolVersion": version if version in LEGACY else LEGACY[-1],
                    "capabilities": {"tools": {}},
                    "serverInfo": INFO,
                },
            )
        elif method == "server/discover" and ERA == "modern":
            result(
                message,
                {
                    "resultType": "complete",
                    "supportedVersions": [MODERN],
                    "capabilities": {"tools": {}},
                    "_meta": {"io.modelcontextprotocol/serverInfo": INFO},
                },
            )
        elif method == "ping":
            result(message, {"resultType": "complete"} if ERA == "modern" else {})
        elif method == "tools/list":
            result(message, {"tools": TOOLS, **({"resultType": "complete"} if ERA == "modern" else {})})
        elif method == "tools/call" and FAULT == "crash_on_call":
            sys.exit(4)
        elif method == "tools/call" and params.get("name") == "echo":
            result(message, text(str((params.get("arguments") or {}).get("text", ""))))
        elif method == "tools/call" and params.get("name") == "trace":  # the trace context it was sent
            result(message, text(str((params.get("_meta") or {}).get("traceparent"))))
        elif method == "tools/call" and params.get("name") == "pid":
            result(message, text(str(os.getpid())))
        elif method == "tools/call" and params.get("name") == "hold":
            held[message["id"]] = message["id"]
            token = (params.get("_meta") or {}).get("progressToken")
            if token is not None:
                send(
                    {
                        "jsonrpc": "2.0",
                        "method": "notifications/progress",
                        "params": {"progressToken": token, "progress": 0},
                    }
                )
        else:
            error(message, -32601, f"Method not found: {method}")


if __name__ == "__main__":
    main()
