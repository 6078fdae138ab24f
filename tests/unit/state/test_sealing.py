"""The one sealing primitive: what it opens, what it refuses, and rotation."""

from __future__ import annotations

import pytest

from proxy.protocol.jsonrpc import b64url, unb64url
from proxy.state.sealing import Sealer

SECRET = b"s" * 32
OLD = b"o" * 32


def test_round_trip_with_purpose_and_associated_data() -> None:
    sealer = Sealer(SECRET)
    token = sealer.seal("sid", b"payload", b"alice")
    assert sealer.open("sid", token, b"alice") == b"payload"
    assert b"payload" not in unb64url(token)  # sealed, not merely signed


@pytest.mark.parametrize(
    ("purpose", "aad"),
    [("rst", b"alice"), ("sid", b"bob"), ("sid", b"")],
    ids=["other-purpose", "other-caller", "no-caller"],
)
def test_other_context_is_refused(purpose: str, aad: bytes) -> None:
    sealer = Sealer(SECRET)
    token = sealer.seal("sid", b"payload", b"alice")
    assert sealer.open(purpose, token, aad) is None


def test_every_flipped_byte_is_refused() -> None:
    sealer = Sealer(SECRET)
    raw = bytearray(unb64url(sealer.seal("sid", b"payload", b"a")))
    for i in range(len(raw)):
        tampered = bytearray(raw)
        tampered[i] ^= 0x01
        assert sealer.open("sid", b64url(bytes(tampered)), b"a") is None, i


@pytest.mark.parametrize("token", [None, 7, "", "!!", "a" * 9000, b64url(b"short")])
def test_garbage_is_refused(token: object) -> None:
    assert Sealer(SECRET).open("sid", token) is None


def test_rotation_opens_old_tokens_and_mints_with_the_new_secret() -> None:
    old = Sealer(OLD)
    rotated = Sealer(SECRET, previous=[OLD])
    assert rotated.open("sid", old.seal("sid", b"x")) == b"x"
    assert old.open("sid", rotated.seal("sid", b"y")) is None  # minted with the new secret only
    assert Sealer(SECRET).open("sid", old.seal("sid", b"x")) is None  # rotation over: refused


def test_tokens_of_an_earlier_day_still_open() -> None:
    now = [1_000_000.0]
    sealer = Sealer(SECRET, clock=lambda: now[0])
    token = sealer.seal("sid", b"x")
    now[0] += 3 * 86_400  # a new day key mints now; the token's own day key still opens it
    assert sealer.open("sid", token) == b"x"


def test_nonces_differ() -> None:
    sealer = Sealer(SECRET)
    assert len({sealer.seal("sid", b"same") for _ in range(100)}) == 100
