"""The command line: configuration errors are clear and stop the start; the effective config prints."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from proxy.config import ENV_PREFIX
from tests.support import legacy_client
from tests.support.mcp_client import Endpoint, answer_to, metric
from tests.support.procs import listening_address, proxy_listener, reserved_port

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **(env or {})},
        cwd=REPO,
        check=False,
    )


def test_check_config_prints_the_effective_configuration_with_flags_over_env_over_file(tmp_path: Path) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text("upstream:\n  url: http://127.0.0.1:1/mcp\n  name: from-file\nsessions:\n  idle_timeout_s: 7\n")
    done = run_cli(
        "--config",
        str(config),
        "--listen",
        "127.0.0.1:9999",
        "--check-config",
        env={f"{ENV_PREFIX}UPSTREAM__NAME": "from-env", f"{ENV_PREFIX}LISTEN": "127.0.0.1:1111"},
    )
    assert done.returncode == 0, done.stderr
    effective = json.loads(done.stdout)
    assert effective["listen"] == "127.0.0.1:9999"
    assert effective["upstream"]["name"] == "from-env"
    assert effective["sessions"]["idle_timeout_s"] == 7
    assert effective["security"]["secret"] is None  # every setting is shown, an unset secret too


@pytest.mark.parametrize(
    ("flags", "env", "expected"),
    [
        (["--upstream", "http://127.0.0.1:1/mcp"], {}, ("http://127.0.0.1:1/mcp", None, None)),
        (["--upstream-sse", "http://127.0.0.1:3/sse"], {}, (None, None, "http://127.0.0.1:3/sse")),
        ([], {"UPSTREAM__URL": "http://127.0.0.1:2/mcp"}, ("http://127.0.0.1:2/mcp", None, None)),
        (
            ["--upstream-sse", "http://127.0.0.1:3/sse"],
            {"UPSTREAM__URL": "http://127.0.0.1:2/mcp"},
            (None, None, "http://127.0.0.1:3/sse"),
        ),
    ],
    ids=["flag-url", "flag-sse", "env-url", "flag-over-env"],
)
def test_the_upstream_is_chosen_as_a_whole_flags_over_environment_over_file(
    tmp_path: Path, flags: list[str], env: dict[str, str], expected: tuple[str | None, ...]
) -> None:
    """A file naming a stdio server and a flag (or variable) naming an HTTP one: the higher one
    wins, as the documented precedence says (docs/operate/configuration.md), instead of exiting 2
    with "set exactly one of"."""
    config = tmp_path / "proxy.yaml"
    config.write_text('upstream:\n  command: "node server.js"\n  name: from-file\n')
    done = run_cli(
        "--config", str(config), *flags, "--check-config", env={f"{ENV_PREFIX}{k}": v for k, v in env.items()}
    )
    assert done.returncode == 0, done.stderr
    upstream = json.loads(done.stdout)["upstream"]
    assert (upstream["url"], upstream["command"], upstream["sse_url"]) == expected
    assert upstream["name"] == "from-file"  # the rest of the file's upstream section stays


def test_two_upstream_flags_still_clash() -> None:
    done = run_cli("--upstream", "http://127.0.0.1:1/mcp", "--upstream-command", "node server.js", "--check-config")
    assert done.returncode == 2 and "set exactly one of" in done.stderr


def test_the_example_config_file_is_valid() -> None:
    done = run_cli("--config", str(REPO / "config" / "proxy.example.yaml"), "--check-config")
    assert done.returncode == 0, done.stderr


def test_a_bad_value_stops_the_start_with_a_message_naming_the_key() -> None:
    done = run_cli("--upstream", "ftp://example/mcp", "--listen", "nowhere")
    assert done.returncode == 2
    assert "upstream.url" in done.stderr and "listen" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_upstream_is_reported_not_a_traceback() -> None:
    done = run_cli()
    assert done.returncode == 2
    assert "upstream" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("variable", ["LISTN", "UPSTREAM__ULR"])
def test_a_misspelt_environment_variable_is_refused_by_its_name(variable: str) -> None:
    done = run_cli("--upstream", "http://127.0.0.1:1/mcp", "--check-config", env={f"{ENV_PREFIX}{variable}": "x"})
    assert done.returncode == 2
    assert f"unknown environment variable {ENV_PREFIX}{variable} (" in done.stderr


async def listened(stderr: asyncio.StreamReader, listener: str) -> int:
    """The port of the next `listening` log line of the proxy's `listener` (mcp, admin, internal):
    the one it listens on, the kernel's choice where port 0 was asked."""
    while line := await stderr.readline():
        if (announced := listening_address(line, listener)) is not None:
            address = urlsplit(announced)
            assert address.hostname == "127.0.0.1" and address.port, announced
            with socket.socket() as sock:  # taken: the proxy listens there
                assert sock.connect_ex(("127.0.0.1", address.port)) == 0
            return address.port
    raise AssertionError(f"the proxy exited before its {listener} listener listened")


async def test_the_running_proxy_answers_http_it_cannot_parse_with_a_json_rpc_error() -> None:
    """The command line serves on downstream/server.py's runner: what aiohttp cannot parse as HTTP (here a header
    line without a colon) gets a JSON-RPC error body, not aiohttp's plain-text page."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "--upstream",
        "http://127.0.0.1:1/mcp",
        "--listen",
        "127.0.0.1:0",
        env={**clean, f"{ENV_PREFIX}UPSTREAM__ERA": "legacy"},
        cwd=REPO,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        async with asyncio.timeout(30):
            port = await listened(proc.stderr, "mcp")
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nNo-Colon-Here\r\n\r\n")
            reply = await reader.read()
            writer.close()
            await writer.wait_closed()
    finally:
        proc.terminate()
        async with asyncio.timeout(30):
            await proc.wait()
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].split()[1] == b"400", head
    assert b"content-type: application/json" in head.lower()
    message = json.loads(body)
    assert message["error"]["code"] == -32600 and "id" not in message


def test_a_yaml_syntax_error_in_the_config_file_names_the_file_and_line(tmp_path: Path) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text("upstream:\n  url: http://127.0.0.1:1/mcp\nsessions:\n  idle_timeout_s: [7\n")
    done = run_cli("--config", str(config), "--check-config")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "invalid configuration" in done.stderr
    assert f"{config}, line 4" in done.stderr, done.stderr


@pytest.mark.parametrize("top", ["- upstream\n- sessions\n", "just a string\n", "# a comment\n\n42\n"])
def test_a_config_file_whose_top_level_is_not_a_mapping_is_refused_with_its_line(tmp_path: Path, top: str) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text(top)
    done = run_cli("--config", str(config), "--check-config")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "invalid configuration" in done.stderr and "mapping" in done.stderr
    line = next(n for n, text in enumerate(top.splitlines(), 1) if text and not text.startswith("#"))
    assert f"{config}, line {line}" in done.stderr, done.stderr


def test_an_unreadable_config_file_is_reported_not_a_traceback(tmp_path: Path) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_bytes(b"upstream:\n  url: \xff\xfe\n")
    done = run_cli("--config", str(config), "--check-config")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "invalid configuration" in done.stderr and str(config) in done.stderr


def test_check_config_shows_secrets_and_credentials_as_set_but_never_prints_them() -> None:
    env = {
        f"{ENV_PREFIX}SECURITY__SECRET": "current-secret-123456",
        f"{ENV_PREFIX}SECURITY__PREVIOUS_SECRETS": '["old-secret-1234567"]',
        f"{ENV_PREFIX}UPSTREAM__HEADERS": '{"Authorization": "Bearer tok-abc", "X-Api-Key": "k-1", "X-Tenant": "t1"}',
        f"{ENV_PREFIX}STORE__URL": "redis://proxy:redis-pass@127.0.0.1:6379/0",
    }
    done = run_cli("--upstream", "http://127.0.0.1:1/mcp", "--check-config", env=env)
    assert done.returncode == 0, done.stderr
    for secret in ("current-secret", "old-secret", "tok-abc", "k-1", "redis-pass"):
        assert secret not in done.stdout, secret
    shown = json.loads(done.stdout)
    assert shown["security"]["secret"] == "<set, hidden>" and shown["security"]["previous_secrets"] == ["<set, hidden>"]
    headers = shown["upstream"]["headers"]
    assert headers == {"Authorization": "<set, hidden>", "X-Api-Key": "<set, hidden>", "X-Tenant": "t1"}
    assert shown["store"]["url"] == "redis://proxy:<set, hidden>@127.0.0.1:6379/0"
    # Unset is told apart from set.
    plain = json.loads(run_cli("--upstream", "http://127.0.0.1:1/mcp", "--check-config").stdout)
    assert plain["security"]["secret"] is None


async def test_the_command_line_starts_the_internal_listener_beside_the_public_one() -> None:
    """With replicas.internal_listen the replay endpoint listens there (refusing what it did not
    seal) and only there: the public listener answers its path 404."""
    internal = reserved_port()  # told to other replicas: a port of its own, not 0
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env = {
        **clean,
        f"{ENV_PREFIX}UPSTREAM__ERA": "legacy",
        f"{ENV_PREFIX}SECURITY__SECRET": "a-shared-secret-0123456789",
        f"{ENV_PREFIX}REPLICAS__INTERNAL_LISTEN": f"127.0.0.1:{internal}",
    }
    argv = ["--upstream", "http://127.0.0.1:1/mcp", "--listen", "127.0.0.1:0"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        *argv,
        env=env,
        cwd=REPO,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        async with asyncio.timeout(30):
            public = await listened(proc.stderr, "mcp")
            assert await listened(proc.stderr, "internal") == internal
            async with aiohttp.ClientSession() as http:
                async with http.post(f"http://127.0.0.1:{internal}/_mep/v1/replay", data=b"junk") as refused:
                    assert refused.status == 401
                async with http.post(f"http://127.0.0.1:{public}/_mep/v1/replay", data=b"junk") as absent:
                    assert absent.status == 404
                async with http.post(f"http://127.0.0.1:{internal}/mcp", data=b"{}") as no_endpoint:
                    assert no_endpoint.status == 404  # the MCP endpoint is not on the internal listener
    finally:
        proc.terminate()
        async with asyncio.timeout(30):
            await proc.wait()


def test_a_port_in_use_is_said_at_once_before_the_upstream_is_probed_and_nothing_claims_to_stop() -> None:
    seen: list[str] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(self.path)
            self.send_response(404)
            self.end_headers()

        do_GET = do_POST

        def log_message(self, *args: object) -> None:
            pass

    upstream = http.server.HTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            done = run_cli(
                "--upstream", f"http://127.0.0.1:{upstream.server_port}/mcp", "--listen", f"127.0.0.1:{port}"
            )
        finally:
            upstream.shutdown()
            upstream.server_close()
    assert done.returncode == 1
    [failed] = [line for line in log_lines(done.stderr) if line["event"] == "cannot_start"]
    assert "in use" in failed["error"]
    # Which address, and where it was set: the flag, the config key and the variable.
    assert (failed["address"], failed["setting"]) == (f"127.0.0.1:{port}", "listen")
    assert all(where in failed["hint"] for where in ("--listen HOST:PORT", "listen", f"{ENV_PREFIX}LISTEN"))
    assert "stopped" not in done.stderr + done.stdout
    assert seen == []  # the upstream heard nothing of a proxy that could not start


@pytest.mark.parametrize("mode", [["--listen", "127.0.0.1:0"], ["stdio"]], ids=["http", "stdio"])
def test_an_aiohttp_without_what_the_read_deadlines_rely_on_is_refused_at_start(mode: list[str]) -> None:
    """An aiohttp of a shape the proxy does not know (a patched class stands for it): no listener,
    no upstream, a message naming the version installed and the range the proxy is tested with."""
    script = (
        "import sys\n"
        "from aiohttp.web_protocol import RequestHandler\n"
        "del RequestHandler._request_count\n"
        "from proxy.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    done = subprocess.run(
        [sys.executable, "-c", script, *mode, "--upstream", "http://127.0.0.1:9/mcp"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"aiohttp {aiohttp.__version__} is installed" in done.stderr
    assert "RequestHandler._request_count is missing" in done.stderr
    assert "aiohttp>=" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def log_lines(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("stdio", [False, True], ids=["http", "stdio"])
def test_an_admin_address_in_use_is_named_with_its_flag_variable_and_setting(stdio: bool) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        flags = ["--admin-listen", f"127.0.0.1:{port}", "--upstream-era", "legacy"]
        done = (
            run_cli("stdio", "--upstream", "http://127.0.0.1:1/mcp", *flags)
            if stdio
            else run_cli("--upstream", "http://127.0.0.1:1/mcp", "--listen", "127.0.0.1:0", *flags)
        )
    assert done.returncode == 1, done.stderr
    events = log_lines(done.stderr)
    [failed] = [line for line in events if line["event"] == "cannot_start"]
    assert "in use" in failed["error"]
    assert (failed["address"], failed["setting"]) == (f"127.0.0.1:{port}", "admin_listen")
    assert "another program listens there" in failed["hint"]
    assert all(where in failed["hint"] for where in ("--admin-listen HOST:PORT", f"{ENV_PREFIX}ADMIN_LISTEN"))
    assert "stopped" not in [line["event"] for line in events]  # it never started
    assert "Traceback" not in done.stderr


def test_an_address_that_does_not_resolve_names_its_setting_and_not_a_port_in_use() -> None:
    done = run_cli("--upstream", "http://127.0.0.1:1/mcp", "--listen", "nowhere.invalid:8080")
    assert done.returncode == 1
    [failed] = [line for line in log_lines(done.stderr) if line["event"] == "cannot_start"]
    assert (failed["address"], failed["setting"]) == ("nowhere.invalid:8080", "listen")
    assert "listens there" not in failed["hint"] and "--listen HOST:PORT" in failed["hint"]


# ---------------------------------------------------------------- a log nobody reads any more

STDIO_SERVER = REPO / "tests" / "support" / "stdio_server.py"


@dataclass
class Unread:
    """A proxy process whose stdout and stderr were one pipe (`mcp-era-proxy ... 2>&1 | tee log`)
    whose reader is gone; the ports its log said before that."""

    proc: subprocess.Popen[bytes]
    endpoint: Endpoint
    admin: Endpoint


def _read_until_started(fd: int, proc: subprocess.Popen[bytes], within_s: float) -> str:
    deadline = time.monotonic() + within_s
    text = b""
    while b'"started"' not in text:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the proxy did not start: {text.decode(errors='replace')[-2000:]}")
        if select.select([fd], [], [], 0.5)[0]:
            text += os.read(fd, 65536)
    return text.decode()


@contextlib.contextmanager
def proxy_whose_log_reader_left(**env: str) -> Iterator[Unread]:
    """The proxy in front of tests/support/stdio_server.py (legacy), its output read until it has
    started; then the pipe's read end is closed, as when `tee` ends. Stopped (its group) at the end."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    upstream = shlex.join([sys.executable, str(STDIO_SERVER)])
    listeners = ["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "--upstream-command", upstream, *listeners],
        stdin=subprocess.DEVNULL,
        stdout=write_end,
        stderr=write_end,
        env={**clean, **{ENV_PREFIX + key: value for key, value in env.items()}},
        cwd=REPO,
        start_new_session=True,
    )
    os.close(write_end)
    try:
        try:
            text = _read_until_started(read_end, proc, 30)
        finally:
            os.close(read_end)  # the reader is gone
        ports = {name: proxy_listener(name)(text) for name in ("mcp", "admin")}
        yield Unread(
            proc,
            Endpoint(f"http://127.0.0.1:{ports['mcp']}/mcp", 20.0),
            Endpoint(f"http://127.0.0.1:{ports['admin']}", 20.0),
        )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def test_a_closed_log_pipe_costs_log_lines_never_an_answer_and_the_proxy_still_stops() -> None:
    """100 requests after the pipe closed, each answered as ever (not HTTP 500 "Internal error");
    the lines they would have logged counted in mcp_era_proxy_log_lines_lost_total; SIGTERM still
    stops it (exit 0)."""
    with proxy_whose_log_reader_left() as proxy:
        session = legacy_client.open_session(proxy.endpoint)  # 2 requests: initialize, initialized
        for index in range(98):
            reply = legacy_client.call(
                proxy.endpoint, session, index, "tools/call", {"name": "echo", "arguments": {"text": f"n{index}"}}
            )
            answer = answer_to(reply, index)
            assert reply.status == 200 and answer is not None, (reply.status, reply.body)
            assert answer.get("result", {}).get("content") == [{"type": "text", "text": f"n{index}"}], answer
        lost = metric(proxy.admin.metrics(), "mcp_era_proxy_log_lines_lost_total")
        assert lost >= 100  # a `request` line each, at least
        proxy.proc.send_signal(signal.SIGTERM)
        assert proxy.proc.wait(30) == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_call_in_flight_at_shutdown_gets_its_answer_with_the_log_pipe_closed(signum: signal.Signals) -> None:
    """The documented -32014 (docs/troubleshooting.md) once shutdown.grace_s runs out, as with a
    log reader, and the proxy exits 0."""
    with proxy_whose_log_reader_left(SHUTDOWN__GRACE_S="1") as proxy:
        session = legacy_client.open_session(proxy.endpoint)
        held = {"name": "hold", "arguments": {}, "_meta": {"progressToken": "p"}}
        # The signal once the call is under way upstream (its progress relayed).
        under_way = (b"notifications/progress", lambda: proxy.proc.send_signal(signum))
        reply = legacy_client.call(proxy.endpoint, session, "held", "tools/call", held, when=under_way)
        exit_code = proxy.proc.wait(30)
    answer = answer_to(reply, "held")
    assert answer is not None and answer["error"]["code"] == -32014, (reply.status, reply.body)
    assert "shutting down" in answer["error"]["message"]
    assert exit_code == 0
