"""The signed `requestState` tokens that resume parked legacy calls (docs/translation.md §4.5;
proxy/protocol/request_state.py). The clock is injected: no sleeps."""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
import re

import pytest

from proxy.protocol.request_state import (
    RequestStateCodec,
    StateClaims,
    b64url,
    new_park_id,
    params_digest,
    unb64url,
)

SECRET = b"s3cret-of-the-proxy"
LABEL = b"mcp-era-proxy/requestState/v1"
NOW = 1_700_000_000.25
TTL_S = 600.0
PARAMS = {"name": "deploy", "arguments": {"env": "prod", "replicas": 3}}
_ABSENT = object()  # a claim left out of `claims_json`


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def codec(secret: bytes = SECRET, clock: Clock | None = None, instance: str = "inst-1") -> RequestStateCodec:
    return RequestStateCodec(secret, instance, clock or Clock())


def mint(subject: RequestStateCodec, principal: str = "alice", round_: int = 1, ttl_s: float = TTL_S) -> str:
    return subject.mint("park-1", principal, "tools/call", params_digest(PARAMS), round_, ttl_s)


def sign(payload: bytes, secret: bytes = SECRET) -> str:
    """A token as the design note specifies it, built independently of the codec."""
    key = hmac.new(secret, LABEL, hashlib.sha256).digest()
    mac = hmac.new(key, payload, hashlib.sha256).digest()[:16]
    return b64url(payload) + "." + b64url(mac)


def claims_json(**overrides: object) -> dict:
    claims = {
        "v": 1,
        "pid": "park-1",
        "sub": "alice",
        "m": "tools/call",
        "d": params_digest(PARAMS),
        "r": 1,
        "exp": NOW + TTL_S,
        "inst": "inst-1",
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


def test_a_minted_token_verifies_to_its_claims():
    subject = codec()
    token = mint(subject, round_=3)
    assert subject.verify(token) == StateClaims(
        park_id="park-1",
        principal="alice",
        method="tools/call",
        digest=params_digest(PARAMS),
        round=3,
        expires=NOW + TTL_S,
        instance="inst-1",
    )


def test_a_token_is_base64url_claims_dot_a_truncated_hmac_under_a_derived_key():
    token = mint(codec())
    body, mac = token.split(".")
    payload = unb64url(body)
    assert json.loads(payload) == claims_json()
    assert len(unb64url(mac)) == 16
    assert token == sign(payload)
    assert re.fullmatch(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+", token)


def test_the_expiry_is_now_plus_the_ttl_rounded_to_milliseconds():
    token = codec(clock=Clock(100.0)).mint("p", "alice", "tools/call", "d", 1, 0.12345)
    assert json.loads(unb64url(token.split(".")[0]))["exp"] == 100.123


def test_a_token_is_still_valid_just_before_it_expires():
    clock = Clock()
    subject = codec(clock=clock)
    token = mint(subject)
    clock.now = NOW + TTL_S - 0.001
    assert subject.verify(token) is not None


@pytest.mark.parametrize("late_by", [0.0, 0.001, 1.0, 86400.0])
def test_an_expired_token_is_refused(late_by):
    clock = Clock()
    subject = codec(clock=clock)
    token = mint(subject)
    clock.now = NOW + TTL_S + late_by
    assert subject.verify(token) is None


def test_a_token_minted_with_another_secret_is_refused():
    assert codec(SECRET).verify(mint(codec(b"another secret"))) is None


def test_a_token_signed_with_the_raw_secret_instead_of_the_derived_key_is_refused():
    payload = json.dumps(claims_json()).encode()
    mac = hmac.new(SECRET, payload, hashlib.sha256).digest()[:16]
    assert codec().verify(b64url(payload) + "." + b64url(mac)) is None
    assert codec().verify(sign(payload)) is not None


@pytest.mark.parametrize(
    "change",
    [
        {"sub": "mallory"},
        {"r": 2},
        {"pid": "park-2"},
        {"m": "prompts/get"},
        {"exp": NOW + 10 * TTL_S},
    ],
)
def test_a_token_whose_claims_were_altered_is_refused(change):
    subject = codec()
    body, mac = mint(subject).split(".")
    claims = json.loads(unb64url(body))
    assert b64url(json.dumps(claims, separators=(",", ":")).encode()) == body  # the re-encoding is exact
    forged = b64url(json.dumps({**claims, **change}, separators=(",", ":")).encode()) + "." + mac
    assert subject.verify(forged) is None


@pytest.mark.parametrize("position", [0, 7, 15])
def test_a_token_whose_mac_was_altered_is_refused(position):
    subject = codec()
    body, mac = mint(subject).split(".")
    raw = bytearray(unb64url(mac))
    raw[position] ^= 0x01
    assert subject.verify(body + "." + b64url(bytes(raw))) is None


@pytest.mark.parametrize("length", [0, 8, 15])
def test_a_token_with_a_truncated_mac_is_refused(length):
    subject = codec()
    body, mac = mint(subject).split(".")
    assert subject.verify(body + "." + b64url(unb64url(mac)[:length])) is None


def _token_of_length(target: int) -> str:
    subject = codec()
    for size in range(1, 4096):
        token = mint(subject, principal="a" * size)
        if len(token) == target:
            return token
    raise AssertionError(f"no token of {target} characters")


def test_a_valid_token_up_to_4096_characters_verifies():
    # base64url never yields 4073 characters, so 4095 is the longest token under the bound.
    token = _token_of_length(4095)
    assert codec().verify(token) is not None


def test_a_token_over_4096_characters_is_refused_even_with_a_good_mac():
    token = _token_of_length(4097)
    assert token == sign(unb64url(token.split(".")[0]))
    assert codec().verify(token) is None


@pytest.mark.parametrize("token", [None, 5, 1.5, b"abc.def", ["a", "b"], {"t": "a.b"}, True])
def test_a_token_that_is_not_a_string_is_refused(token):
    assert codec().verify(token) is None


def test_a_token_without_a_dot_is_refused():
    token = mint(codec())
    assert codec().verify(token.replace(".", "")) is None
    assert codec().verify(token.split(".")[0]) is None
    assert codec().verify("") is None


@pytest.mark.parametrize(
    "token_of",
    [
        lambda body, mac: f"{body}!.{mac}",
        lambda body, mac: f"{body}.{mac}!",
        lambda body, mac: f"{body} .{mac}",
        lambda body, mac: f"{body}.{mac}.{mac}",
        lambda body, mac: f"{body}.{mac}\n",
        lambda body, mac: f"{body}.é{mac}",
        lambda body, mac: ".",
    ],
)
def test_a_token_whose_parts_are_not_base64url_is_refused(token_of):
    subject = codec()
    body, mac = mint(subject).split(".")
    assert subject.verify(token_of(body, mac)) is None


def _non_canonical(text: str) -> str:
    """The same bytes spelled differently: the unused low bits of the last character set."""
    assert len(text) % 4 in (2, 3)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    return text[:-1] + alphabet[alphabet.index(text[-1]) + 1]


@pytest.mark.parametrize(
    "respell",
    [
        lambda body, mac: f"{body}.{mac}==",
        lambda body, mac: f"{body}.{_non_canonical(mac)}",
        lambda body, mac: f"{body}.{mac.replace('-', '+').replace('_', '/')}",
    ],
)
def test_a_token_spelled_in_non_canonical_base64_is_refused_though_its_bytes_are_right(respell):
    subject = codec()
    # A principal whose MAC holds a `-` or `_`, so that the standard-alphabet spelling differs.
    token = next(t for t in (mint(subject, principal=f"p{i}") for i in range(200)) if set("-_") & set(t.split(".")[1]))
    body, mac = token.split(".")
    respelled = respell(body, mac)
    assert respelled != token
    assert base64.b64decode(respelled.split(".")[1] + "==", altchars=b"-_") == unb64url(mac)
    assert subject.verify(respelled) is None
    assert subject.verify(token) is not None


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"\xff\xfe",
        b"",
        b"[1, 2]",
        b'"claims"',
        b"42",
        b"null",
    ],
)
def test_a_signed_payload_that_is_not_a_claims_object_is_refused(payload):
    assert codec().verify(sign(payload)) is None


@pytest.mark.parametrize("claim", ["pid", "sub", "m", "d", "r", "exp", "inst"])
def test_a_signed_payload_lacking_a_claim_is_refused(claim):
    assert codec().verify(sign(json.dumps(claims_json(**{claim: _ABSENT})).encode())) is None


@pytest.mark.parametrize(
    "change",
    [
        {"r": "first"},
        {"r": None},
        {"r": [1]},
        {"r": {"n": 1}},
        {"r": True},
        {"r": 1.5},
        {"exp": "tomorrow"},
        {"exp": None},
        {"exp": [NOW]},
        {"exp": True},
        {"pid": 5},
        {"sub": ["alice"]},
        {"m": None},
        {"d": 7},
        {"inst": {}},
    ],
)
def test_a_signed_payload_with_claims_of_the_wrong_type_is_refused(change):
    assert codec().verify(sign(json.dumps(claims_json(**change)).encode())) is None


@pytest.mark.parametrize("version", [2, 0, "1", None, _ABSENT])
def test_a_signed_payload_of_another_format_version_is_refused(version):
    assert codec().verify(sign(json.dumps(claims_json(v=version)).encode())) is None


def test_a_hand_signed_payload_of_the_documented_shape_verifies():
    claims = codec().verify(sign(json.dumps(claims_json(r=4)).encode()))
    assert claims is not None
    assert (claims.park_id, claims.principal, claims.round) == ("park-1", "alice", 4)


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


def test_tokens_of_a_previous_secret_still_verify_while_a_new_one_rolls_out() -> None:
    clock = Clock()
    old = RequestStateCodec(b"old-secret-of-16-chars", "inst-1", clock)
    token = old.mint("park-1", "alice", "tools/call", params_digest(PARAMS), 0, TTL_S)
    rotated = RequestStateCodec(SECRET, "inst-2", clock, previous=[b"old-secret-of-16-chars"])
    claims = rotated.verify(token)
    assert claims is not None and claims.park_id == "park-1" and claims.principal == "alice"
    assert codec().verify(token) is None  # the old secret dropped: its tokens with it
    assert old.verify(rotated.mint("park-2", "alice", "tools/call", "d", 0, TTL_S)) is None  # minted with the new one
