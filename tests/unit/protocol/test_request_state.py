"""The sealed `requestState` tokens that resume parked legacy calls (docs/translation.md §4.5;
proxy/protocol/request_state.py), with the edge's real Sealer injected. The clock is injected:
no sleeps."""

from __future__ import annotations

import copy
import hashlib
import json
import re

import pytest

from proxy.protocol.jsonrpc import b64url, unb64url
from proxy.protocol.request_state import (
    PURPOSE,
    ParkIds,
    RequestStateCodec,
    StateClaims,
    new_park_id,
    params_digest,
)
from proxy.state.sealing import Sealer

SECRET = b"s3cret-of-the-proxy"
NOW = 1_700_000_000.25
TTL_S = 600.0
PARAMS = {"name": "deploy", "arguments": {"env": "prod", "replicas": 3}}
BOOT, ADDRESS = "0123456789abcdef", "10.0.0.7:8081"
_ABSENT = object()  # a claim left out of `claims_json`


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def sealer(secret: bytes = SECRET, clock: Clock | None = None, previous: tuple[bytes, ...] = ()) -> Sealer:
    return Sealer(secret, previous, clock or Clock())


def codec(
    secret: bytes = SECRET,
    clock: Clock | None = None,
    boot: str = BOOT,
    address: str | None = ADDRESS,
    previous: tuple[bytes, ...] = (),
) -> RequestStateCodec:
    clock = clock or Clock()
    return RequestStateCodec(sealer(secret, clock, previous), boot, address, clock)


def mint(subject: RequestStateCodec, principal: str = "alice", round_: int = 1, ttl_s: float = TTL_S) -> str:
    return subject.mint("park-1", principal, "tools/call", params_digest(PARAMS), round_, ttl_s)


def seal(payload: bytes, principal: str = "alice", secret: bytes = SECRET) -> str:
    """A token sealed by hand as the design note specifies it: the claims, the principal as aad."""
    return sealer(secret).seal(PURPOSE, payload, principal.encode())


def claims_json(**overrides: object) -> dict:
    claims = {
        "v": 2,
        "pid": "park-1",
        "m": "tools/call",
        "d": params_digest(PARAMS),
        "r": 1,
        "exp": NOW + TTL_S,
        "own": [BOOT, ADDRESS],
    }
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not _ABSENT}


# ---------------------------------------------------------------- params digest


def test_the_digest_is_the_first_128_bits_of_sha256_over_the_sorted_salient_params():
    params = {"b": [1, {"z": 1, "a": 2}], "a": "x", "_meta": {"progressToken": 1}}
    canonical = json.dumps({"a": "x", "b": [1, {"a": 2, "z": 1}]}, sort_keys=True, separators=(",", ":"))
    assert params_digest(params) == hashlib.sha256(canonical.encode()).hexdigest()[:32]
    assert re.fullmatch(r"[0-9a-f]{32}", params_digest(params))


def test_the_digest_ignores_key_order_at_every_depth():
    one = {"name": "t", "arguments": {"a": 1, "b": {"x": 1, "y": 2}}}
    two = {"arguments": {"b": {"y": 2, "x": 1}, "a": 1}, "name": "t"}
    assert params_digest(one) == params_digest(two)


def test_the_digest_of_params_orjson_cannot_write_is_made_all_the_same():
    """An integer beyond 64 bits is valid JSON: a call with one can park and resume."""
    params = {"name": "t", "arguments": {"n": 123456789012345678901234567890}}
    assert params_digest(params) == params_digest({"arguments": {"n": 123456789012345678901234567890}, "name": "t"})
    assert params_digest(params) != params_digest({"name": "t", "arguments": {"n": 1}})


def test_the_digest_ignores_the_mrtr_fields_and_meta():
    retry = {**PARAMS, "_meta": {"progressToken": "x"}, "inputResponses": {"s1": {}}, "requestState": "tok"}
    assert params_digest(retry) == params_digest(PARAMS)


@pytest.mark.parametrize(
    "other",
    [
        {**PARAMS, "arguments": {"env": "staging", "replicas": 3}},
        {**PARAMS, "name": "destroy"},
        {**PARAMS, "task": {"ttl": 1}},
        {"name": "deploy"},
    ],
)
def test_the_digest_changes_with_any_salient_param(other):
    assert params_digest(other) != params_digest(PARAMS)


@pytest.mark.parametrize("params", [None, [1, 2], "params", 5])
def test_params_that_are_not_an_object_digest_as_empty_params(params):
    assert params_digest(params) == params_digest({}) == params_digest({"_meta": {"k": 1}})


def test_the_digest_leaves_its_input_alone():
    params = {**PARAMS, "_meta": {"progressToken": 1}, "requestState": "t"}
    snapshot = copy.deepcopy(params)
    params_digest(params)
    assert params == snapshot


# ---------------------------------------------------------------- mint and verify


def test_a_minted_token_verifies_to_its_claims_and_names_its_owner():
    subject = codec()
    token = mint(subject, round_=3)
    claims = subject.verify(token, "alice")
    assert claims == StateClaims(
        park_id="park-1",
        principal="alice",
        method="tools/call",
        digest=params_digest(PARAMS),
        round=3,
        expires=NOW + TTL_S,
        boot=BOOT,
        address=ADDRESS,
    )
    assert subject.is_local(claims)
    assert re.fullmatch(r"[A-Za-z0-9_-]+", token)


def test_a_token_is_sealed_claims_that_nobody_can_read():
    token = mint(codec(), principal="alice@example.com")
    raw = unb64url(token)
    for secret_part in (b"park-1", b"tools/call", ADDRESS.encode(), BOOT.encode(), b"alice"):
        assert secret_part not in raw
    opened = sealer().open(PURPOSE, token, b"alice@example.com")
    assert opened is not None and json.loads(opened) == claims_json()


def test_a_token_of_a_replica_without_an_address_names_only_its_boot():
    subject = codec(address=None)
    claims = subject.verify(mint(subject), "alice")
    assert claims is not None and (claims.boot, claims.address) == (BOOT, None)


def test_another_replicas_token_verifies_and_is_not_local():
    """Replicas share the secret: B reads A's token, and sees it is A's."""
    clock = Clock()
    a, b = codec(clock=clock), codec(clock=clock, boot="fedcba9876543210", address="10.0.0.8:8081")
    claims = b.verify(mint(a), "alice")
    assert claims is not None and not b.is_local(claims)
    assert (claims.boot, claims.address) == (BOOT, ADDRESS)


def test_the_expiry_is_now_plus_the_ttl_rounded_to_milliseconds():
    token = codec(clock=Clock(100.0)).mint("p", "alice", "tools/call", "d", 1, 0.12345)
    opened = sealer(clock=Clock(100.0)).open(PURPOSE, token, b"alice")
    assert opened is not None and json.loads(opened)["exp"] == 100.123


def test_a_token_is_still_valid_just_before_it_expires():
    clock = Clock()
    subject = codec(clock=clock)
    token = mint(subject)
    clock.now = NOW + TTL_S - 0.001
    assert subject.verify(token, "alice") is not None


@pytest.mark.parametrize("late_by", [0.0, 0.001, 1.0, 86400.0])
def test_an_expired_token_is_refused(late_by):
    clock = Clock()
    subject = codec(clock=clock)
    token = mint(subject)
    clock.now = NOW + TTL_S + late_by
    assert subject.verify(token, "alice") is None


def test_a_token_of_another_principal_is_refused():
    subject = codec()
    token = mint(subject, principal="alice")
    assert subject.verify(token, "mallory") is None
    assert subject.verify(token, "") is None
    assert subject.verify(token, "alice") is not None


def test_a_token_minted_with_another_secret_is_refused():
    assert codec(SECRET).verify(mint(codec(b"another secret")), "alice") is None


def test_a_token_sealed_for_another_purpose_is_refused():
    payload = json.dumps(claims_json()).encode()
    other = sealer().seal("sid", payload, b"alice")
    assert codec().verify(other, "alice") is None
    assert codec().verify(seal(payload), "alice") is not None


@pytest.mark.parametrize("position", [0, 3, 10, 30, -1])
def test_a_token_altered_anywhere_is_refused(position):
    subject = codec()
    raw = bytearray(unb64url(mint(subject)))
    raw[position] ^= 0x01
    assert subject.verify(b64url(bytes(raw)), "alice") is None


def test_a_truncated_token_is_refused():
    subject = codec()
    token = mint(subject)
    for cut in (1, 10, len(token) // 2, len(token) - 2):
        assert subject.verify(token[:cut], "alice") is None


def test_a_token_over_4096_characters_is_refused_even_when_intact():
    subject = codec()
    token = mint(subject, principal="a")
    long = seal(json.dumps(claims_json(m="x" * 4000)).encode())
    assert len(long) > 4096
    assert subject.verify(long, "alice") is None
    assert subject.verify(token, "a") is not None


@pytest.mark.parametrize("token", [None, 5, 1.5, b"abc.def", ["a", "b"], {"t": "a.b"}, True, "", "!!!"])
def test_a_token_that_is_not_a_sealed_string_is_refused(token):
    assert codec().verify(token, "alice") is None


def test_a_token_of_the_previous_hmac_format_is_refused():
    assert codec().verify(b64url(json.dumps(claims_json(v=1)).encode()) + "." + b64url(b"x" * 16), "alice") is None


@pytest.mark.parametrize("payload", [b"not json", b"\xff\xfe", b"", b"[1, 2]", b'"claims"', b"42", b"null"])
def test_a_sealed_payload_that_is_not_a_claims_object_is_refused(payload):
    assert codec().verify(seal(payload), "alice") is None


@pytest.mark.parametrize("claim", ["pid", "m", "d", "r", "exp", "own"])
def test_a_sealed_payload_lacking_a_claim_is_refused(claim):
    assert codec().verify(seal(json.dumps(claims_json(**{claim: _ABSENT})).encode()), "alice") is None


@pytest.mark.parametrize(
    "change",
    [
        {"r": "first"},
        {"r": None},
        {"r": True},
        {"r": 1.5},
        {"exp": "tomorrow"},
        {"exp": None},
        {"exp": True},
        {"pid": 5},
        {"m": None},
        {"d": 7},
        {"own": {}},
        {"own": [BOOT]},
        {"own": [BOOT, ADDRESS, 1]},
        {"own": [None, ADDRESS]},
        {"own": [BOOT, 8081]},
        {"own": "boot"},
    ],
)
def test_a_sealed_payload_with_claims_of_the_wrong_type_is_refused(change):
    assert codec().verify(seal(json.dumps(claims_json(**change)).encode()), "alice") is None


@pytest.mark.parametrize("version", [1, 3, 0, "2", None, _ABSENT])
def test_a_sealed_payload_of_another_format_version_is_refused(version):
    assert codec().verify(seal(json.dumps(claims_json(v=version)).encode()), "alice") is None


def test_a_hand_sealed_payload_of_the_documented_shape_verifies():
    claims = codec().verify(seal(json.dumps(claims_json(r=4)).encode()), "alice")
    assert claims is not None
    assert (claims.park_id, claims.principal, claims.round, claims.boot) == ("park-1", "alice", 4, BOOT)


def test_tokens_of_a_previous_secret_still_verify_while_a_new_one_rolls_out() -> None:
    clock = Clock()
    old = codec(b"old-secret-of-16-chars", clock)
    token = old.mint("park-1", "alice", "tools/call", params_digest(PARAMS), 0, TTL_S)
    rotated = codec(SECRET, clock, boot="fedcba9876543210", previous=(b"old-secret-of-16-chars",))
    claims = rotated.verify(token, "alice")
    assert claims is not None and claims.park_id == "park-1" and claims.principal == "alice"
    assert claims.boot == BOOT  # the owner survives the rotation
    assert codec(clock=clock).verify(token, "alice") is None  # the old secret dropped: its tokens with it
    assert old.verify(rotated.mint("park-2", "alice", "tools/call", "d", 0, TTL_S), "alice") is None


# ---------------------------------------------------------------- base64url


@pytest.mark.parametrize("raw", [b"", b"f", b"fo", b"foo", b"foob", b"\xfb\xff\xbf", bytes(range(256))])
def test_base64url_round_trips_without_padding(raw):
    text = b64url(raw)
    assert "=" not in text
    assert re.fullmatch(r"[A-Za-z0-9_-]*", text)
    assert unb64url(text) == raw


def test_base64url_uses_the_url_safe_alphabet():
    assert b64url(b"\xfb\xff\xbf") == "-_-_"


@pytest.mark.parametrize(
    "text",
    [
        "Zg==",  # padded
        "Zh",  # unused bits set: the canonical spelling of b"f" is "Zg"
        "Zm9=",
        "+/+/",  # standard alphabet
        "Z",  # a length no encoding has
        "Zg!",
        "Zm 9v",
        "Zm9v\n",
        "Zmé",
    ],
)
def test_unb64url_refuses_anything_but_the_canonical_spelling(text):
    with pytest.raises(ValueError):
        unb64url(text)


# ---------------------------------------------------------------- park ids


def test_park_ids_are_128_random_bits_in_base64url():
    park_id = new_park_id()
    assert len(unb64url(park_id)) == 16
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", park_id)


def test_park_ids_do_not_repeat():
    assert len({new_park_id() for _ in range(1000)}) == 1000


def test_a_relays_park_ids_share_its_random_prefix_and_count_up():
    ids = ParkIds()
    first, second = ids.next(), ids.next()
    prefix = first.removesuffix(".1")
    assert len(unb64url(prefix)) == 16 and second == f"{prefix}.2"
    assert ParkIds().next() != first  # another relay, another prefix
