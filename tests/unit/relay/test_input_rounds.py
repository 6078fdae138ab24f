"""Input rounds asked of a legacy client, and rounds taken over from another replica
(proxy/relay/input_rounds.py; docs/translation.md §3.6)."""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from proxy.errors import ProxyError
from proxy.protocol import jsonrpc
from proxy.protocol.forwarded_call import AskClient, Finish, ForwardedCall, SendUpstream
from proxy.protocol.legacy_to_modern import ClientProfile
from proxy.protocol.versions import LATEST_LEGACY, LATEST_MODERN
from proxy.relay.input_rounds import InputRounds, asked_ids, request_key, round_record, taken_round, withdraw

JSONDict = dict[str, Any]
WAIT = 5.0
PROFILE = ClientProfile(LATEST_MODERN, {"roots": {}}, {"name": "legacy-client", "version": "1"}, "info")
ROOTS = {"method": "roots/list"}


def settings(round_timeout_s: float = WAIT, max_pending_inputs: int = 8) -> Any:
    return SimpleNamespace(
        sessions=SimpleNamespace(max_pending_inputs=max_pending_inputs),
        input=SimpleNamespace(initialized_wait_s=WAIT, round_timeout_s=round_timeout_s),
    )


class Store:
    """A shared store that records what the rounds do with it."""

    def __init__(self, shared: bool = True, claimed: tuple[bytes, dict[str, bytes]] | None = None) -> None:
        self.shared = shared
        self.kept: dict[str, bytes] = {}
        self.dropped: list[str] = []
        self.claimed = claimed
        self.claims: list[tuple[str, str, str, list[str]]] = []

    async def put_round(self, session_id: str, key: str, record: bytes, ttl_s: float) -> None:
        self.kept[key] = record

    async def drop_round(self, session_id: str, key: str) -> None:
        self.dropped.append(key)

    async def claim_round(self, session_id: str, key: str, claimant: str, server_ids: Any, ttl_s: float) -> Any:
        if self.claimed is not None:
            self.claims.append((session_id, key, claimant, server_ids(self.claimed[0])))
        return self.claimed


class Channel:
    """A request's stream; `on_ask(request)` plays the client, called as each request goes out."""

    def __init__(self, resumable: bool = True, event_seq: int = 3, on_ask: Any = None) -> None:
        self.sent: list[JSONDict] = []
        self.resumable = resumable
        self.event_seq = event_seq
        self.on_ask = on_ask

    async def send(self, message: JSONDict) -> None:
        self.sent.append(message)
        if "id" in message and self.on_ask is not None:
            self.on_ask(message)


def runtime() -> Any:
    return SimpleNamespace(session_id="s1", pending={}, initialized=True, server_request_ids=itertools.count(1))


def asking_call(requests: JSONDict) -> tuple[ForwardedCall, AskClient]:
    call = ForwardedCall.new(
        jsonrpc.request(7, "prompts/get", {"name": "greet"}),
        PROFILE,
        LATEST_LEGACY,
        tag="c1",
        upstream="up",
        can_stream=True,
        max_rounds=3,
        trace={},
    )
    call.start()
    actions = call.upstream_message(
        jsonrpc.result_response("c1.1", {"resultType": "input_required", "inputRequests": requests})
    )
    ask = next(a for a in actions if isinstance(a, AskClient))
    return call, ask


def answering(run: Any) -> Any:
    """A client that answers each roots/list at once (the answer the round awaits)."""

    def answer(request: JSONDict) -> None:
        run.pending[request["id"]].set_result(jsonrpc.result_response(request["id"], {"roots": []}))

    return answer


def test_a_request_key_is_a_short_hash_that_tells_ids_of_other_types_apart() -> None:
    assert request_key(7) == request_key(7) and len(request_key(7)) == 22
    assert request_key(7) != request_key("7")


def test_a_round_record_names_its_asks_and_rebuilds_the_call() -> None:
    call, _ = asking_call({"a": ROOTS})
    sent = {"a": jsonrpc.request(41, "roots/list", None)}
    record = round_record(call.state, sent, 5)
    assert asked_ids(record) == ["41"]
    taken = taken_round(record, {"41": b"{}"})
    assert taken.call.state == call.state and taken.sent == sent and taken.seq == 5 and taken.left == {"41": b"{}"}


async def test_withdrawing_tells_the_client_to_drop_each_request() -> None:
    channel = Channel()
    await withdraw(channel, [1, "x"], "gone")
    assert [m["params"] for m in channel.sent] == [
        {"requestId": 1, "reason": "gone"},
        {"requestId": "x", "reason": "gone"},
    ]


async def test_the_asks_go_to_the_client_and_its_answers_back_to_the_call() -> None:
    store, run = Store(), runtime()
    channel = Channel(on_ask=answering(run))
    call, ask = asking_call({"a": ROOTS})
    rounds = InputRounds(settings(), store, lambda session_id, count: f"{session_id}-{count}")
    actions = await rounds.ask(call, run, channel, ask.asks)
    assert [(m["id"], m["method"]) for m in channel.sent] == [("s1-1", "roots/list")]
    retry = next(a for a in actions if isinstance(a, SendUpstream))
    assert retry.message["params"]["inputResponses"] == {"a": {"roots": []}}
    assert run.pending == {}
    key = request_key(7)
    assert asked_ids(store.kept[key]) == ["s1-1"] and orjson.loads(store.kept[key])["seq"] == 3
    assert store.dropped == [key]  # the round ended here: nobody takes it over


async def test_a_task_round_is_not_kept_for_another_replica() -> None:
    store, run = Store(), runtime()
    call, ask = asking_call({"a": ROOTS})
    rounds = InputRounds(settings(), store, lambda session_id, count: count)
    await rounds.ask(call, run, Channel(resumable=False, on_ask=answering(run)), ask.asks)
    assert store.kept == {} and store.dropped == [request_key(7)]


async def test_a_round_that_times_out_withdraws_its_asks() -> None:
    store, channel, run = Store(shared=False), Channel(), runtime()
    call, ask = asking_call({"a": ROOTS})
    rounds = InputRounds(settings(round_timeout_s=0.0), store, lambda session_id, count: count)
    actions = await rounds.ask(call, run, channel, ask.asks)
    assert any(isinstance(a, Finish) and a.error is not None for a in actions)
    assert channel.sent[-1] == jsonrpc.notification(
        "notifications/cancelled", {"requestId": 1, "reason": "the client did not answer in time"}
    )
    assert run.pending == {} and store.kept == {} and store.dropped == []


async def test_a_cancelled_round_keeps_its_record_for_the_replica_the_client_resumes_on() -> None:
    store, run = Store(), runtime()
    asked = asyncio.Event()
    channel = Channel(on_ask=lambda request: asked.set())
    call, ask = asking_call({"a": ROOTS})
    rounds = InputRounds(settings(), store, lambda session_id, count: count)
    asking = asyncio.create_task(rounds.ask(call, run, channel, ask.asks))
    async with asyncio.timeout(WAIT):
        await asked.wait()
    asking.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asking
    assert channel.sent[-1]["method"] == "notifications/cancelled"
    assert run.pending == {} and request_key(7) in store.kept and store.dropped == []


async def test_too_many_unanswered_asks_in_a_session_are_refused() -> None:
    call, ask = asking_call({"a": ROOTS})
    rounds = InputRounds(settings(max_pending_inputs=0), Store(), lambda session_id, count: count)
    with pytest.raises(ProxyError) as refused:
        await rounds.ask(call, runtime(), Channel(), ask.asks)
    assert refused.value.code == jsonrpc.LIMIT_EXCEEDED


async def test_a_round_taken_over_uses_the_answers_left_and_asks_again_what_the_client_never_saw() -> None:
    call, _ = asking_call({"a": ROOTS})
    sent = {"a": jsonrpc.request("r-1", "roots/list", None)}
    left = {"r-1": orjson.dumps(jsonrpc.result_response("r-1", {"roots": []}))}
    store = Store(claimed=(round_record(call.state, sent, 5), left))
    rounds = InputRounds(settings(), store, lambda session_id, count: count)
    taken = await rounds.claim("s1", 7, "replica-b")
    assert taken is not None
    assert store.claims == [("s1", request_key(7), "replica-b", ["r-1"])]
    channel, run = Channel(), runtime()
    actions = await rounds.carry_on(taken, run, 2, channel)
    assert channel.sent == [sent["a"]]  # the client saw events up to 2, the asks went out after 5
    assert next(a for a in actions if isinstance(a, SendUpstream)).message["params"]["inputResponses"] == {
        "a": {"roots": []}
    }
    assert run.pending == {} and store.dropped == [request_key(7)]


async def test_there_is_no_round_to_take_over_without_a_shared_store_or_a_record() -> None:
    rounds = InputRounds(settings(), Store(shared=False, claimed=(b"{}", {})), lambda session_id, count: count)
    assert await rounds.claim("s1", 7, "replica-b") is None
    assert await InputRounds(settings(), Store(), lambda session_id, count: count).claim("s1", 7, "b") is None
