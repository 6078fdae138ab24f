"""Replicas of the proxy behind a real balancer, on a real Redis, for tests/replicas.

- `Replica`: one `python -m proxy` on reserved ports (MCP, admin, internal; tests.support.procs),
  so it can be killed by PID (SIGKILL or SIGTERM) and started again exactly where it was.
- `Balancer`: HAProxy in strict round-robin of every request (no stickiness) over the replicas,
  health-checked on /readyz of each admin port, with its runtime API on a loopback port to see
  which replica holds a request in flight and when a replica is back in rotation.

Every process runs in its own process group, logs to a file, and every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import peers
from tests.support.mcp_client import Endpoint, metric
from tests.support.procs import PortTaken, Process, reserved_port
from tests.support.raw_http_client import build, exchange
from tests.support.redis_server import RedisServer

SECRET = "replica-suite-shared-secret-0123456789"  # one secret for every replica (>= 32 characters)
REQUESTS = "mcp_era_proxy_requests_total"
FORWARDS = "mcp_era_proxy_forwards_total"
PARKED = "mcp_era_proxy_parked_calls"


def wait_until(condition: Callable[[], object], timeout: float, what: str, every: float = 0.05) -> object:
    """Poll `condition` until it returns something truthy; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not within {timeout}s: {what}")
        time.sleep(every)


def _exited(proc: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"process {proc.pid} still running {timeout}s after the signal") from None


@dataclass
class Replica:
    """One proxy replica on reserved ports, restartable where it was."""

    name: str
    upstream: str
    logs: Path
    env: dict[str, str]
    port: int = field(default_factory=reserved_port)
    admin_port: int = field(default_factory=reserved_port)
    internal_port: int = field(default_factory=reserved_port)
    process: Process | None = None
    starts: int = 0

    @property
    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "proxy",
            "--upstream",
            self.upstream,
            "--listen",
            f"127.0.0.1:{self.port}",
            "--admin-listen",
            f"127.0.0.1:{self.admin_port}",
        ]

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.proc.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.proc.poll() is None

    def start(self, timeout: float = 30.0) -> None:
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        assert not self.alive, f"{self.name} is running"
        self.starts += 1
        env = {**self.env, "MCP_ERA_PROXY_REPLICAS__INTERNAL_LISTEN": f"127.0.0.1:{self.internal_port}"}
        self.process = Process(self.argv, self.logs / f"{self.name}-{self.starts}.log", env=env, cwd=peers.REPO)

    def wait_ready(self, timeout: float = 30.0) -> None:
        assert self.process is not None
        for port in (self.port, self.admin_port):
            self.process.wait_listening(timeout, port=port)
        wait_until(self.ready, timeout, f"{self.name} /readyz is 200")

    def ready(self) -> bool:
        with contextlib.suppress(OSError, ValueError):
            return exchange(self.admin_port, build("GET", "/readyz", []), timeout=5).status == 200
        return False

    def metrics(self) -> str:
        return exchange(self.admin_port, build("GET", "/metrics", []), timeout=5).body.decode()

    def signal(self, signum: int) -> None:
        """Send `signum` to the replica's process (by PID) and no one else."""
        os.kill(self.pid, signum)

    def kill(self) -> None:
        """kill -9 and wait until the process is gone."""
        assert self.process is not None
        self.signal(signal.SIGKILL)
        _exited(self.process.proc, 10)
        self.process.stop()

    def terminate(self, timeout: float = 40.0) -> int:
        """SIGTERM, then wait for the replica to exit on its own (drain included); its exit status."""
        assert self.process is not None
        self.signal(signal.SIGTERM)
        code = _exited(self.process.proc, timeout)
        self.process.stop()
        return code

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


HAPROXY_CONFIG = """\
global
    maxconn 4096
    log stdout format raw local0 info
    stats socket ipv4@127.0.0.1:{stats_port} level admin

defaults
    mode http
    log global
    option httplog
    option http-no-delay
    option redispatch
    retries 2
    timeout connect 1s
    timeout client 10m
    timeout server 10m
    timeout tunnel 1h
    timeout check 2s
    option log-health-checks
    timeout http-request 30s
    timeout http-keep-alive 30s

frontend mcp
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    # Strict round-robin of every request: no cookie, no stick table, no hash.
    balance roundrobin
    option httpchk GET /readyz
    default-server inter 500 fall 2 rise 1
{servers}
"""


class Balancer:
    """HAProxy 2.6 in front of `replicas`, started as `haproxy -f cfg -db` (foreground), by PID."""

    def __init__(self, replicas: list[Replica], logs: Path, name: str) -> None:
        self.replicas = replicas
        self.port = reserved_port()
        self.stats_port = reserved_port()
        self.config = logs / f"{name}-haproxy.cfg"
        self.log = logs / f"{name}-haproxy.log"
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def render(self) -> str:
        servers = "\n".join(f"    server {r.name} 127.0.0.1:{r.port} check port {r.admin_port}" for r in self.replicas)
        return HAPROXY_CONFIG.format(stats_port=self.stats_port, port=self.port, servers=servers)

    def start(self, timeout: float = 15.0) -> None:
        for attempt in range(5):  # on other ports when one turned out taken
            self.config.write_text(self.render())
            self.process = Process(["haproxy", "-f", str(self.config), "-db"], self.log)
            try:
                self.process.wait_listening(timeout, port=self.port)
                self.process.wait_listening(timeout, port=self.stats_port)
                break
            except PortTaken:
                self.process.stop()
                if attempt == 4:
                    raise
                self.port, self.stats_port = reserved_port(), reserved_port()
        self.wait_up([r.name for r in self.replicas], timeout)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def cli(self, command: str) -> str:
        """One command of HAProxy's runtime API."""
        with socket.create_connection(("127.0.0.1", self.stats_port), timeout=5) as sock:
            sock.sendall(command.encode() + b"\n")
            chunks = []
            while data := sock.recv(65536):
                chunks.append(data)
        return b"".join(chunks).decode(errors="replace")

    def requests_sent(self) -> dict[str, float]:
        """How many requests the balancer sent each replica (`show stat`, each server's `stot`:
        in HTTP mode one stream per request), whatever the replicas forwarded among themselves."""
        lines = [line for line in self.cli("show stat").splitlines() if line.strip()]
        header = lines[0].lstrip("# ").split(",")
        sent: dict[str, float] = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("svname") in {r.name for r in self.replicas}:
                sent[row["svname"]] = float(row.get("stot") or 0)
        return sent

    def states(self) -> dict[str, str]:
        """Each replica's state as HAProxy sees it (UP, DOWN, ...)."""
        lines = self.cli("show stat").splitlines()
        columns = lines[0].lstrip("# ").split(",")
        status = columns.index("status")
        return {
            row[1]: row[status]
            for row in (line.split(",") for line in lines[1:] if line)
            if row[0] == "replicas" and row[1] not in ("BACKEND", "FRONTEND")
        }

    def wait_up(self, names: list[str], timeout: float = 15.0) -> None:
        wait_until(
            lambda: all(self.states().get(n) == "UP" for n in names),  # "UP 1/2" is going down
            timeout,
            f"HAProxy sees {names} UP (now {self.states()})",
        )

    def wait_down(self, name: str, timeout: float = 10.0) -> None:
        wait_until(lambda: not self.states().get(name, "").startswith("UP"), timeout, f"HAProxy sees {name} down")

    def posts_in_flight(self) -> list[tuple[str, int]]:
        """(replica, seconds since it began) of each POST in flight now."""
        found = []
        for block in re.split(r"\n(?=0x[0-9a-f]+: )", self.cli("show sess all")):
            server = re.search(r"^\s+server=(\S+) \(id=", block, re.MULTILINE)
            method = re.search(r"\btxn=\S+ flags=\S+ meth=(\d+) ", block)
            age = re.search(r"^\s+task=.*\bage=([0-9dhms]+)\)", block, re.MULTILINE)
            if server and method and age and method[1] == "3" and "frontend=mcp " in block:  # meth 3: POST
                found.append((server[1], _seconds(age[1])))
        return found


def _seconds(human: str) -> int:
    """HAProxy's human time (`1m12s`) in seconds."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([dhms])", human))


@dataclass
class Cluster:
    """Replicas of one upstream behind one balancer."""

    replicas: list[Replica]
    balancer: Balancer

    @property
    def url(self) -> str:
        return self.balancer.url

    def endpoint(self, timeout: float = 20.0, authorization: str | None = None) -> Endpoint:
        return Endpoint(self.url, timeout=timeout, authorization=authorization)

    def by_name(self, name: str) -> Replica:
        return next(r for r in self.replicas if r.name == name)

    def metric(self, name: str, **labels: str) -> dict[str, float]:
        """`name` (summed over series matching `labels`) on each live replica."""
        return {r.name: metric(r.metrics(), name, **labels) for r in self.replicas if r.alive}

    def owner(self, name: str, timeout: float = 10.0, **labels: str) -> Replica:
        """The one replica whose gauge `name` is above 0 (e.g. the holder of a parked call)."""

        def single() -> str | None:
            holders = [n for n, v in self.metric(name, **labels).items() if v > 0]
            return holders[0] if len(holders) == 1 else None

        return self.by_name(str(wait_until(single, timeout, f"exactly one replica with {name}{labels} > 0")))

    def restart(self, replica: Replica) -> None:
        """Start a stopped replica again on its ports and wait until the balancer uses it."""
        replica.start()
        self.balancer.wait_up([replica.name])


@contextlib.contextmanager
def cluster(
    upstream: str, logs: Path, name: str, *, size: int = 3, redis: RedisServer | None = None, **settings: str
) -> Iterator[Cluster]:
    """`size` replicas of the proxy in front of `upstream`, one shared secret, on `redis` when given
    (its own namespace), behind HAProxy; everything stopped at the end."""
    env = {"MCP_ERA_PROXY_SECURITY__SECRET": SECRET}
    if redis is not None:
        env["MCP_ERA_PROXY_STORE__URL"] = redis.url
        env["MCP_ERA_PROXY_STORE__NAMESPACE"] = name
    env.update({f"MCP_ERA_PROXY_{k.upper()}": v for k, v in settings.items()})
    replicas = [Replica(f"{name}-r{i}", upstream, logs, env) for i in range(size)]
    balancer = Balancer(replicas, logs, name)
    try:
        for replica in replicas:
            replica.launch()  # all at once: they start in parallel
        for replica in replicas:
            for attempt in range(5):  # on other ports when one turned out taken
                try:
                    replica.wait_ready()
                    break
                except PortTaken:
                    replica.stop()
                    if attempt == 4:
                        raise
                    replica.port, replica.admin_port, replica.internal_port = (reserved_port() for _ in range(3))
                    replica.launch()
        balancer.start()
        yield Cluster(replicas, balancer)
    finally:
        balancer.stop()
        for replica in replicas:
            replica.stop()
