"""Configuration sources, precedence and validation (proxy/config.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from proxy.config import (
    ENV_PREFIX,
    ConfigError,
    HttpTarget,
    Settings,
    SseTarget,
    StdioTarget,
    exposed_without_authorization,
    is_loopback_host,
    load_settings,
    parse_listen,
    shown,
)
from proxy.protocol.meta import LOG_LEVELS

REPO = Path(__file__).resolve().parents[2]
URL = "http://127.0.0.1:3000/mcp"
DEFAULT_LISTEN = Settings.model_fields["listen"].default


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.upper().startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no stray config or .env file from the working directory


def _yaml(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _env(monkeypatch, key: str, value: str) -> None:
    monkeypatch.setenv(ENV_PREFIX + key.upper().replace(".", "__"), value)


# ---------------------------------------------------------------- sources and precedence


def test_defaults_apply_when_only_the_upstream_url_is_given():
    settings = load_settings(**{"upstream.url": URL})
    assert settings.upstream.url == URL
    assert settings.listen == DEFAULT_LISTEN
    assert settings.listen_address == parse_listen(DEFAULT_LISTEN)
    assert settings.sessions.idle_timeout_s == Settings.model_fields["sessions"].default.idle_timeout_s


@pytest.mark.parametrize(
    ("upstream", "expected"),
    [
        ({"upstream.url": URL}, 4.0),
        ({"upstream.sse_url": "http://127.0.0.1:3000/sse"}, 4.0),
        ({"upstream.command": ["mcp-server"]}, 30.0),  # bounds the start-up of the server it starts
        ({"upstream.command": ["mcp-server"], "upstream.probe_timeout_s": 2}, 2.0),
    ],
)
def test_the_era_probe_waits_by_transport_unless_configured(upstream, expected):
    assert load_settings(**upstream).upstream.era_probe_timeout_s == expected


def test_the_flat_upstream_section_reads_as_the_typed_view_of_its_kind():
    assert load_settings(**{"upstream.url": URL}).upstream.target == HttpTarget(URL)
    sse = load_settings(**{"upstream.sse_url": "http://127.0.0.1:3000/sse"}).upstream
    assert sse.target == SseTarget("http://127.0.0.1:3000/sse", sse.sse)
    assert sse.transport == "sse"
    stdio = load_settings(
        **{"upstream.command": "mcp-server --flag", "upstream.env": {"A": "1"}, "upstream.cwd": "/srv"}
    ).upstream
    assert stdio.target == StdioTarget(("mcp-server", "--flag"), {"A": "1"}, "/srv", stdio.stdio)
    assert stdio.target.kind == stdio.transport == "stdio"


@pytest.mark.parametrize(
    ("yaml_value", "env_value", "flag_value", "expected"),
    [
        (None, None, None, DEFAULT_LISTEN),
        ("127.0.0.1:9001", None, None, "127.0.0.1:9001"),
        ("127.0.0.1:9001", "127.0.0.1:9002", None, "127.0.0.1:9002"),
        ("127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003", "127.0.0.1:9003"),
        (None, "127.0.0.1:9002", "127.0.0.1:9003", "127.0.0.1:9003"),
        ("127.0.0.1:9001", None, "127.0.0.1:9003", "127.0.0.1:9003"),
    ],
)
def test_flags_override_env_which_overrides_the_file_which_overrides_defaults(
    tmp_path, monkeypatch, yaml_value, env_value, flag_value, expected
):
    data: dict = {"upstream": {"url": URL}}
    if yaml_value is not None:
        data["listen"] = yaml_value
    if env_value is not None:
        _env(monkeypatch, "listen", env_value)
    settings = load_settings(_yaml(tmp_path, data), listen=flag_value)
    assert settings.listen == expected


def test_precedence_holds_for_nested_keys_too(tmp_path, monkeypatch):
    path = _yaml(tmp_path, {"upstream": {"url": URL}, "sessions": {"idle_timeout_s": 10}})
    assert load_settings(path).sessions.idle_timeout_s == 10
    _env(monkeypatch, "sessions.idle_timeout_s", "20")
    assert load_settings(path).sessions.idle_timeout_s == 20
    assert load_settings(path, **{"sessions.idle_timeout_s": 30}).sessions.idle_timeout_s == 30


def test_sources_merge_key_by_key_inside_a_section(tmp_path, monkeypatch):
    path = _yaml(tmp_path, {"upstream": {"url": "http://yaml.example/mcp", "name": "from-yaml"}})
    _env(monkeypatch, "upstream.url", "http://env.example/mcp")
    settings = load_settings(path, **{"upstream.request_timeout_s": 9.0})
    assert settings.upstream.url == "http://env.example/mcp"
    assert settings.upstream.name == "from-yaml"
    assert settings.upstream.request_timeout_s == 9.0


@pytest.mark.parametrize(
    ("upstream", "name"),
    [
        ({"upstream.url": "https://user:secret@mcp.example.com/mcp?key=k"}, "mcp.example.com"),
        ({"upstream.url": "http://127.0.0.1:3000/mcp"}, "127.0.0.1:3000"),
        ({"upstream.url": "http://[::1]:3000/mcp"}, "[::1]:3000"),
        ({"upstream.sse_url": "http://legacy.internal:8000/sse"}, "legacy.internal:8000"),
        ({"upstream.command": "npx -y @modelcontextprotocol/server-everything stdio"}, "npx"),
        ({"upstream.command": ["/opt/my servers/run server.sh", "--stdio"]}, "run_server.sh"),
        ({"upstream.url": "http://127.0.0.1:3000/mcp", "upstream.name": "billing"}, "billing"),
    ],
    ids=["credentials-and-path-left-out", "host-and-port", "ipv6", "sse", "program", "program-sanitized", "set"],
)
def test_the_upstream_is_named_by_its_host_and_port_or_its_program_unless_named(upstream, name):
    """It was named `upstream` whatever it was: errors read "upstream 'upstream' answered ..."."""
    settings = load_settings(None, **upstream)
    assert settings.upstream.name == name
    assert shown(settings)["upstream"]["name"] == name  # --check-config shows the name in use
    assert load_settings(None, **{**upstream, "upstream.name": name}).upstream.name == name  # a valid name


def test_flags_left_unset_do_not_hide_env_or_file_values(tmp_path, monkeypatch):
    path = _yaml(tmp_path, {"upstream": {"url": URL}, "path": "/from-yaml"})
    _env(monkeypatch, "listen", "127.0.0.1:9002")
    settings = load_settings(path, listen=None, path=None, **{"sessions.max_sessions": None})
    assert settings.listen == "127.0.0.1:9002"
    assert settings.path == "/from-yaml"


def test_the_upstream_url_can_come_from_the_environment_alone(monkeypatch):
    _env(monkeypatch, "upstream.url", URL)
    assert load_settings().upstream.url == URL


def test_the_shipped_example_config_is_valid_and_documents_the_defaults():
    example = REPO / "config" / "proxy.example.yaml"
    from_file = load_settings(example)
    defaults = load_settings(**{"upstream.url": from_file.upstream.url})
    assert from_file.model_dump() == defaults.model_dump()


def test_settings_are_frozen():
    settings = load_settings(**{"upstream.url": URL})
    with pytest.raises(ValidationError, match=r"(?i)frozen"):
        settings.listen = "0.0.0.0:1"  # type: ignore[misc]


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"upstream.url": "ftp://example.com/mcp"}, "upstream.url"),
        ({"upstream.url": "not a url"}, "upstream.url"),
        ({"upstream.name": "has space"}, "upstream.name"),
        ({"upstream.era": "future"}, "upstream.era"),
        ({"upstream.connect_timeout_s": 0}, "upstream.connect_timeout_s"),
        ({"listen": "no-port"}, "listen"),
        ({"listen": "127.0.0.1:70000"}, "listen"),
        ({"path": "mcp"}, "path"),
        ({"sessions.idle_timeout_s": -1}, "sessions.idle_timeout_s"),
        ({"sessions.max_sessions": "many"}, "sessions.max_sessions"),
        ({"sessions.default_log_level": "verbose"}, "sessions.default_log_level"),
        ({"security.secret": "short"}, "security.secret"),
        ({"security.max_json_depth": 8}, "security.max_json_depth"),
        ({"security.max_json_depth": 250}, "security.max_json_depth"),  # beyond what orjson writes again
        ({"logging.level": "trace"}, "logging.level"),
        ({"input.max_rounds": 0}, "input.max_rounds"),
    ],
)
def test_a_bad_flag_value_gives_a_readable_error_naming_the_field(overrides, field):
    with pytest.raises(ConfigError) as info:
        load_settings(**({"upstream.url": URL} | overrides))
    message = str(info.value)
    assert field in message
    assert "errors.pydantic.dev" not in message
    assert "Traceback" not in message


def test_an_unknown_log_level_error_lists_the_known_levels():
    with pytest.raises(ConfigError) as info:
        load_settings(**{"upstream.url": URL, "sessions.default_log_level": "verbose"})
    assert all(level in str(info.value) for level in LOG_LEVELS)


def test_no_upstream_names_the_flags_and_keys_that_give_one():
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert "Field required" not in message
    assert all(way in message for way in ("--upstream URL", "--upstream-command", "--upstream-sse", "upstream.url"))


def test_an_unknown_key_is_named_with_the_closest_known_one(tmp_path, monkeypatch):
    path = _yaml(tmp_path, {"upstream": {"url": URL, "request_timeout": 3}, "sesions": {}})
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    message = str(info.value)
    assert "Extra inputs" not in message
    assert "sesions: unknown setting; did you mean sessions?" in message
    assert "upstream.request_timeout: unknown setting; did you mean upstream.request_timeout_s?" in message
    _env(monkeypatch, "sesions.max_sessions", "3")
    with pytest.raises(ConfigError, match="did you mean MCP_ERA_PROXY_SESSIONS"):
        load_settings(**{"upstream.url": URL})


def test_every_missing_piece_of_a_multi_worker_setup_is_named_at_once():
    with pytest.raises(ConfigError) as info:
        load_settings(**{"upstream.url": URL, "workers": 2})
    message = str(info.value)
    assert "security.secret is required" in message and "workers > 1 needs store.url" in message


def test_a_bad_value_in_the_file_names_the_field(tmp_path):
    path = _yaml(tmp_path, {"upstream": {"url": URL}, "sessions": {"max_sessions": "many"}})
    with pytest.raises(ConfigError, match=r"sessions\.max_sessions"):
        load_settings(path)


def test_a_bad_value_in_the_environment_names_the_field(monkeypatch):
    _env(monkeypatch, "upstream.url", URL)
    _env(monkeypatch, "streams.keepalive_s", "often")
    with pytest.raises(ConfigError, match=r"streams\.keepalive_s"):
        load_settings()


def test_a_missing_upstream_url_is_reported():
    with pytest.raises(ConfigError, match="upstream"):
        load_settings()


def test_admin_listen_must_differ_from_listen():
    with pytest.raises(ConfigError, match="admin_listen"):
        load_settings(**{"upstream.url": URL, "listen": "127.0.0.1:8080", "admin_listen": "127.0.0.1:8080"})
    settings = load_settings(**{"upstream.url": URL, "admin_listen": "127.0.0.1:9090"})
    assert settings.admin_listen == "127.0.0.1:9090"


def test_a_missing_config_file_is_a_config_error_naming_it(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope\.yaml"):
        load_settings(missing)
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"upstream": {"url": URL}, "listn": "127.0.0.1:1"}, "listn"),
        ({"upstream": {"url": URL, "timeout": 3}}, "upstream.timeout"),
        ({"upstream": {"url": URL}, "sessions": {"idle_timeout": 3}}, "sessions.idle_timeout"),
        ({"upstream": {"url": URL}, "extras": {}}, "extras"),
    ],
)
def test_unknown_keys_in_the_file_are_rejected(tmp_path, data, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_settings(_yaml(tmp_path, data))


@pytest.mark.parametrize(("key", "field"), [("listn", "listn"), ("upstream.timeout", "upstream.timeout")])
def test_unknown_flag_keys_are_rejected(key, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_settings(**{"upstream.url": URL, key: "x"})


@pytest.mark.parametrize(
    ("key", "suggested"),
    [
        ("upstream.ulr", "MCP_ERA_PROXY_UPSTREAM__URL?"),
        ("upstream.pool.max_sesions", "MCP_ERA_PROXY_UPSTREAM__POOL__MAX_SESSIONS?"),
        ("upstraem.url", "MCP_ERA_PROXY_UPSTREAM__URL?"),
        ("upstream.timeout", None),
    ],
)
def test_an_unknown_nested_environment_variable_is_named_as_set(monkeypatch, key, suggested):
    """It was reported as the setting it would have been ("upstream.ulr: unknown setting"), which
    names no variable the operator can find."""
    _env(monkeypatch, "upstream.url", URL)
    _env(monkeypatch, key, "3")
    with pytest.raises(ConfigError) as refused:
        load_settings()
    message = str(refused.value)
    assert message.startswith(f"unknown environment variable {ENV_PREFIX}{key.upper().replace('.', '__')} (")
    assert "unknown setting" not in message
    if suggested is not None:
        assert f"did you mean {suggested}" in message


def test_variables_below_a_map_setting_are_its_keys_not_unknown_settings(monkeypatch):
    _env(monkeypatch, "upstream.url", URL)
    monkeypatch.setenv(f"{ENV_PREFIX}UPSTREAM__HEADERS__X_API_KEY", "k")
    assert load_settings().upstream.headers == {"x_api_key": "k"}


def test_unknown_top_level_environment_keys_are_rejected(monkeypatch):
    # A misspelt MCP_ERA_PROXY_* variable must not be silently ignored.
    _env(monkeypatch, "upstream.url", URL)
    _env(monkeypatch, "listn", "127.0.0.1:9002")
    with pytest.raises(ConfigError, match=r"(?i)listn"):
        load_settings()


# ---------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("localhost:1", ("localhost", 1)),
        ("[::1]:8443", ("::1", 8443)),
        (" 0.0.0.0:65535 ", ("0.0.0.0", 65535)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),  # any free port
    ],
)
def test_parse_listen_reads_host_and_port(value, expected):
    assert parse_listen(value) == expected


@pytest.mark.parametrize("value", ["", "8080", ":8080", "host:", "host:-1", "host:65536", "host:http", "[::1]8080"])
def test_parse_listen_rejects_malformed_addresses_with_an_example(value):
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen(value)


def test_port_0_is_accepted_for_the_listeners_of_one_process_only():
    settings = load_settings(**{"upstream.url": URL, "listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0"})
    assert (settings.listen, settings.admin_listen) == ("127.0.0.1:0", "127.0.0.1:0")  # two ports, chosen apart
    shared = {"upstream.url": URL, "workers": 2, "store.url": "redis://127.0.0.1:1/0", "security.secret": "s" * 32}
    shared["downstream.sse.enabled"] = False
    for name in ("listen", "admin_listen"):
        with pytest.raises(ConfigError, match=f"{name}: port 0 with 2 workers"):
            load_settings(**{**shared, name: "127.0.0.1:0"})
    for name in ("replicas.internal_listen", "replicas.advertise"):  # told to other replicas
        with pytest.raises(ConfigError, match="not 0"):
            load_settings(**{"upstream.url": URL, "security.secret": "s" * 32, name: "127.0.0.1:0"})


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("LOCALHOST", True),
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("example.com", False),
        ("localhost.example.com", False),
    ],
)
def test_loopback_hosts_are_recognised(host, loopback):
    assert is_loopback_host(host) is loopback


def test_previous_secrets_need_the_secret_that_replaces_them() -> None:
    with pytest.raises(ConfigError, match="previous_secrets needs secret"):
        load_settings(None, **{"upstream.url": "http://127.0.0.1:1/mcp", "security.previous_secrets": ["x" * 16]})
    with pytest.raises(ConfigError, match="at least 16"):
        load_settings(
            None,
            **{
                "upstream.url": "http://127.0.0.1:1/mcp",
                "security.secret": "s" * 16,
                "security.previous_secrets": ["short"],
            },
        )
    settings = load_settings(
        None,
        **{
            "upstream.url": "http://127.0.0.1:1/mcp",
            "security.secret": "s" * 16,
            "security.previous_secrets": ["o" * 16],
        },
    )
    assert settings.security.previous_secrets == ["o" * 16]


def test_replicas_verifying_tokens_need_one_configured_audience() -> None:
    base = {
        "upstream.url": "http://127.0.0.1:9/mcp",
        "security.secret": "s" * 32,
        "replicas.internal_listen": "127.0.0.1:9100",
        "auth.issuers": ["https://as.example"],
    }
    with pytest.raises(ConfigError, match=r"auth\.public_url \(or auth\.audience\)"):
        load_settings(None, **base)
    assert load_settings(None, **base, **{"auth.public_url": "https://mcp.example.com/mcp"}).auth.issuers
    assert load_settings(None, **base, **{"auth.audience": "api://mcp"}).auth.issuers
    assert load_settings(None, **{**base, "auth.issuers": []}).auth.issuers == []


@pytest.mark.parametrize(
    ("listen", "mode", "exposed"),
    [
        ("127.0.0.1:8080", "passthrough", False),
        ("[::1]:8080", "passthrough", False),
        ("0.0.0.0:8080", "passthrough", True),
        ("10.1.2.3:8080", "passthrough", True),
        ("0.0.0.0:8080", "resource_server", False),
    ],
)
def test_listening_beyond_loopback_without_token_checks_is_flagged_for_a_warning(listen, mode, exposed):
    overrides = {"upstream.url": URL, "listen": listen, "auth.mode": mode}
    if mode == "resource_server":
        overrides["auth.issuers"] = ["https://issuer.example"]
    assert exposed_without_authorization(load_settings(**overrides)) is exposed
