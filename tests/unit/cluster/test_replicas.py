"""proxy/cluster/ without a network: server-to-client request ids, replay envelopes, which
headers a replay carries, and when a token names another replica to forward to."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, cast

import pytest

from proxy.cluster.envelope import ENVELOPE_TTL_S, Envelope, open_envelope, replayed_headers, seal_envelope
from proxy.cluster.forward import Forwarder
from proxy.cluster.owners import Owner, OwnerTokens, ServerRequestIds, new_boot_id
from proxy.cluster.replay import _SERVED_MAX, ReplayEndpoint
from proxy.config import load_settings
from proxy.downstream.legacy_sse import LegacySseEndpoint
from proxy.metrics import Metrics
from proxy.protocol.request_state import RequestStateCodec
from proxy.state.sealing import Sealer
from proxy.state.sessions import short_hash

SECRET = b"replicas-secret-0123456789"
NOW = 1_800_000_000.0
A = Owner("a" * 16, "10.0.0.1:8081")
B = Owner("b" * 16, "10.0.0.2:8081")


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def sealer(secret: bytes = SECRET, previous: tuple[bytes, ...] = ()) -> Sealer:
    return Sealer(secret, previous, Clock())


# ---------------------------------------------------------------- boot ids


def test_boot_ids_are_16_random_hex_characters() -> None:
    ids = {new_boot_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(re.fullmatch(r"[0-9a-f]{16}", boot) for boot in ids)


# ---------------------------------------------------------------- server-to-client request ids


def test_a_server_request_id_names_the_replica_that_sent_it_to_any_replica() -> None:
    request_id = ServerRequestIds(sealer(), A).mint("session-1", 3)
    assert isinstance(request_id, str) and re.fullmatch(r"[A-Za-z0-9_-]+", request_id)
    assert ServerRequestIds(sealer(), B).owner_of(request_id, "session-1") == A


def test_server_request_ids_never_repeat_and_reveal_nothing() -> None:
    ids = ServerRequestIds(sealer(), A)
    minted = [ids.mint("session-1", n) for n in (1, 1, 2)]
    assert len(set(minted)) == 3  # a fresh nonce each time
    assert all(A.address not in token and A.boot not in token for token in minted)


def test_a_server_request_id_of_another_session_names_nobody() -> None:
    request_id = ServerRequestIds(sealer(), A).mint("session-1", 1)
    assert ServerRequestIds(sealer(), B).owner_of(request_id, "session-2") is None


@pytest.mark.parametrize("forged", [1, None, "", "1", "not-a-token", "A" * 200, ["x"], {"id": 1}, True])
def test_an_id_the_proxy_did_not_seal_names_nobody(forged: Any) -> None:
    assert ServerRequestIds(sealer(), A).owner_of(forged, "session-1") is None


def test_an_altered_or_foreign_server_request_id_names_nobody() -> None:
    request_id = ServerRequestIds(sealer(), A).mint("session-1", 1)
    altered = request_id[:-2] + ("AA" if request_id[-2:] != "AA" else "BB")
    assert ServerRequestIds(sealer(), A).owner_of(altered, "session-1") is None
    assert ServerRequestIds(sealer(b"other-secret-0123456789"), A).owner_of(request_id, "session-1") is None
    # Sealed for another purpose (a replay envelope, say), the same bytes are no server request id.
    other_purpose = sealer().seal("fwd", b'["' + A.boot.encode() + b'",null,1]', short_hash("session-1").encode())
    assert ServerRequestIds(sealer(), A).owner_of(other_purpose, "session-1") is None


def test_a_server_request_id_survives_a_secret_rotation() -> None:
    request_id = ServerRequestIds(sealer(b"old-secret-0123456789"), A).mint("s", 1)
    rotated = ServerRequestIds(sealer(SECRET, (b"old-secret-0123456789",)), B)
    assert rotated.owner_of(request_id, "s") == A


# Minted with Sealer(b"k" * 32) on the day of PINNED_NOW by the code before OwnerTokens served
# both: a token a client holds across an upgrade must still open.
PINNED_NOW = 1_780_000_000.0
PINNED_OWNER = Owner("b00700000000cafe", "10.0.0.7:9001")
PINNED_SERVER_REQUEST_ID = (
    "sTVQed3Vf49zeMl6LH2amPCakboHSSZY7RvwUJ8qyUcwi_K79_P2yIqIb78VnqnBso8R01_mo8m05MIjQwIiAHPBxCddlA"
)
PINNED_SSE_SESSION = (  # for the principal "alice", key "k" * 32
    "sTVQeWR1lHTytDLOJy6X8d_drnF4sYO2qI96_DkEPwMW8JmhlgXiTW89tyJcZMyJoPczhaTHFQdl7Exc8bv4giCJNsUipYcV123fjVuMas-RF3n5dj0S_E5dygxoBQqmw8koCYUpGg"
)


def pinned_sealer() -> Sealer:
    return Sealer(b"k" * 32, (), Clock(PINNED_NOW))


def test_a_server_request_id_minted_by_an_earlier_release_still_names_its_replica() -> None:
    ids = ServerRequestIds(pinned_sealer(), A)
    assert ids.owner_of(PINNED_SERVER_REQUEST_ID, "session-1") == PINNED_OWNER
    assert ids.owner_of(PINNED_SERVER_REQUEST_ID, "session-2") is None
    tokens = OwnerTokens(pinned_sealer(), A, "srq", int)
    assert tokens.open(PINNED_SERVER_REQUEST_ID, short_hash("session-1").encode()) == (PINNED_OWNER, 3)
    assert (
        OwnerTokens(pinned_sealer(), A, "srq", str).open(PINNED_SERVER_REQUEST_ID, short_hash("session-1").encode())
        is None
    )


def test_an_sse_session_id_minted_by_an_earlier_release_still_opens_for_its_caller_only() -> None:
    settings = load_settings(None, **{"upstream.url": "http://127.0.0.1:1/mcp"})
    endpoint = LegacySseEndpoint(settings, {}, cast(Any, None), pinned_sealer(), A, cast(Any, None), Metrics())
    assert endpoint._open(PINNED_SSE_SESSION, "alice") == (PINNED_OWNER, "k" * 32)
    assert endpoint._open(PINNED_SSE_SESSION, "bob") is None
    # And one minted now opens the same way (the format did not move).
    assert endpoint._open(endpoint._seal("key-1", "alice"), "alice") == (A, "key-1")


def test_an_owner_token_of_another_purpose_or_value_type_opens_for_nothing() -> None:
    token = OwnerTokens(sealer(), A, "one", str).mint("v", b"ctx")
    assert OwnerTokens(sealer(), B, "one", str).open(token, b"ctx") == (A, "v")
    assert OwnerTokens(sealer(), B, "two", str).open(token, b"ctx") is None
    assert OwnerTokens(sealer(), B, "one", int).open(token, b"ctx") is None
    assert OwnerTokens(sealer(), B, "one", str).open(token, b"other") is None


def test_a_replica_without_an_address_names_only_its_boot() -> None:
    lonely = Owner("c" * 16, None)
    request_id = ServerRequestIds(sealer(), lonely).mint("s", 1)
    assert ServerRequestIds(sealer(), A).owner_of(request_id, "s") == lonely


# ---------------------------------------------------------------- envelopes

ENVELOPE = Envelope("POST", [("Content-Type", "application/json"), ("Mcp-Session-Id", "s-1")], b'{"jsonrpc":"2.0"}')


OPENED = dataclasses.replace(ENVELOPE, expires=NOW + ENVELOPE_TTL_S)


def test_an_envelope_opens_for_its_target_until_it_expires() -> None:
    token = seal_envelope(sealer(), A.boot, ENVELOPE, NOW)
    assert open_envelope(sealer(), A.boot, token, NOW) == OPENED
    assert open_envelope(sealer(), A.boot, token, NOW + ENVELOPE_TTL_S - 0.01) == OPENED
    assert open_envelope(sealer(), A.boot, token, NOW + ENVELOPE_TTL_S) is None


def test_an_envelope_opens_for_no_other_boot() -> None:
    token = seal_envelope(sealer(), A.boot, ENVELOPE, NOW)
    assert open_envelope(sealer(), B.boot, token, NOW) is None


def test_an_envelope_holds_any_body_bytes() -> None:
    body = bytes(range(256)) * 4
    envelope = Envelope("GET", [], body)
    opened = open_envelope(sealer(), A.boot, seal_envelope(sealer(), A.boot, envelope, NOW), NOW)
    assert opened is not None and (opened.method, opened.headers, opened.body) == ("GET", [], body)


def test_a_tampered_or_foreign_envelope_is_refused() -> None:
    token = seal_envelope(sealer(), A.boot, ENVELOPE, NOW)
    for position in (0, 5, 20, len(token) // 2, len(token) - 3):
        altered = token[:position] + ("A" if token[position] != "A" else "B") + token[position + 1 :]
        assert open_envelope(sealer(), A.boot, altered, NOW) is None
    assert open_envelope(sealer(b"other-secret-0123456789"), A.boot, token, NOW) is None
    assert open_envelope(sealer(), A.boot, token[:-4], NOW) is None
    for junk in ("", "x", None, 5, "A" * 100):
        assert open_envelope(sealer(), A.boot, junk, NOW) is None


@pytest.mark.parametrize(
    "head",
    [
        b'{"exp": 1900000000, "m": "PUT", "h": []}',
        b'{"exp": 1900000000, "m": "POST", "h": [["a"]]}',
        b'{"exp": 1900000000, "m": "POST", "h": [["a", 1]]}',
        b'{"exp": "later", "m": "POST", "h": []}',
        b'{"m": "POST", "h": []}',
        b"[1, 2]",
        b"not json",
    ],
)
def test_a_sealed_envelope_of_the_wrong_shape_is_refused(head: bytes) -> None:
    token = sealer().seal("fwd", len(head).to_bytes(4, "big") + head + b"body", A.boot.encode())
    assert open_envelope(sealer(), A.boot, token, NOW) is None


def test_a_replay_carries_the_headers_the_endpoint_reads_and_no_others() -> None:
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "Mcp-Session-Id": "s-1",
        "MCP-Protocol-Version": "2025-11-25",
        "Mcp-Method": "tools/call",
        "Authorization": "Bearer alice",
        "X-User": "alice",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "Last-Event-ID": "7",
        "Host": "proxy.example.com",
        "Origin": "https://evil.example.com",
        "Cookie": "a=b",
        "Content-Length": "17",
        "X-Forwarded-For": "1.2.3.4",
    }
    kept = dict(replayed_headers(headers, "X-User"))
    assert set(kept) == {
        "Accept",
        "Content-Type",
        "Mcp-Session-Id",
        "MCP-Protocol-Version",
        "Mcp-Method",
        "Authorization",
        "X-User",
        "traceparent",
        "Last-Event-ID",
    }
    assert "X-User" not in dict(replayed_headers(headers, None))


# ---------------------------------------------------------------- the forwarding decision


def forwarder(owner: Owner) -> tuple[Forwarder, RequestStateCodec]:
    settings = load_settings(
        None,
        **{
            "upstream.url": "http://127.0.0.1:1/mcp",
            "security.secret": SECRET.decode(),
            "replicas.internal_listen": owner.address,
        }
        if owner.address
        else {"upstream.url": "http://127.0.0.1:1/mcp"},
    )
    clock = Clock()
    seal = Sealer(SECRET, (), clock)
    codec = RequestStateCodec(seal, owner.boot, owner.address, clock)
    return Forwarder(settings, seal, owner, codec, ServerRequestIds(seal, owner), Metrics(), clock), codec


def test_a_request_state_of_another_replica_is_forwarded_to_it() -> None:
    _, codec_a = forwarder(A)
    b, codec_b = forwarder(B)
    token = codec_a.mint("p", "alice", "tools/call", "d", 0, 60.0)
    assert b.state_owner(token, "alice") == A
    assert b.state_owner(token, "mallory") is None  # not this caller's: never forwarded
    assert b.state_owner(codec_b.mint("p", "alice", "tools/call", "d", 0, 60.0), "alice") is None  # its own
    assert b.state_owner("garbage", "alice") is None


def test_a_token_naming_no_address_is_not_forwarded() -> None:
    lonely, codec = forwarder(Owner("c" * 16, None))
    b, _ = forwarder(B)
    assert not lonely.enabled
    token = codec.mint("p", "alice", "tools/call", "d", 0, 60.0)
    assert b.state_owner(token, "alice") is None


def test_a_replica_without_an_address_never_forwards() -> None:
    _, codec_a = forwarder(A)
    lonely, _ = forwarder(Owner("c" * 16, None))
    assert lonely.state_owner(codec_a.mint("p", "alice", "tools/call", "d", 0, 60.0), "alice") is None
    assert lonely.request_owner(ServerRequestIds(sealer(), A).mint("s", 1), "s") is None


def test_an_answer_to_another_replicas_request_is_forwarded_to_it() -> None:
    b, _ = forwarder(B)
    assert b.request_owner(ServerRequestIds(sealer(), A).mint("s", 1), "s") == A
    assert b.request_owner(ServerRequestIds(sealer(), A).mint("s", 1), "other-session") is None
    assert b.request_owner(b.server_ids.mint("s", 1), "s") is None  # its own
    assert b.request_owner(7, "s") is None


def test_the_replay_endpoint_serves_each_envelope_once_until_it_expires() -> None:
    clock = Clock()
    endpoint = ReplayEndpoint(sealer(), A, {}, clock)
    assert endpoint._first_use(b"one", NOW + 30)
    assert not endpoint._first_use(b"one", NOW + 30)
    assert endpoint._first_use(b"two", NOW + 30)
    clock.now = NOW + 30  # expired: forgotten (an expired envelope never opens anyway)
    assert endpoint._first_use(b"one", NOW + 60)
    assert endpoint._served == {b"one": NOW + 60}


def test_the_replay_endpoint_remembers_a_bounded_number_of_envelopes() -> None:
    endpoint = ReplayEndpoint(sealer(), A, {}, Clock())
    for n in range(_SERVED_MAX + 10):
        assert endpoint._first_use(n.to_bytes(4, "big"), NOW + 30)
    assert len(endpoint._served) <= _SERVED_MAX
    assert not endpoint._first_use((_SERVED_MAX + 9).to_bytes(4, "big"), NOW + 30)  # the newest still known
