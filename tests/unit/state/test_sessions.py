"""Sealed legacy session ids and the in-memory session store (proxy/state/sessions.py)."""

from __future__ import annotations

import pytest

from proxy.state.sealing import Sealer
from proxy.state.sessions import (
    MAX_CORE_BYTES,
    InMemorySessionStore,
    LegacySession,
    SessionCore,
    SessionIds,
    principal_of,
    short_hash,
)

SECRET = b"0123456789abcdef0123456789abcdef"
LIFETIME = 3600.0
START = 1_800_000_000


class FakeClock:
    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _ids(clock: FakeClock | None = None, secret: bytes = SECRET, previous: tuple[bytes, ...] = ()) -> SessionIds:
    clock = clock or FakeClock()
    return SessionIds(Sealer(secret, previous, clock), LIFETIME, clock=clock)


ALICE = principal_of("Bearer alice-token")
BOB = principal_of("Bearer bob-token")


# ---------------------------------------------------------------- ids


def test_minted_ids_use_visible_ascii_only():
    ids = _ids()
    for _ in range(50):
        session_id = ids.mint(ALICE)
        assert session_id
        assert all(0x21 <= ord(c) <= 0x7E for c in session_id)


def test_minted_ids_are_unguessable_even_for_the_same_principal_and_instant():
    ids = _ids()
    minted = {ids.mint(ALICE) for _ in range(500)}
    assert len(minted) == 500


def test_an_id_checks_for_the_principal_it_was_minted_for():
    ids = _ids()
    assert ids.check(ids.mint(ALICE), ALICE)
    assert ids.check(ids.mint(""), "")


def test_an_id_fails_for_another_principal():
    ids = _ids()
    session_id = ids.mint(ALICE)
    assert not ids.check(session_id, BOB)
    assert not ids.check(session_id, "")
    assert not ids.check(ids.mint(""), ALICE)


def test_an_id_fails_under_another_secret():
    session_id = _ids().mint(ALICE)
    assert not _ids(secret=b"another-secret-of-enough-length!").check(session_id, ALICE)


def _flip(index: int):
    def tamper(session_id: str) -> str:
        c = session_id[index]
        return session_id[:index] + ("B" if c == "A" else "A") + session_id[index + 1 :]

    return tamper


TAMPERINGS = {
    "key id changed": _flip(0),
    "day changed": _flip(3),
    "nonce changed": _flip(10),
    "sealed core changed": _flip(40),
    "tag changed": _flip(-2),
    "truncated": lambda s: s[:-4],
    "extended": lambda s: s + "AAAA",
    "non-base64url char inserted": lambda s: s[:5] + "!" + s[5:],
    "padding appended": lambda s: s + "==",
    "doubled": lambda s: s * 2,
    "empty": lambda s: "",
    "old signed form": lambda s: s[:22] + "." + s[22:44],
}


@pytest.mark.parametrize("tamper", TAMPERINGS.values(), ids=TAMPERINGS.keys())
def test_a_tampered_id_fails(tamper):
    ids = _ids()
    session_id = ids.mint(ALICE)
    tampered = tamper(session_id)
    assert tampered != session_id
    assert not ids.check(tampered, ALICE)


@pytest.mark.parametrize("garbage", ["not-an-id", "a.b", "%%%.%%%", "x" * 200, "é.é", ". "])
def test_garbage_ids_fail_without_raising(garbage):
    assert not _ids().check(garbage, ALICE)


def test_an_id_expires_after_the_maximum_lifetime():
    clock = FakeClock()
    ids = _ids(clock)
    session_id = ids.mint(ALICE)
    clock.now = START + LIFETIME
    assert ids.check(session_id, ALICE)
    clock.now = START + LIFETIME + 1
    assert not ids.check(session_id, ALICE)


def test_an_id_minted_later_is_valid_later():
    clock = FakeClock()
    ids = _ids(clock)
    clock.now = START + 10 * LIFETIME
    session_id = ids.mint(ALICE)
    clock.now += LIFETIME - 1
    assert ids.check(session_id, ALICE)


# ---------------------------------------------------------------- principals and log hashes


def test_principals_are_stable_distinct_and_do_not_reveal_the_credential():
    assert principal_of("Bearer alice-token") == ALICE
    assert ALICE != BOB
    assert "alice" not in ALICE
    assert principal_of(None) == principal_of("") == ""
    assert ALICE != ""


def test_short_hash_hides_the_value_but_is_stable():
    session_id = _ids().mint(ALICE)
    assert short_hash(session_id) == short_hash(session_id)
    assert short_hash(session_id) != short_hash(session_id + "x")
    assert session_id not in short_hash(session_id)
    assert len(short_hash(session_id)) < len(session_id)


# ---------------------------------------------------------------- store


def _session(session_id: str, *, created: float = 0.0, seen: float = 0.0) -> LegacySession:
    return LegacySession(
        id=session_id,
        principal=ALICE,
        legacy_version="2025-06-18",
        modern_version="2026-07-28",
        client_capabilities={},
        upstream_capabilities={},
        server_capabilities={},
        client_info=None,
        created_at=created,
        last_seen=seen,
    )


async def test_the_store_adds_loads_saves_counts_and_removes_sessions():
    store = InMemorySessionStore()
    first, second = _session("s1"), _session("s2")
    await store.add(first)
    await store.add(second)
    assert store.count() == 2
    assert await store.load(_session("s1")) is first
    assert store.held("s1") is first and store.held("s3") is None  # kept here: nothing to describe
    first.log_level = "info"
    await store.save(first)
    assert (await store.load(_session("s1"))).log_level == "info"
    assert await store.remove("s1") is True
    assert await store.load(_session("s1")) is None
    assert store.held("s1") is None
    assert await store.remove("s1") is False
    await store.save(first)  # a change racing the end does not bring the session back
    assert await store.load(_session("s1")) is None
    assert store.count() == 1


async def test_the_store_lists_idle_and_old_sessions_by_cutoff():
    store = InMemorySessionStore()
    await store.add(_session("old-idle", created=10, seen=20))
    await store.add(_session("old-busy", created=10, seen=500))
    await store.add(_session("new-busy", created=400, seen=500))
    assert sorted(await store.idle_since(100)) == ["old-idle"]
    assert sorted(await store.created_before(100)) == ["old-busy", "old-idle"]
    assert await store.idle_since(0) == []


def test_ids_of_a_previous_secret_still_check_while_a_new_one_rolls_out():
    old = _ids(secret=b"old-secret-of-16-chars")
    session_id = old.mint("alice")
    rotated = _ids(previous=(b"old-secret-of-16-chars",))
    assert rotated.check(session_id, "alice")
    assert not rotated.check(session_id, "mallory")  # still bound to its caller
    assert not _ids().check(session_id, "alice")  # once the old secret is dropped, so are its ids
    # New ids are minted with the new secret only: a replica still on the old one refuses them.
    assert not old.check(rotated.mint("alice"), "alice")


# ---------------------------------------------------------------- what the id carries

CORE = SessionCore(
    legacy_version="2025-06-18",
    modern_version="2026-07-28",
    client_capabilities={"sampling": {}, "roots": {"listChanged": True}, "x-unknown": {"kept": [1, 2]}},
    upstream_capabilities={"sampling": {}},
    server_capabilities={"tools": {"listChanged": True}, "logging": {}},
    client_info={"name": "host", "version": "1.0", "icons": [{"src": "https://x/i.png"}]},
)


def test_another_replica_reads_the_core_from_the_id_alone():
    clock = FakeClock()
    session_id = _ids(clock).mint(ALICE, CORE)
    opened = _ids(clock).open(session_id, ALICE)  # a different SessionIds, the same secret
    assert opened is not None
    assert opened.core == CORE
    assert opened.issued_at == START
    session = LegacySession.from_id(session_id, ALICE, opened, START + 5, "warning")
    assert session == LegacySession.from_core(
        session_id, ALICE, CORE, created_at=START, last_seen=START + 5, log_level="warning"
    )
    assert session.core == CORE
    assert (session.log_level, session.initialized, session.subscriptions) == ("warning", False, frozenset())
    assert not session.core_in_store


def test_where_an_id_was_minted_it_opens_to_the_core_it_was_minted_with_not_a_copy():
    """A session presents its id with every request: where it was minted, what opening it keeps is
    the core the session has already, not a second one decoded from the first request's header."""
    ids = _ids()
    session_id = ids.mint(ALICE, CORE)
    presented = session_id.encode().decode()  # an equal string, as a request's header brings it
    assert presented is not session_id
    opened = ids.open(presented, ALICE)
    assert opened is not None and opened.core is CORE and opened.issued_at == START
    assert ids.open(presented, BOB) is None


def test_the_id_does_not_show_what_it_carries():
    session_id = _ids().mint(ALICE, CORE)
    assert "host" not in session_id and "2025" not in session_id


def test_a_core_too_large_for_an_id_is_left_to_the_store():
    huge = SessionCore(client_info={"name": "host", "blob": "x" * MAX_CORE_BYTES})
    ids = _ids()
    session_id = ids.mint(ALICE, huge)
    assert len(session_id) < 200
    opened = ids.open(session_id, ALICE)
    assert opened is not None and opened.core is None
    assert LegacySession.from_id(session_id, ALICE, opened, START, None).core_in_store


def test_each_description_of_an_id_is_its_own_session_with_every_field_set():
    """from_id sets the fields from what the opened id holds: every one of them, as from_core
    would, and a change to one description is not in the next."""
    ids = _ids()
    for core, in_store in ((CORE, False), (SessionCore(client_info={"blob": "x" * MAX_CORE_BYTES}), True)):
        session_id = ids.mint(ALICE, core)
        opened = ids.open(session_id, ALICE)
        assert opened is not None
        first = LegacySession.from_id(session_id, ALICE, opened, START + 1, None)
        expected = LegacySession.from_core(
            session_id,
            ALICE,
            SessionCore() if in_store else core,
            created_at=START,
            last_seen=START + 1,
            log_level=None,
            core_in_store=in_store,
        )
        assert first == expected  # compares every field: one left unset would raise AttributeError
        first.initialized, first.log_level, first.subscriptions, first.stream_owner = True, "debug", frozenset("a"), "r"
        again = LegacySession.from_id(session_id, ALICE, opened, START + 2, "info")
        assert again is not first and (again.initialized, again.subscriptions, again.stream_owner) == (
            False,
            frozenset(),
            "",
        )
        assert (again.log_level, again.last_seen, again.created_at) == ("info", START + 2, START)
