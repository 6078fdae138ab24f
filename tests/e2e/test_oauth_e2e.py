"""OAuth through the proxy with real components (issue 13's acceptance), both eras, both models.

The authorization server is the mcp SDK's own auth routes with a provider of ours (JWTs, JWKS);
the upstreams are SDK servers of each era on the SDKs' resource-server support; the clients are the
SDKs' own OAuth providers (discovery from the 401, dynamic registration, PKCE, refresh). Model (a),
passthrough: the upstream accepts tokens whose audience is the proxy's public URL and sees the
client's token. Model (b), resource_server: the proxy verifies the client's token and calls the
upstream with a token of its own, so the upstream's `whoami` names the proxy's subject.

Controls run each client straight against its own era's protected server (a modern-only server
refuses a legacy client, so the cross-era pairs exist only through the proxy).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support import legacy_client, modern_client
from tests.support.mcp_client import Endpoint, answer_to
from tests.support.oauth import (
    AuthServer,
    auth_server,
    metadata_url,
    protected_server,
    proxy,
    proxy_log,
    reserve_proxy_url,
    run_client,
    steps_ok,
)
from tests.support.procs import PortTaken, wait_for

pytestmark = pytest.mark.e2e

USER = "alice"  # the subject the authorization server authorizes
PROXY_SUBJECT = "era-proxy"  # model (b): the subject of the proxy's own upstream token
OTHER = "mallory"
ELICIT_ANSWER = {"action": "accept", "content": {"name": "Ada"}}
# (client, server): the Python SDK clients across and within eras, the TypeScript SDK client across.
PAIRS = [
    ("legacy", "modern"),
    ("modern", "legacy"),
    ("legacy", "legacy"),
    ("modern", "modern"),
    ("ts-legacy", "modern"),
    ("ts-modern", "legacy"),
]


@dataclass
class Deployment:
    model: str  # "passthrough" | "resource_server"
    url: str  # the proxy's public URL (what clients use)
    upstream: str

    @property
    def resource_metadata(self) -> str:
        return metadata_url(self.url)


@pytest.fixture(scope="module")
def issuer(logs_dir: Path) -> Iterator[AuthServer]:
    with auth_server(logs_dir, user=USER) as server:
        yield server


@pytest.fixture(scope="module")
def deploy(issuer: AuthServer, logs_dir: Path) -> Iterator[Callable[..., Deployment]]:
    """A proxy in front of a protected server of `era` in `model`, started once per module."""
    started: dict[tuple[str, str, bool, bool], Deployment] = {}
    with ExitStack() as stack:

        def get(model: str, era: str, *, bad_metadata: bool = False, detect: bool = False) -> Deployment:
            key = (model, era, bad_metadata, detect)
            for attempt in range(3):  # the proxy's port is chosen first: another if it was taken meanwhile
                if key in started:
                    break
                try:
                    started[key] = deploy_one(model, era, bad_metadata, detect)
                except PortTaken:
                    if attempt == 2:
                        raise
            return started[key]

        def deploy_one(model: str, era: str, bad_metadata: bool, detect: bool) -> Deployment:
            with ExitStack() as attempt:
                url = reserve_proxy_url()
                auth = {
                    "upstream__era": "auto" if detect else era,
                    "auth__mode": model,
                    "auth__public_url": url,
                    "auth__issuers": json.dumps([issuer.issuer]),
                }
                if model == "passthrough":  # the upstream accepts tokens issued for the proxy's URL
                    upstream = attempt.enter_context(
                        protected_server(era, issuer, logs_dir, audiences=[url], bad_metadata=bad_metadata)
                    )
                else:  # the upstream accepts only tokens for itself: the proxy's own
                    upstream = attempt.enter_context(protected_server(era, issuer, logs_dir, bad_metadata=bad_metadata))
                    own = issuer.mint(sub=PROXY_SUBJECT, aud=upstream, client_id="era-proxy", ttl=3600)
                    auth["upstream__headers"] = json.dumps({"Authorization": f"Bearer {own}"})
                attempt.enter_context(proxy(url, upstream, logs_dir, **auth))
                stack.enter_context(attempt.pop_all())  # kept until the module ends
                return Deployment(model, url, upstream)

        yield get


def whoami(step: dict[str, Any]) -> dict[str, Any]:
    assert step["call"] == "whoami", step
    answer: dict[str, Any] = json.loads(step["text"])
    return answer


def first_challenge(observed: dict[str, Any], url: str) -> str:
    """The WWW-Authenticate of the first 401 the client got from `url`."""
    for exchange in observed["http"]:
        if exchange["url"] == url and exchange["status"] == 401:
            challenge: str = exchange["wwwAuthenticate"] or ""
            return challenge
    raise AssertionError(f"no 401 from {url}: {json.dumps(observed['http'], indent=1)}")


def assert_discovered_through(observed: dict[str, Any], deployment: Deployment, issuer: AuthServer) -> None:
    """Discovery ran against the proxy's origin only: its challenge, its metadata, then the AS."""
    assert f'resource_metadata="{deployment.resource_metadata}"' in first_challenge(observed, deployment.url)
    fetched = [(e["method"], e["url"], e["status"]) for e in observed["http"]]
    assert ("GET", deployment.resource_metadata, 200) in fetched, fetched
    upstream_origin = deployment.upstream.rsplit("/", 1)[0]
    assert not [u for _, u, _ in fetched if u.startswith(upstream_origin)], "the client reached the upstream"
    assert observed["grants"][0] == "authorization_code", observed["grants"]


# ------------------------------------------------------------------------------------ controls


@pytest.mark.parametrize(
    ("client", "era"), [("legacy", "legacy"), ("modern", "modern"), ("ts-legacy", "legacy"), ("ts-modern", "modern")]
)
def test_control_each_client_straight_against_its_protected_server(
    client: str, era: str, issuer: AuthServer, logs_dir: Path
) -> None:
    with protected_server(era, issuer, logs_dir) as upstream:
        observed = run_client(
            client, upstream, {"steps": [{"call": "whoami"}, {"call": "confirm", "arguments": {"message": "ok?"}}]}
        )
    who, confirmed = steps_ok(observed)
    assert f'resource_metadata="{metadata_url(upstream)}"' in first_challenge(observed, upstream)
    assert observed["grants"] == ["authorization_code"]
    assert whoami(who)["subject"] == USER and whoami(who)["aud"] == upstream
    assert confirmed["text"].startswith("confirmed: action=accept name=Ada"), confirmed


def test_control_a_refresh_keeps_the_legacy_session_straight_against_the_legacy_server(
    issuer: AuthServer, logs_dir: Path
) -> None:
    with protected_server("legacy", issuer, logs_dir) as upstream:
        steps = [{"call": "calls"}, {"refresh": True}, {"call": "calls"}]
        observed = run_client("legacy", upstream, {"steps": steps})
    before, after = steps_ok(observed)
    assert observed["grants"] == ["authorization_code", "refresh_token"] and len(observed["tokens"]) == 2
    assert observed["sessionIds"] == [observed["sessionId"]] and int(after["text"]) == int(before["text"]) + 1


# ------------------------------------------------------------------------ model (a): passthrough


@pytest.mark.parametrize(("client", "server"), PAIRS)
def test_passthrough_discovery_authorization_and_tool_call(
    client: str, server: str, deploy: Callable[..., Deployment], issuer: AuthServer
) -> None:
    deployment = deploy("passthrough", server)
    observed = run_client(
        client, deployment.url, {"steps": [{"call": "whoami"}, {"call": "confirm", "arguments": {"message": "ok?"}}]}
    )
    who, confirmed = steps_ok(observed)
    assert_discovered_through(observed, deployment, issuer)
    # The upstream saw the client's own token, issued for the proxy's URL (RFC 8707 resource).
    assert whoami(who)["subject"] == USER and whoami(who)["aud"] == deployment.url
    assert confirmed["text"].startswith("confirmed: action=accept name=Ada"), confirmed


@pytest.mark.parametrize(("client", "server"), [("legacy", "modern"), ("modern", "legacy")])
def test_passthrough_detects_the_era_of_a_protected_upstream(
    client: str, server: str, deploy: Callable[..., Deployment], issuer: AuthServer
) -> None:
    """upstream.era auto: the proxy learns the era of an upstream that answers 401 until authorized."""
    deployment = deploy("passthrough", server, detect=True)
    observed = run_client(client, deployment.url, {"steps": [{"call": "whoami"}]})
    (who,) = steps_ok(observed)
    assert_discovered_through(observed, deployment, issuer)
    assert whoami(who)["subject"] == USER and whoami(who)["aud"] == deployment.url


# -------------------------------------------------------------------- model (b): resource_server


@pytest.mark.parametrize(("client", "server"), PAIRS)
def test_resource_server_discovery_authorization_and_tool_call_with_the_proxys_own_token(
    client: str, server: str, deploy: Callable[..., Deployment], issuer: AuthServer
) -> None:
    deployment = deploy("resource_server", server)
    observed = run_client(
        client, deployment.url, {"steps": [{"call": "whoami"}, {"call": "confirm", "arguments": {"message": "ok?"}}]}
    )
    who, confirmed = steps_ok(observed)
    assert_discovered_through(observed, deployment, issuer)
    # The upstream saw the proxy's token, never the client's.
    assert whoami(who)["subject"] == PROXY_SUBJECT and whoami(who)["aud"] == deployment.upstream
    assert confirmed["text"].startswith("confirmed: action=accept name=Ada"), confirmed
    assert PROXY_SUBJECT in confirmed["text"]


# ------------------------------------------------------------------------- bad tokens, bad metadata


def bad_token(issuer: AuthServer, kind: str, audience: str) -> str:
    if kind == "expired":  # well past any clock-skew leeway
        return issuer.mint(sub=USER, aud=audience, ttl=-600)
    if kind == "forged":  # signed by another key under the issuer's kid
        return issuer.mint(sub=USER, aud=audience, forged=True)
    if kind == "wrong_audience":
        return issuer.mint(sub=USER, aud="http://127.0.0.1:9/elsewhere")
    if kind == "other_issuer":
        return issuer.mint(sub=USER, aud=audience, iss="http://127.0.0.1:9/")
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["expired", "forged", "wrong_audience", "other_issuer"])
@pytest.mark.parametrize(
    ("model", "server"),
    [
        ("passthrough", "legacy"),
        ("passthrough", "modern"),
        ("resource_server", "legacy"),
        ("resource_server", "modern"),
    ],
)
def test_a_bad_token_gets_401_with_the_proxys_challenge(
    kind: str, model: str, server: str, deploy: Callable[..., Deployment], issuer: AuthServer
) -> None:
    deployment = deploy(model, server)
    endpoint = Endpoint(deployment.url, authorization=f"Bearer {bad_token(issuer, kind, deployment.url)}")
    for reply in (legacy_client.initialize(endpoint), modern_client.call(endpoint, 1, "tools/list")):
        assert reply.status == 401, (reply.status, reply.body[:500])
        challenge = reply.header("www-authenticate") or ""
        assert challenge.startswith("Bearer "), challenge
        assert f'resource_metadata="{deployment.resource_metadata}"' in challenge, challenge
        assert 'error="invalid_token"' in challenge, challenge


def test_no_token_gets_401_with_the_proxys_challenge_in_both_models(
    deploy: Callable[..., Deployment],
) -> None:
    for model in ("passthrough", "resource_server"):
        deployment = deploy(model, "legacy")
        reply = legacy_client.initialize(Endpoint(deployment.url))
        assert reply.status == 401, (model, reply.status, reply.body[:500])
        assert f'resource_metadata="{deployment.resource_metadata}"' in (reply.header("www-authenticate") or "")


def test_malformed_upstream_metadata_gets_a_502_json_error(deploy: Callable[..., Deployment], logs_dir: Path) -> None:
    deployment = deploy("passthrough", "legacy", bad_metadata=True)
    for path in (urlsplit(deployment.resource_metadata).path, "/.well-known/oauth-protected-resource"):
        reply = Endpoint(deployment.url).get(path)
        assert reply.status == 502, (path, reply.status, reply.body[:500])
        assert reply.content_type == "application/json", reply.headers
        body = json.loads(reply.body)
        assert "error" in body and b"Traceback" not in reply.body, body
    log = proxy_log(logs_dir, deployment.url)
    logged = wait_for(lambda: "oauth_metadata_invalid" in log.read_text(), 10)  # a line lands a few ms later
    assert logged, log.read_text()[-2000:]


# ------------------------------------------------------------------------- refresh keeps the caller


@pytest.mark.parametrize("model", ["passthrough", "resource_server"])
@pytest.mark.parametrize("server", ["legacy", "modern"])
def test_a_token_refresh_in_the_middle_of_a_legacy_session_keeps_the_session(
    model: str, server: str, deploy: Callable[..., Deployment]
) -> None:
    deployment = deploy(model, server)
    middle = [{"call": "calls"}] if server == "legacy" else []  # the upstream session counts its calls
    steps = [*middle, {"call": "whoami"}, {"refresh": True}, *middle, {"call": "whoami"}]
    observed = run_client("legacy", deployment.url, {"steps": steps})
    calls = steps_ok(observed)
    assert observed["grants"] == ["authorization_code", "refresh_token"], observed["grants"]
    assert len(observed["tokens"]) == 2, "the session went on with a second, refreshed token"
    assert observed["sessionIds"] == [observed["sessionId"]] == [observed["sessionIdAtEnd"]]
    statuses = [e["status"] for e in observed["http"] if e["url"] == deployment.url]
    assert statuses.count(401) == 1 and 404 not in statuses, statuses  # only the first, unauthenticated one
    whos = [whoami(s) for s in calls if s["call"] == "whoami"]
    assert whos[0] == whos[1], whos
    if server == "legacy":
        counts = [int(s["text"]) for s in calls if s["call"] == "calls"]
        assert counts[1] == counts[0] + 2, counts  # the same upstream session went on counting


@pytest.mark.parametrize("model", ["passthrough", "resource_server"])
def test_a_parked_call_retried_with_a_refreshed_token_completes(model: str, deploy: Callable[..., Deployment]) -> None:
    deployment = deploy(model, "legacy")
    args = {"steps": [{"call": "confirm", "arguments": {"message": "ok?"}}], "during_elicitation": "refresh"}
    observed = run_client("modern", deployment.url, args)
    (confirmed,) = steps_ok(observed)
    assert confirmed["text"].startswith("confirmed: action=accept name=Ada"), confirmed
    assert observed["grants"] == ["authorization_code", "refresh_token"], observed["grants"]
    (retry,) = observed["retries"]
    assert retry["status"] == 200 and retry["token"] == observed["tokens"][-1] != observed["tokens"][0], observed


@pytest.mark.parametrize("model", ["passthrough", "resource_server"])
@pytest.mark.parametrize("server", ["legacy", "modern"])
def test_a_session_presented_with_another_subjects_token_is_refused(
    model: str, server: str, deploy: Callable[..., Deployment], issuer: AuthServer
) -> None:
    deployment = deploy(model, server)
    first = Endpoint(deployment.url, authorization=f"Bearer {issuer.mint(sub=USER, aud=deployment.url)}")
    session = legacy_client.open_session(first)
    refreshed = replace(first, authorization=f"Bearer {issuer.mint(sub=USER, aud=deployment.url)}")
    assert refreshed.authorization != first.authorization
    other = replace(first, authorization=f"Bearer {issuer.mint(sub=OTHER, aud=deployment.url)}")
    call = {"name": "echo", "arguments": {"text": "hi"}}

    kept = legacy_client.call(refreshed, session, 1, "tools/call", call)
    answer = answer_to(kept, 1)
    assert kept.status == 200 and answer is not None and "result" in answer, (kept.status, kept.body[:500])

    refused = legacy_client.call(other, session, 2, "tools/call", call)
    assert 400 <= refused.status < 500, (refused.status, refused.body[:500])
    assert (answer_to(refused, 2) or {}).get("result") is None, refused.body[:500]

    again = legacy_client.call(first, session, 3, "tools/call", call)  # the refusal did not end the owner's session
    assert again.status == 200 and "result" in (answer_to(again, 3) or {}), (again.status, again.body[:500])


@pytest.mark.parametrize("model", ["passthrough", "resource_server"])
@pytest.mark.parametrize("server", ["legacy", "modern"])
def test_a_parked_call_retried_with_another_subjects_token_is_refused(
    model: str, server: str, deploy: Callable[..., Deployment], issuer: AuthServer
) -> None:
    """A modern client's input round: parked at the proxy in front of the legacy server (the
    proxy's requestState), or the modern server's own requestState relayed as it is."""
    deployment = deploy(model, server)
    asker = Endpoint(deployment.url, authorization=f"Bearer {issuer.mint(sub=USER, aud=deployment.url)}")
    capabilities = {"elicitation": {"form": {}}}
    call = {"name": "confirm", "arguments": {"message": "ok?"}}
    parked = modern_client.call(asker, 1, "tools/call", call, capabilities)
    result = (answer_to(parked, 1) or {}).get("result") or {}
    assert parked.status == 200 and result.get("resultType") == "input_required", (parked.status, parked.body[:800])
    retry = {**call, "inputResponses": dict.fromkeys(result["inputRequests"], ELICIT_ANSWER)}
    retry["requestState"] = result["requestState"]

    other = replace(asker, authorization=f"Bearer {issuer.mint(sub=OTHER, aud=deployment.url)}")
    refused = modern_client.call(other, 2, "tools/call", retry, capabilities)
    refused_answer = answer_to(refused, 2) or {}
    assert "confirmed:" not in json.dumps(refused_answer), refused.body[:800]
    assert refused.status >= 400 or "error" in refused_answer, (refused.status, refused.body[:800])
    assert refused.status != 500

    refreshed = replace(asker, authorization=f"Bearer {issuer.mint(sub=USER, aud=deployment.url)}")
    done = modern_client.call(refreshed, 3, "tools/call", retry, capabilities)
    final = (answer_to(done, 3) or {}).get("result") or {}
    text = "".join(c.get("text", "") for c in final.get("content", []))
    assert done.status == 200 and text.startswith("confirmed: action=accept name=Ada"), (done.status, done.body[:800])
