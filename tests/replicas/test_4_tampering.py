"""Tokens through three replicas: a session id or a requestState changed by one character, or
presented by another caller (another Authorization), is refused by every replica (404 for a session,
HTTP 400 -32602 for a requestState), while the genuine token goes on working on every replica; and
each replica's internal listener refuses what no replica sealed."""

from __future__ import annotations

import pytest

from tests.support import legacy_client, tally
from tests.support.raw_http_client import build, exchange
from tests.support.replicas import Cluster

from .flows import answer, ask, flipped, legacy_call

pytestmark = [pytest.mark.e2e, pytest.mark.replicas]

TRIES = 6  # each refusal, tried this many times (twice on each replica in round-robin)
INVALID_PARAMS = -32602


def positions(token: str) -> list[int]:
    """Where to change a character: spread over the token, so every part of it is covered."""
    return [round(i * (len(token) - 1) / (TRIES - 1)) for i in range(TRIES)]


def test_a_tampered_session_id_is_refused_and_the_genuine_one_works_everywhere(l2m: Cluster):
    ep = l2m.endpoint()
    session = legacy_client.open_session(ep)
    tampered = [legacy_call(ep, flipped(session, at)) for at in positions(session)]
    genuine = [legacy_call(ep, session) for _ in range(len(l2m.replicas))]
    refused = sum(o.kind == "lost" for o in tampered)
    tally.replicas("tamper", f"tamper: session id {refused}/{TRIES} refused", append=True)
    assert [o for o in tampered if o.kind != "lost"] == []
    assert [o for o in genuine if o.kind != "ok"] == []


def test_a_session_id_presented_with_another_authorization_is_refused(l2m: Cluster):
    alice, mallory = l2m.endpoint(authorization="Bearer alice"), l2m.endpoint(authorization="Bearer mallory")
    session = legacy_client.open_session(alice)
    stolen = [legacy_call(mallory, session) for _ in range(TRIES)]
    genuine = [legacy_call(alice, session) for _ in range(len(l2m.replicas))]
    refused = sum(o.kind == "lost" for o in stolen)
    tally.replicas("tamper", f"another caller's session {refused}/{TRIES}", append=True)
    assert [o for o in stolen if o.kind != "lost"] == []
    assert [o for o in genuine if o.kind != "ok"] == []


def test_a_tampered_or_another_callers_request_state_is_refused_and_the_call_goes_on(m2l: Cluster):
    alice, mallory = m2l.endpoint(authorization="Bearer alice"), m2l.endpoint(authorization="Bearer mallory")
    state, requests = ask(alice)
    bad = [answer(alice, flipped(state, at), requests) for at in positions(state)]
    bad += [answer(mallory, state, requests) for _ in range(TRIES)]
    final = answer(alice, state, requests)  # the parked call was left intact by the refusals
    refused = [o for o in bad if o.kind == "error" and o.status == 400 and o.error.get("code") == INVALID_PARAMS]
    tally.replicas("tamper", f"requestState (tampered, another caller's) {len(refused)}/{len(bad)}", append=True)
    assert len(refused) == len(bad), [o for o in bad if o not in refused][:3]
    assert final.kind == "ok" and final.result.get("resultType", "complete") == "complete", final
    assert "Ada" in str(final.result["content"]), final


# What reaches an internal listener from anyone but a replica: no envelope, a forged one, a client's
# own MCP request, on the replay path and beside it.
FORGED_BODIES = [b"", b"not-a-sealed-envelope", b"v2." + b"A" * 400, b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}']
INTERNAL_PATHS = ["/_mep/v1/replay", "/mcp", "/"]


def test_the_internal_listener_refuses_what_no_replica_sealed(l2m: Cluster):
    """Each replica's internal listener (replicas.internal_listen) is up, and answers every request
    it did not mint with a 4xx JSON refusal, never serving it; the replica goes on serving."""
    tried = refused = 0
    for replica in l2m.replicas:
        for path in INTERNAL_PATHS:
            for body in FORGED_BODIES:
                headers: list[tuple[str, bytes | str]] = [("Content-Type", "application/json")]
                reply = exchange(replica.internal_port, build("POST", path, headers, body), timeout=10)
                tried += 1
                refused += 400 <= reply.status < 500 and reply.content_type == "application/json"
    ep = l2m.endpoint()
    after = [legacy_call(ep, legacy_client.open_session(ep)) for _ in range(len(l2m.replicas))]
    tally.replicas("tamper", f"internal {refused}/{tried} refused", append=True)
    assert refused == tried
    assert [o for o in after if o.kind != "ok"] == []
