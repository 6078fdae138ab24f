"""Configuration: one validated, frozen Settings object.

Sources, highest precedence first: command-line flags, environment (`MCP_ERA_PROXY_*`, nested
with `__`, e.g. `MCP_ERA_PROXY_UPSTREAM__URL`), the YAML file given by `--config`, defaults.

The upstream is one of three kinds (Streamable HTTP, a stdio server, an HTTP+SSE server), yet its
section stays one flat model, `UpstreamConfig`, validated as "exactly one of url, command and
sse_url": that is the format users write (YAML keys, `MCP_ERA_PROXY_UPSTREAM__*` variables, the Helm
chart's values, `--check-config`), and a discriminated input would need a kind key in every config
and a nested section per kind. The code reads the kind instead from `UpstreamConfig.target`, a typed
view (`HttpTarget | StdioTarget | SseTarget`) holding exactly the fields of that kind, and matches on it.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from .protocol.client_checks import DEFAULT_MAX_DEPTH, MAX_DEPTH_LIMIT
from .protocol.meta import LOG_LEVELS

if TYPE_CHECKING:
    import yaml

ENV_PREFIX = "MCP_ERA_PROXY_"
_INITIALIZE_TIMEOUT_S = 30.0
_HTTP_PROBE_TIMEOUT_S = 4.0
# A stdio server is started for the era probe: the bound is its start-up (an `npx` installing).
_STDIO_PROBE_TIMEOUT_S = 30.0


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_listen(value: str) -> tuple[str, int]:
    """ "host:port" or "[v6]:port" → (host, port); port 0 asks the kernel for any free port."""
    text = value.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected HOST:PORT (e.g. 127.0.0.1:8080), got {value!r}")
    return host, int(port)


def is_loopback_host(host: str) -> bool:
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class CacheHintConfig(_Section):
    ttl_ms: int = Field(0, ge=0, description="ttlMs put on results the proxy authors (legacy upstreams).")
    scope: Literal["private", "public"] = Field(
        "private", description="cacheScope on those results; public only if no result depends on the caller."
    )


class PoolConfig(_Section):
    max_sessions: int = Field(256, gt=0, description="Upstream legacy sessions held at most (all callers).")
    max_per_key: int = Field(
        64, gt=0, description="Sessions per caller and capability set (one per concurrent interactive call)."
    )
    idle_timeout_s: float = Field(300.0, gt=0, description="Idle upstream sessions are closed (DELETE).")
    ping_interval_s: float = Field(60.0, gt=0, description="Idle upstream sessions are pinged this often.")


class StdioConfig(_Section):
    max_processes: int = Field(
        32,
        gt=0,
        description="Server processes legacy client sessions hold at most, in front of a legacy stdio server "
        "(a session is a process). At the bound, a new session stops the least recently used idle one; "
        "with none idle it gets 503.",
    )
    process_idle_s: float = Field(
        600.0,
        gt=0,
        description="A session's server process idle this long is stopped, ending the session (sooner than "
        "sessions.idle_timeout_s: a process costs far more than a session record).",
    )


class SseConfig(_Section):
    detect: bool = Field(
        True,
        description="At start, an upstream.url (era auto or legacy) that refuses a POST the way a 2024-11-05 "
        "server refuses it (400/404/405, no JSON-RPC body) and whose GET opens a stream with an `endpoint` "
        "event is used as upstream.sse_url.",
    )
    max_sessions: int = Field(
        32,
        gt=0,
        description="SSE connections held at most with an HTTP+SSE (2024-11-05) server, over legacy client "
        "sessions (one connection each; at the bound a new one stops the least recently used idle one, "
        "with none idle it gets 503) and the sessions pooled for modern clients.",
    )
    endpoint_timeout_s: float = Field(
        10.0, gt=0, description="How long a new SSE connection waits for the server's `endpoint` event (-32011 after)."
    )
    session_idle_s: float = Field(
        600.0,
        gt=0,
        description="A legacy client's SSE connection idle this long is closed, ending the session.",
    )


@dataclass(frozen=True)
class HttpTarget:
    """A Streamable HTTP server (upstream.url)."""

    url: str
    kind: Literal["http"] = "http"


@dataclass(frozen=True)
class StdioTarget:
    """A server the proxy starts and speaks to over stdio (upstream.command), and the bounds on the
    processes legacy client sessions hold."""

    command: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None
    processes: StdioConfig
    kind: Literal["stdio"] = "stdio"


@dataclass(frozen=True)
class SseTarget:
    """A 2024-11-05 HTTP+SSE server (upstream.sse_url): its era is legacy, never probed."""

    url: str
    connections: SseConfig
    kind: Literal["sse"] = "sse"


UpstreamTarget = HttpTarget | StdioTarget | SseTarget


class UpstreamConfig(_Section):
    """The MCP server behind the proxy: exactly one of `url` (Streamable HTTP), `command` (stdio) and
    `sse_url` (HTTP+SSE)."""

    url: str | None = Field(
        None,
        description="Streamable HTTP endpoint of the MCP server behind the proxy. A user and password in it "
        "(https://user:pass@host/mcp) go with every request as Basic credentials, over any other "
        "Authorization; --check-config hides the password.",
    )
    command: list[str] | None = Field(
        None,
        description="Or: the MCP server to start and speak to over stdio (program and arguments): a list, or "
        "one string split like a shell.",
    )
    sse_url: str | None = Field(
        None,
        description="Or: the SSE URL of a 2024-11-05 HTTP+SSE server (GET it, POST to the endpoint it "
        "announces); its era is legacy, not probed.",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the stdio server.")
    cwd: str | None = Field(None, description="Working directory of the stdio server.")
    name: str = Field(
        "",
        description="Label of the upstream in logs, errors, metrics and the status page. Default: the URL's host and "
        "port (never its credentials or path), or the stdio command's program name.",
    )
    era: Literal["auto", "legacy", "modern"] = Field(
        "auto", description="Protocol era the upstream speaks; `auto` detects it (and re-detects when it changes)."
    )
    probe_timeout_s: float | None = Field(
        None,
        gt=0,
        description="How long era detection waits for the upstream's answer. Default: 4 s over HTTP; 30 s over "
        "stdio, where it bounds the server's start-up (the probe's process is started for it) and silence past it "
        "means legacy.",
    )
    restart_backoff_max_s: float = Field(
        30.0, gt=0, description="Backoff ceiling for restarting a crashed stdio server."
    )
    shutdown_grace_s: float = Field(
        5.0, gt=0, description="A stdio server gets this long after stdin closes, then SIGTERM, then SIGKILL."
    )
    headers: dict[str, str] = Field(
        default_factory=dict, description="Extra static headers sent on every upstream request."
    )
    forward_authorization: bool = Field(
        True, description="Pass the client's Authorization header to the upstream unchanged."
    )
    connect_timeout_s: float = Field(5.0, gt=0, description="Connect timeout of an upstream request.")
    request_timeout_s: float = Field(
        300.0, gt=0, description="Upper bound for one upstream request, streaming included."
    )
    max_connections: int = Field(
        0, ge=0, description="Connection pool bound (0 = unbounded; listen streams hold one each)."
    )
    max_reply_bytes: int = Field(
        16 * 1024 * 1024,
        gt=0,
        description="Largest upstream reply body (or SSE event) the proxy reads; a larger one fails with -32012 "
        "naming this setting.",
    )
    cache: CacheHintConfig = Field(
        default_factory=CacheHintConfig, description="Cache hints for results of a legacy upstream."
    )
    cache_methods: dict[str, CacheHintConfig] = Field(
        default_factory=dict,
        description="Per-method cache hints (server/discover, tools/list, ...), e.g. "
        '`{"tools/list": {"ttl_ms": 60000, "scope": "public"}}`; the Skills extension\'s skills/list, skills/get '
        "and resources/directory/read take hints too.",
    )
    pool: PoolConfig = Field(default_factory=PoolConfig, description="Sessions held with a legacy upstream.")
    stdio: StdioConfig = Field(
        default_factory=StdioConfig, description="Server processes of legacy clients' sessions (legacy stdio server)."
    )
    sse: SseConfig = Field(
        default_factory=SseConfig, description="Connections with an HTTP+SSE server (upstream.sse_url)."
    )
    declare_capabilities: Literal["all", "client"] = Field(
        "all",
        description="Client capabilities declared to a legacy upstream. `all`: every input capability, so "
        "the server asks whenever it needs input and a request that lacks the capability gets -32021 "
        "naming it, as from a modern server. `client`: exactly what each request declares (one session "
        "per capability set), for servers that adapt to what the client can do. Extensions are declared as each "
        "request declares them in both modes (one session per extension set).",
    )

    @field_validator("url", "sse_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http(s) URL, got {value!r}")
        return value

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, value: object) -> object:
        if isinstance(value, str):
            value = shlex.split(value)
        if isinstance(value, list) and not value:
            raise ValueError("must name a program")
        return value

    @model_validator(mode="after")
    def _one_transport(self) -> UpstreamConfig:
        if sum(value is not None for value in (self.url, self.command, self.sse_url)) != 1:
            raise ValueError(
                "set exactly one of upstream.url (Streamable HTTP), upstream.command (stdio) "
                "and upstream.sse_url (HTTP+SSE)"
            )
        if self.sse_url is not None and self.era == "modern":
            raise ValueError("an HTTP+SSE server (upstream.sse_url) speaks 2024-11-05: upstream.era cannot be modern")
        if not self.name:  # frozen: set once, while it is validated
            object.__setattr__(self, "name", _label_of(self.url or self.sse_url, self.command))
        return self

    @property
    def initialize_timeout_s(self) -> float:
        """How long a legacy server has to answer `initialize`: at most 30 s, and never longer than
        any request may take (a server silent past it is a timeout, -32011)."""
        return min(_INITIALIZE_TIMEOUT_S, self.request_timeout_s)

    @property
    def era_probe_timeout_s(self) -> float:
        """probe_timeout_s, or its default for the transport."""
        if self.probe_timeout_s is not None:
            return self.probe_timeout_s
        return _STDIO_PROBE_TIMEOUT_S if self.transport == "stdio" else _HTTP_PROBE_TIMEOUT_S

    @property
    def target(self) -> UpstreamTarget:
        """The upstream as its kind, with that kind's fields only (the input stays flat: module docstring)."""
        if self.sse_url is not None:
            return SseTarget(self.sse_url, self.sse)
        if self.url is not None:
            return HttpTarget(self.url)
        assert self.command is not None  # exactly one of the three (_one_transport)
        return StdioTarget(tuple(self.command), self.env, self.cwd, self.stdio)

    @property
    def transport(self) -> Literal["http", "stdio", "sse"]:
        return self.target.kind

    @field_validator("name")
    @classmethod
    def _label(cls, value: str) -> str:
        if not value or not all(c.isalnum() or c in _LABEL_PUNCTUATION for c in value):
            raise ValueError("use letters, digits and '-', '_', '.', ':', '[' or ']'")
        return value


_LABEL_PUNCTUATION = frozenset("-_.:[]")  # a host and port: 127.0.0.1:3000, [::1]:3000


def _label_of(url: str | None, command: list[str] | None) -> str:
    """upstream.name's default: the URL's host and port (its credentials and path left out), or the
    command's program name, in the characters a name may use."""
    if url is not None:
        parts = urlsplit(url)
        host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname or ""
        label = host if parts.port is None else f"{host}:{parts.port}"
    else:
        label = os.path.basename(command[0]) if command else ""
    label = "".join(c if c.isalnum() or c in _LABEL_PUNCTUATION else "_" for c in label)
    return label or "upstream"


class SecurityConfig(_Section):
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Origins allowed to call the proxy; empty = loopback origins only; a foreign Origin gets 403. "
        "Requests without an Origin header (non-browser clients) are always allowed.",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host header values accepted; empty = loopback names when listening on "
        "loopback, anything otherwise; others get 421. Guards against DNS rebinding.",
    )
    max_body_bytes: int = Field(4 * 1024 * 1024, gt=0, description="Larger request bodies get 413.")
    max_json_depth: int = Field(
        DEFAULT_MAX_DEPTH,
        ge=16,
        le=MAX_DEPTH_LIMIT,
        description="Client JSON nested deeper (arrays and objects, the message itself counting as one) "
        "is refused with 400 -32600.",
    )
    secret: str | None = Field(
        None,
        min_length=16,
        description="Key every token the proxy mints is sealed with (session ids, requestState, event ids: "
        "AES-256-GCM under keys derived from it); random per process when unset. Set it (from a secret) to keep "
        "sessions valid across restarts of one replica; replicas share one.",
    )
    previous_secrets: list[str] = Field(
        default_factory=list,
        description="Secrets replaced by `secret`, still accepted (never used to mint) while the new "
        "one rolls out: session ids and requestState tokens minted with them stay valid. Rotate in two rolling "
        "updates: first add the new secret here everywhere (every replica then opens what it will seal), then "
        "make it `secret` with the old one here; in one step, replicas still on the old secret refuse what the "
        "new ones seal.",
    )
    identity_header: str | None = Field(
        None,
        description="Header naming the caller when an authenticating gateway sits in front; "
        "otherwise the Authorization header identifies the caller.",
    )

    @model_validator(mode="after")
    def _rotation(self) -> SecurityConfig:
        if self.previous_secrets and self.secret is None:
            raise ValueError("previous_secrets needs secret: the secret that replaces them")
        if any(len(old) < 16 for old in self.previous_secrets):
            raise ValueError("previous_secrets: each must be at least 16 characters")
        return self


class SessionsConfig(_Section):
    idle_timeout_s: float = Field(1800.0, gt=0, description="Legacy sessions idle longer expire.")
    max_lifetime_s: float = Field(86400.0, gt=0, description="Hard bound on a session's age.")
    max_sessions: int = Field(
        50_000, gt=0, description="Legacy sessions held at most; beyond it `initialize` gets 503."
    )
    max_get_streams: int = Field(2, gt=0, description="GET streams a session may hold open (one more gets 409).")
    max_inflight_requests: int = Field(64, gt=0, description="Concurrent requests per session.")
    max_pending_inputs: int = Field(16, gt=0, description="Outstanding server-to-client requests per session.")
    default_log_level: str | None = Field(
        None,
        description="Log level used before a legacy client calls logging/setLevel "
        "(unset: no log notifications until it does).",
    )
    notification_buffer: int = Field(
        64, ge=0, description="Notifications kept for a session while it has no GET stream."
    )

    @field_validator("default_log_level")
    @classmethod
    def _level(cls, value: str | None) -> str | None:
        if value is not None and value not in LOG_LEVELS:
            raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}")
        return value


class InputConfig(_Section):
    park_timeout_s: float = Field(
        600.0,
        gt=0,
        description="How long a parked legacy call waits for the modern client's retry "
        "(also the requestState lifetime); then it is cancelled upstream.",
    )
    collect_window_s: float = Field(
        0.1, ge=0, description="After a legacy server's first input request, wait this long for more."
    )
    max_parked: int = Field(1000, gt=0, description="Parked legacy calls held at most.")
    max_rounds: int = Field(10, gt=0, description="Multi round-trip rounds allowed per request.")
    round_timeout_s: float = Field(300.0, gt=0, description="Time a client has to answer one round of input requests.")
    initialized_wait_s: float = Field(
        2.0, ge=0, description="How long to hold input requests until notifications/initialized."
    )


class TasksConfig(_Section):
    enabled: bool = Field(
        True,
        description="Host tasks for 2025-11-25 clients of a 2026-07-28 upstream (tools/call with params.task, "
        "tasks/get, tasks/result, tasks/cancel, tasks/list); off: those clients are told of no task support.",
    )
    default_ttl_s: float = Field(
        3600.0, gt=0, description="How long a task and its result are kept when the client asks for no ttl."
    )
    max_ttl_s: float = Field(86_400.0, gt=0, description="Ceiling on the retention a client may ask for.")
    mark_tools: bool = Field(
        True,
        description="List every tool to those clients as execution.taskSupport optional (hosts that decide by "
        "the tool then run calls as tasks); off: tool lists stay the upstream's, and only clients that ask for a "
        "task regardless get one.",
    )
    max_per_caller: int = Field(
        100, gt=0, description="Tasks kept per caller at most (finished ones included); -32013 past it."
    )
    poll_interval_ms: int = Field(1000, gt=0, description="The pollInterval the proxy asks clients to respect.")
    page_size: int = Field(50, gt=0, le=1000, description="Tasks per tasks/list page.")
    follow_upstream: bool = Field(
        True,
        description="Declare the io.modelcontextprotocol/tasks extension on the tools/call sent to a 2026-07-28 "
        "upstream that has it, and follow a task it answers with (tasks/get at its pollIntervalMs, input through "
        "tasks/update, tasks/cancel when the legacy client gives up) until its result; off: never declared.",
    )


class StreamsConfig(_Section):
    keepalive_s: float = Field(
        15.0, gt=0, description="SSE comment interval on quiet streams; a reply pending this long becomes one."
    )
    listen_retry_max_s: float = Field(
        30.0, gt=0, description="Backoff ceiling for reopening a lost upstream listen stream."
    )


class CacheConfig(_Section):
    enabled: bool = Field(True, description="Serve cacheable results (discover and lists, resources/read) from memory.")
    max_entries: int = Field(10_000, gt=0, description="Entries kept at most (least recently used go first).")
    max_bytes: int = Field(64 * 1024 * 1024, gt=0, description="Serialized bytes kept at most.")
    max_ttl_ms: int = Field(3_600_000, ge=0, description="Ceiling on any result's ttlMs (0 = never cache).")
    capabilities_in_key: bool = Field(
        True,
        description="Key entries by the request's client capabilities too (a server may answer "
        "differently per capabilities; turning this off shares more, safely only if it does not).",
    )
    watch: bool = Field(
        True, description="Keep a subscription upstream so list_changed / resources/updated invalidate at once."
    )
    watched_resources_max: int = Field(256, ge=0, description="Cached resources/read URIs watched for updates.")


class DownstreamSseConfig(_Section):
    enabled: bool = Field(
        True,
        description="Serve 2024-11-05 HTTP+SSE clients too: GET `path` opens a session's event stream, which "
        "names the POST endpoint (`message_path`) its messages go to.",
    )
    path: str = Field("/sse", pattern=r"^/", description="Where an HTTP+SSE client opens its event stream.")
    message_path: str = Field(
        "/messages", pattern=r"^/", description="Where an HTTP+SSE client posts its messages (?session_id=...)."
    )
    max_connections: int = Field(
        1000, gt=0, description="HTTP+SSE event streams open at most; one more is refused with 503."
    )


class DownstreamConfig(_Section):
    sse: DownstreamSseConfig = Field(
        default_factory=DownstreamSseConfig, description="The deprecated HTTP+SSE transport for older clients."
    )
    idle_timeout_s: float = Field(
        75.0,
        gt=0,
        description="A client connection with no request under way (before its first, between two) is closed "
        "after this. Keep it longer than the idle timeout of a load balancer in front (some use 600 s).",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A request's headers must arrive within this from its first byte; then 408, connection closed "
        "(slowloris).",
    )
    body_timeout_s: float = Field(
        60.0,
        gt=0,
        description="A request's body must arrive within this from the end of its headers; then 408, connection "
        "closed. Only reading the request is bounded: replies (SSE streams, long calls) are not.",
    )


class StoreConfig(_Section):
    """Where state that outlives one request lives (docs/design.md §Replicas)."""

    url: str | None = Field(
        None,
        description="Shared store for legacy session state: redis://HOST:PORT/DB or rediss://... "
        "Every replica then serves every session; needs security.secret. Unset: in this process only (one "
        "replica). Needs the extra `mcp-era-proxy[redis]` (in the image).",
    )
    namespace: str = Field(
        "mep", min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_.-]+$", description="Prefix of every key."
    )
    timeout_ms: int = Field(
        50,
        gt=0,
        le=5000,
        description="Deadline of one store call; past it the call counts as a failure and the request goes on "
        "without it.",
    )
    max_connections: int = Field(
        32,
        gt=0,
        le=10_000,
        description="Connections this replica opens to Redis at most (the tracking connection besides). More "
        "store calls at once than this wait for a free connection, within store.timeout_ms: a burst of new "
        "sessions neither opens a connection each nor fails.",
    )
    tracking: bool = Field(
        True,
        description="Serve a session's state from this replica's copy, without a round trip, while Redis "
        "tells this replica on a connection of its own which records any replica changed (CLIENT TRACKING): "
        "a change made through one replica is seen on the next request at any other. While that connection "
        "is down or silent, requests read the store. false: every request reads the store (or see "
        "read_cache_ms).",
    )
    read_cache_ms: int = Field(
        0,
        ge=0,
        le=10_000,
        description="When no tracked copy can be served (store.tracking off, or its connection down): serve a "
        "session's state as this replica read it less than this long ago, without a round trip: fewer store "
        "calls, but a log level set or a DELETE made through another replica is seen here up to this much "
        "later. 0: such a request reads the store.",
    )
    breaker_failures: int = Field(5, gt=0, description="Consecutive store failures that open the breaker.")
    breaker_open_s: float = Field(
        2.0, gt=0, description="While open, store calls fail at once; then one call tries the store again."
    )

    @field_validator("url")
    @classmethod
    def _scheme(cls, value: str | None) -> str | None:
        if value is not None and urlsplit(value).scheme not in ("redis", "rediss"):
            raise ValueError("store.url must start with redis:// or rediss://")
        return value


class ReplicasConfig(_Section):
    """How replicas reach the owner of a live object (an open call, a parked call, a stream)."""

    internal_listen: str | None = Field(
        None,
        description="Address of the internal listener other replicas forward to (e.g. 0.0.0.0:8081); "
        "keep it off the Service and behind a NetworkPolicy; needs security.secret. Unset: no forwarding (one "
        "replica).",
    )
    advertise: str | None = Field(
        None,
        description="HOST:PORT other replicas use to reach internal_listen (the pod IP); "
        "default: internal_listen itself.",
    )
    forward_connect_timeout_s: float = Field(
        0.5, gt=0, description="Connecting to another replica; one that does not answer in time is taken as gone."
    )

    @field_validator("internal_listen", "advertise")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        # Other replicas are told this address: it must be the port that is listened on.
        if value is not None and parse_listen(value)[1] == 0:
            raise ValueError("needs a port other replicas can be told (not 0)")
        return value

    @property
    def advertised(self) -> str | None:
        return self.advertise or self.internal_listen


class AuthConfig(_Section):
    """OAuth 2.1 in front of a protected MCP server (docs/design.md §Authorization).

    `passthrough`: the upstream is the resource server; the proxy serves its protected resource
    metadata on its own origin with `resource` = public_url, rewrites `resource_metadata` in the
    upstream's challenges, and forwards `Authorization` unchanged (the upstream must accept tokens
    whose audience is public_url). `resource_server`: the proxy validates every token itself
    (issuer, audience, expiry, signature against the issuer's JWKS) and calls the upstream with its
    own credentials (`upstream.headers`), never the client's token.
    """

    public_url: str | None = Field(
        None,
        description="The MCP endpoint's URL as clients reach it (https://mcp.example.com/mcp): the `resource` of the "
        "protected resource metadata the proxy serves and the audience tokens must name. Unset: derived from each "
        "request's Host and scheme (fine on loopback, wrong behind a TLS-terminating ingress).",
    )
    mode: Literal["passthrough", "resource_server"] = Field(
        "passthrough",
        description="passthrough: the upstream validates tokens; resource_server: the proxy does, and the "
        "client's token never reaches the upstream.",
    )
    issuers: list[str] = Field(
        default_factory=list,
        description="Authorization servers whose JWTs the proxy verifies (`iss`). Required by resource_server; "
        "with passthrough, a verified JWT of one of them names the caller by (issuer, subject), so a refreshed "
        "token keeps the caller's sessions.",
    )
    audience: str | None = Field(None, description="The `aud` tokens must carry; default: public_url.")
    jwks_url: str | None = Field(
        None, description="Where the issuers' signing keys are; default: `jwks_uri` of the issuer's metadata."
    )
    algorithms: list[str] = Field(
        default_factory=lambda: ["RS256", "PS256", "ES256", "EdDSA"],
        min_length=1,
        description="JWS algorithms accepted (never `none`, never HMAC: the keys are public; refused at start).",
    )
    leeway_s: float = Field(30.0, ge=0, le=300, description="Clock skew allowed on `exp` and `nbf`.")
    required_scopes: list[str] = Field(
        default_factory=list, description="resource_server: scopes every token must carry (403 insufficient_scope)."
    )
    client_in_identity: bool = Field(
        False,
        description="The caller is (issuer, subject, client id) instead of (issuer, subject): the same user "
        "through two OAuth clients gets two identities.",
    )
    metadata_max_age_s: float = Field(
        300.0,
        ge=0,
        description="Upper bound on caching the upstream's metadata and the JWKS (their cache headers may say less).",
    )

    @field_validator("public_url", "jwks_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and (urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).netloc):
            raise ValueError("must be an absolute http:// or https:// URL")
        return value

    @field_validator("algorithms")
    @classmethod
    def _asymmetric(cls, value: list[str]) -> list[str]:
        refused = [a for a in value if a.lower() == "none" or a.upper().startswith("HS")]
        if refused:
            raise ValueError(f"refused algorithms {refused}: only asymmetric signatures are verifiable against a JWKS")
        return value

    @model_validator(mode="after")
    def _resource_server(self) -> AuthConfig:
        if self.mode == "resource_server" and not self.issuers:
            raise ValueError("auth.mode resource_server needs auth.issuers: the authorization servers it trusts")
        return self


class TracingConfig(_Section):
    """OpenTelemetry spans (the `[otel]` extra); nothing is imported or allocated when off."""

    otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP traces endpoint (http://collector:4318/v1/traces); needs the extra "
        "`mcp-era-proxy[otel]`. Unset: no spans, nothing of OpenTelemetry imported.",
    )
    service_name: str = Field("mcp-era-proxy", min_length=1, description="`service.name` of the spans.")
    sample_ratio: float = Field(
        1.0, ge=0, le=1, description="Share of new traces sampled; a sampled incoming trace is always followed."
    )
    headers: dict[str, str] = Field(default_factory=dict, description="Headers sent to the OTLP endpoint.")


class ShutdownConfig(_Section):
    grace_s: float = Field(
        20.0,
        ge=0,
        description="On SIGTERM: in-flight calls get this long to finish (streams end at once, "
        "gracefully), then each call still running is answered with -32014 (HTTP 503, or a last SSE event on a "
        "reply that had started: the client may retry it elsewhere) and cancelled upstream, and the process "
        "exits 0.",
    )


class ReadinessConfig(_Section):
    window_s: float = Field(
        30.0,
        gt=0,
        description="A handshake in the upstream's era (a legacy `initialize` and its end, or `server/discover`) "
        "that worked within this window makes /readyz ready without asking again; one that failed since, a "
        "request's included, makes it ask at once.",
    )
    probe_timeout_s: float = Field(
        3.0,
        gt=0,
        description="Timeout of the readiness probe (the era's handshake; a stdio legacy server: a pooled "
        "session's `ping`); a slower probe goes on, and /readyz answers 503 until it ends.",
    )


class ClientsConfig(_Section):
    """The migration report: who speaks which protocol (GET /clients, the status page, a metric)."""

    max_tracked: int = Field(
        100,
        ge=1,
        le=10_000,
        description="Distinct clients (clientInfo name and version, protocol version, era) kept in the report "
        "and labelled in mcp_era_proxy_client_requests_total; later ones share the row and label `other`.",
    )


class LoggingConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Lowest level logged.")
    format: Literal["json", "console"] = Field(
        "json", description="`json`: one object per line; `console`: lines for people."
    )
    file: str | None = Field(
        None,
        description="Append logs to this file instead of writing them to stderr (`--log-file`); stdout never "
        "carries logs (`mcp-era-proxy stdio` speaks MCP there).",
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    listen: str = Field(
        "127.0.0.1:8080",
        description="Address of the MCP endpoint; port 0: any free port, the one chosen in the `listening` log line "
        "(not with workers > 1).",
    )
    path: str = Field("/mcp", description="Path of the MCP endpoint.")
    admin_listen: str | None = Field(
        None,
        description="Separate address for /metrics, /healthz, /readyz (default: same); port 0 as for listen.",
    )
    upstream: UpstreamConfig
    downstream: DownstreamConfig = DownstreamConfig()
    security: SecurityConfig = SecurityConfig()
    sessions: SessionsConfig = SessionsConfig()
    input: InputConfig = InputConfig()
    tasks: TasksConfig = TasksConfig()
    streams: StreamsConfig = StreamsConfig()
    cache: CacheConfig = CacheConfig()
    readiness: ReadinessConfig = ReadinessConfig()
    clients: ClientsConfig = ClientsConfig()
    shutdown: ShutdownConfig = ShutdownConfig()
    logging: LoggingConfig = LoggingConfig()
    store: StoreConfig = StoreConfig()
    replicas: ReplicasConfig = ReplicasConfig()
    auth: AuthConfig = AuthConfig()
    tracing: TracingConfig = TracingConfig()
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="Processes serving the listening port together (SO_REUSEPORT), each a replica; worker i "
        "serves admin_listen and replicas.internal_listen on their port + i (and advertises replicas.advertise's "
        "port + i). More than one needs store.url and security.secret.",
    )

    @field_validator("listen", "admin_listen")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None:
            parse_listen(value)
        return value

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value

    @model_validator(mode="after")
    def _distinct_paths(self) -> Settings:
        sse = self.downstream.sse
        if sse.enabled and len({self.path, sse.path, sse.message_path}) < 3:
            raise ValueError("path, downstream.sse.path and downstream.sse.message_path must differ")
        return self

    @model_validator(mode="after")
    def _distinct_listeners(self) -> Settings:
        if self.admin_listen is None:
            return self
        admin = parse_listen(self.admin_listen)
        if admin == parse_listen(self.listen) and admin[1] != 0:  # two port-0 listeners get two ports
            raise ValueError("admin_listen must differ from listen")
        return self

    @model_validator(mode="after")
    def _shared_secret(self) -> Settings:
        # Replicas must open each other's tokens: one secret for all, never a random one each.
        # Every missing piece at once: an operator fixes them in one go, not one run each.
        problems = []
        shared = self.store.url is not None or self.workers > 1 or self.replicas.internal_listen is not None
        if shared and self.security.secret is None:
            problems.append(
                "security.secret is required with store.url, replicas.internal_listen or workers > 1 "
                "(one secret for every replica)"
            )
        if self.workers > 1 and self.store.url is None:
            problems.append("workers > 1 needs store.url: each worker is a replica sharing the store")
        if self.workers > 1 and self.downstream.sse.enabled and self.replicas.internal_listen is None:
            problems.append(
                "downstream.sse.enabled with workers > 1 needs replicas.internal_listen: an HTTP+SSE client's "
                "POST may reach any worker and is replayed to the one holding its stream "
                "(or set downstream.sse.enabled: false)"
            )
        if problems:
            raise ValueError("; and ".join(problems))
        return self

    @model_validator(mode="after")
    def _client_token_stays(self) -> Settings:
        # The spec forbids passing a token through to a resource it was not issued for.
        if self.auth.mode == "resource_server" and "forward_authorization" in self.upstream.model_fields_set:
            if self.upstream.forward_authorization:
                raise ValueError(
                    "auth.mode resource_server never forwards the client's token: "
                    "upstream.forward_authorization must not be true (give the upstream its own credentials "
                    "in upstream.headers)"
                )
        return self

    @model_validator(mode="after")
    def _one_audience(self) -> Settings:
        # A request one replica forwards to another is verified there again, and there its Host is
        # the internal listener's: an audience derived from the Host would not be the client's.
        if self.auth.issuers and self.replicas.internal_listen is not None:
            if self.auth.public_url is None and self.auth.audience is None:
                raise ValueError(
                    "auth.issuers with replicas.internal_listen needs auth.public_url (or auth.audience): "
                    "every replica must verify tokens for the same audience"
                )
        return self

    @model_validator(mode="after")
    def _worker_ports(self) -> Settings:
        """Under --workers, worker i listens on the admin and internal ports + i (proxy/cluster/workers.py):
        those ranges must exist and not overlap each other or the shared MCP port."""
        if self.workers == 1:
            return self
        for name, address in (("listen", self.listen), ("admin_listen", self.admin_listen)):
            if address is not None and parse_listen(address)[1] == 0:
                raise ValueError(f"{name}: port 0 with {self.workers} workers: the workers must share one known port")
        ranges = {"listen": range(self.listen_address[1], self.listen_address[1] + 1)}
        for name, address in (
            ("admin_listen", self.admin_listen),
            ("replicas.internal_listen", self.replicas.internal_listen),
            ("replicas.advertise", self.replicas.advertise),
        ):
            if address is None:
                continue
            port = parse_listen(address)[1]
            last = port + self.workers - 1
            if last > 65535:
                raise ValueError(f"{name}: with {self.workers} workers its ports {port}..{last} pass 65535")
            if name != "replicas.advertise":  # another host's port: it may equal one of ours
                ranges[name] = range(port, port + self.workers)
        names = list(ranges)
        for i, first in enumerate(names):
            for second in names[i + 1 :]:
                a, b = ranges[first], ranges[second]
                if a.start < b.stop and b.start < a.stop:
                    raise ValueError(
                        f"with {self.workers} workers, {first} ({_ports(a)}) and {second} ({_ports(b)}) overlap: "
                        "worker i listens on the admin and internal ports + i"
                    )
        return self

    @property
    def listen_address(self) -> tuple[str, int]:
        return parse_listen(self.listen)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The YAML source reads `yaml_file` from model_config: set per load, see load_settings.
        return (init_settings, env_settings, YamlConfigSettingsSource(settings_cls))


def _ports(ports: range) -> str:
    return f"port {ports.start}" if len(ports) == 1 else f"ports {ports.start}..{ports.stop - 1}"


# Header names whose values are credentials: hidden by `shown`, whatever the rest of the name.
_CREDENTIAL_HEADER_WORDS = ("auth", "cookie", "key", "token", "secret", "password", "session", "signature")
HIDDEN = "<set, hidden>"


def shown(settings: Settings) -> dict[str, Any]:
    """Every setting, as `--check-config` prints it: secrets, credential headers and the password of
    a URL are there but hidden, so an operator can see that they are set without reading them."""
    data = settings.model_dump(mode="json")
    security = data["security"]
    security["secret"] = HIDDEN if settings.security.secret is not None else None
    security["previous_secrets"] = [HIDDEN for _ in settings.security.previous_secrets]
    for section in ("upstream", "tracing"):
        headers = data[section].get("headers") or {}
        for name in headers:
            if any(word in name.lower() for word in _CREDENTIAL_HEADER_WORDS):
                headers[name] = HIDDEN
    for section, key in (("upstream", "url"), ("upstream", "sse_url"), ("store", "url"), ("tracing", "otlp_endpoint")):
        value = data.get(section, {}).get(key)
        if isinstance(value, str):
            data[section][key] = _without_password(value)
    return data


def exposed_without_authorization(settings: Settings) -> bool:
    """The MCP endpoint listens beyond loopback and the proxy checks no token: only the upstream's
    own authorization (if it has any) stands between a caller and the server (warned at start)."""
    return not is_loopback_host(settings.listen_address[0]) and settings.auth.mode != "resource_server"


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    return parts._replace(netloc=f"{user}{HIDDEN}@{parts.netloc.rsplit('@', 1)[1]}").geturl()


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build Settings from flags (`overrides`, dotted keys allowed), env and the YAML file."""
    settings_cls: type[Settings] = Settings
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        _check_yaml(path)

        class FileSettings(Settings):
            model_config = SettingsConfigDict(yaml_file=path)

        settings_cls = FileSettings
    _check_environment()
    nested: dict[str, Any] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        target = nested
        *parents, leaf = key.split(".")
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = value
    _one_upstream_kind(nested)
    try:
        return settings_cls(**nested)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"]) or "config"
            lines.append(f"  {where}: {_explained(error)}")
        raise ConfigError("invalid configuration:\n" + "\n".join(lines)) from None


_NO_UPSTREAM = (
    "no upstream given: pass --upstream URL (Streamable HTTP), --upstream-command 'CMD ARGS' (stdio) or "
    "--upstream-sse URL (HTTP+SSE), or set upstream.url, upstream.command or upstream.sse_url "
    "(in the file, or as MCP_ERA_PROXY_UPSTREAM__URL ...)"
)


def _explained(error: Any) -> str:
    """pydantic's message, said in the proxy's terms where it is terse: the missing upstream names
    its flags; an unknown key says so, with the closest known one."""
    loc = tuple(str(p) for p in error["loc"])
    if error["type"] == "missing" and loc == ("upstream",):
        return _NO_UPSTREAM
    if error["type"] == "extra_forbidden":
        known = _keys_at(loc[:-1])
        close = difflib.get_close_matches(loc[-1], known, n=1)
        return "unknown setting" + (f"; did you mean {'.'.join((*loc[:-1], close[0]))}?" if close else "")
    message: str = error["msg"]
    return message.removeprefix("Value error, ")


def _keys_at(path: tuple[str, ...]) -> list[str]:
    """The setting names under `path` (a section's keys; the top level for ())."""
    model: Any = Settings
    for name in path:
        field = model.model_fields.get(name)
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


_UPSTREAM_KINDS = ("url", "command", "sse_url")


def _one_upstream_kind(nested: dict[str, Any]) -> None:
    """The upstream is chosen as a whole: the source of highest precedence that names one kind of
    upstream (flags, then the environment) replaces the kinds the sources below it name, so
    `--upstream URL` overrides a file's `upstream.command` instead of clashing with it. Explicit
    None in the flags' layer (the highest) unsets them."""
    flags = nested.get("upstream", {})
    chosen = {kind for kind in _UPSTREAM_KINDS if flags.get(kind) is not None}
    if not chosen:
        environment = {name.upper() for name, value in os.environ.items() if value}
        chosen = {kind for kind in _UPSTREAM_KINDS if f"{ENV_PREFIX}UPSTREAM__{kind.upper()}" in environment}
    if chosen:
        upstream = nested.setdefault("upstream", {})
        for kind in _UPSTREAM_KINDS:
            if kind not in chosen:
                upstream[kind] = None


def _check_yaml(path: Path) -> None:
    """The file is YAML with a mapping at the top. pydantic-settings reads it again, but would answer
    a syntax error or a list with a traceback instead of the file's name and line."""
    import yaml  # only for a config file (pydantic-settings' YAML source imports it then too)

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"invalid configuration: cannot read {path}: {exc}") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        raise ConfigError(f"invalid configuration: {_yaml_problem(path, exc)}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid configuration: {path}: {exc}") from None
    finally:
        loader.dispose()
    if node is not None and not isinstance(node, yaml.MappingNode):
        kind = "a list" if isinstance(node, yaml.SequenceNode) else "a single value"
        raise ConfigError(
            f"invalid configuration: {path}, line {node.start_mark.line + 1}: the top level must be a mapping "
            f"of settings (such as `upstream:`), not {kind}"
        )


def _yaml_problem(path: Path, exc: yaml.MarkedYAMLError) -> str:
    """Where the construct that failed starts (the context), then what went wrong and where."""

    def at(mark: yaml.Mark) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}"

    start = exc.context_mark or exc.problem_mark
    where = f"{path}, {at(start)}" if start is not None else str(path)
    problem = exc.problem or "not valid YAML"
    if exc.context and exc.context_mark is not None and exc.problem_mark is not None:
        problem += f" ({exc.context}; found at {at(exc.problem_mark)})"
    elif exc.context:
        problem += f" ({exc.context})"
    return f"{where}: {problem}"


def _check_environment() -> None:
    """A misspelt MCP_ERA_PROXY_* variable is an error named by the variable, not a silently
    ignored setting, nor one pydantic would report by the setting it spells (`upstream.ulr`)."""
    for name in os.environ:
        if not name.upper().startswith(ENV_PREFIX):
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        for depth, key in enumerate(path):
            known = _keys_at(tuple(path[:depth]))
            if not known:  # below a setting (a map such as upstream.headers): keys of its value
                break
            if key not in known:
                raise ConfigError(f"unknown environment variable {name} ({_env_hint(path, depth, known)})")


def _env_hint(path: list[str], depth: int, known: list[str]) -> str:
    """The variable closest to one whose key at `depth` is misspelt, and the settings there."""
    section, key, rest = path[:depth], path[depth], path[depth + 1 :]
    close = difflib.get_close_matches(key, known, n=1)
    hint = ""
    if close:
        spelt = ENV_PREFIX + "__".join((*section, close[0], *rest)).upper()
        hint = f"did you mean {spelt}{'__...' if not rest and _keys_at((*section, close[0])) else ''}? "
    where = f"settings of {'.'.join(section)}" if section else "settings"
    return f"{hint}{where}: {', '.join(sorted(known))}"


class ConfigError(ValueError):
    """A configuration problem, with a message meant for the operator."""


__all__ = [
    "ConfigError",
    "Settings",
    "exposed_without_authorization",
    "is_loopback_host",
    "load_settings",
    "parse_listen",
    "shown",
]
