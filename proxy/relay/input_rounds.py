"""Input rounds of legacy clients: what a 2026-07-28 server's `input_required` asks is put to the
legacy client as server-to-client requests on the request's own stream, and each answer is fed to
the call as it arrives (docs/translation.md §3.6). With a shared store the open round is recorded,
so the replica a client's resumed stream reaches carries it on (docs/design.md §Replicas)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

import orjson
import structlog

from ..config import Settings
from ..errors import ProxyError
from ..protocol import jsonrpc
from ..protocol.forwarded_call import Action, Ask, ForwardedCall, ForwardedCallState, WithdrawAsks
from ..state.sessions import SessionStore, StoreUnavailable, short_hash
from .channel import ReplyChannel
from .runtime import SessionRuntime

JSONDict = dict[str, Any]
Runtime = SessionRuntime[Any]
# The answer each asked request awaits -> (its key in the round, its server request id).
Waiting = dict[asyncio.Future[JSONDict], tuple[str, int | str]]
log = structlog.get_logger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class TakenRound:
    """An open round taken over from another replica: its call, the requests the client was
    asked (key -> request), the event sequence number they went out after, and the answers that
    were left for them meanwhile (server request id -> answer)."""

    call: ForwardedCall
    sent: dict[str, JSONDict]
    seq: int
    left: dict[str, bytes]


def request_key(request_id: Any) -> str:
    """A legacy request's id as a store key part: hashed, whatever the client made it."""
    return hashlib.sha256(jsonrpc.canonical(request_id)).hexdigest()[:22]


def round_record(state: ForwardedCallState, sent: dict[str, JSONDict], seq: int) -> bytes:
    """What the store keeps of an open round: the call's state, the requests asked, and the
    sequence number of the stream's last event before them."""
    return orjson.dumps({"state": dataclasses.asdict(state), "sent": sent, "seq": seq})


def asked_ids(record: bytes) -> list[str]:
    """The server request ids of a recorded round's asks (the answers to look for)."""
    return [str(message["id"]) for message in orjson.loads(record)["sent"].values()]


def taken_round(record: bytes, left: dict[str, bytes]) -> TakenRound:
    data = orjson.loads(record)
    return TakenRound(ForwardedCall(ForwardedCallState(**data["state"])), data["sent"], data["seq"], left)


async def withdraw(channel: ReplyChannel, server_ids: list[int | str], reason: str) -> None:
    """Tell a legacy client to drop the requests we no longer wait for (docs/translation.md §3.6 item 8)."""
    for server_id in server_ids:  # the asks went out on this stream, so it can carry the withdrawal
        with contextlib.suppress(ConnectionError, RuntimeError):
            await channel.send(
                jsonrpc.notification("notifications/cancelled", {"requestId": server_id, "reason": reason})
            )


class InputRounds:
    def __init__(self, settings: Settings, store: SessionStore, server_ids: Callable[[str, int], str | int]) -> None:
        """`server_ids(session_id, count)`: the id of the count-th request sent to a session's client."""
        self._settings = settings
        self._store = store
        self._server_ids = server_ids

    async def ask(
        self, call: ForwardedCall, runtime: Runtime, channel: ReplyChannel, asks: tuple[Ask, ...]
    ) -> list[Action]:
        """Put the input requests to the legacy client on this request's stream, each as a
        server-to-client request; feed each answer to the call as it arrives."""
        if len(runtime.pending) + len(asks) > self._settings.sessions.max_pending_inputs:
            raise ProxyError(jsonrpc.LIMIT_EXCEEDED, "too many unanswered input requests in this session")
        if not runtime.initialized:
            # Servers must not send requests before notifications/initialized
            # (2025-11-25/basic/lifecycle.mdx §Initialization).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.input.initialized_wait_s):
                    await runtime.wait_initialized()
        loop = asyncio.get_running_loop()
        waiting: Waiting = {}
        sent: dict[str, JSONDict] = {}  # key -> the request as the client got it
        try:
            for ask in asks:
                server_id = self._server_ids(runtime.session_id, next(runtime.server_request_ids))
                future: asyncio.Future[JSONDict] = loop.create_future()
                runtime.pending[server_id] = future
                waiting[future] = (ask.key, server_id)
                sent[ask.key] = jsonrpc.request(server_id, ask.method, ask.params)
                await channel.send(sent[ask.key])
        except BaseException:
            for _, server_id in waiting.values():
                runtime.pending.pop(server_id, None)
            raise
        await self._keep(call, runtime, channel, sent)
        return await self._await_answers(call, runtime, channel, waiting)

    async def _await_answers(
        self, call: ForwardedCall, runtime: Runtime, channel: ReplyChannel, waiting: Waiting
    ) -> list[Action]:
        """Feed each answer to the call as it arrives, until the round ends."""
        loop = asyncio.get_running_loop()
        actions: list[Action] = []
        cancelled = False
        try:
            for future in [f for f in waiting if f.done()]:  # answers left for a round taken over
                actions.extend(call.client_answered(waiting[future][0], future.result()))
            deadline = loop.time() + self._settings.input.round_timeout_s
            unanswered = {future for future in waiting if not future.done()}
            while unanswered and not actions:
                # asyncio.wait, unlike gather, leaves the futures alone when this task is cancelled,
                # so the unanswered ones can be withdrawn below.
                answered, unanswered = await asyncio.wait(
                    unanswered, timeout=max(0.0, deadline - loop.time()), return_when=asyncio.FIRST_COMPLETED
                )
                if not answered:
                    actions = call.round_timed_out()
                for future in answered:
                    actions.extend(call.client_answered(waiting[future][0], future.result()))
        except asyncio.CancelledError:
            # The client's stream went (or it cancelled): the round's record stays, so another
            # replica can take it over when the client resumes the stream there.
            cancelled = True
            actions = call.cancelled()
            raise
        finally:
            withdrawn = next((a for a in actions if isinstance(a, WithdrawAsks)), None)
            if withdrawn is not None:
                ids = {key: server_id for key, server_id in waiting.values()}
                await withdraw(channel, [ids[key] for key in withdrawn.keys if key in ids], withdrawn.reason)
            for _, server_id in waiting.values():
                runtime.pending.pop(server_id, None)
            if not cancelled:
                await self._drop(call, runtime)
        return actions

    # ------------------------------------------------------------ rounds taken over

    async def _keep(
        self, call: ForwardedCall, runtime: Runtime, channel: ReplyChannel, sent: dict[str, JSONDict]
    ) -> None:
        """With a shared store, record the open round: if this replica dies while the client
        thinks, the replica its resumed stream reaches carries the round on (`claim`). Sound
        because a 2026-07-28 upstream keeps the round's state in requestState, not in a process.
        A task's round is not kept: it is no request's a client could resume elsewhere."""
        if not self._store.shared or not channel.resumable:
            return
        record = round_record(call.state, sent, getattr(channel, "event_seq", 0))
        try:
            await self._store.put_round(
                runtime.session_id, request_key(call.state.request["id"]), record, self._settings.input.round_timeout_s
            )
        except StoreUnavailable:
            log.warning("input_round_not_shared", session=short_hash(runtime.session_id))

    async def _drop(self, call: ForwardedCall, runtime: Runtime) -> None:
        if self._store.shared:
            with contextlib.suppress(StoreUnavailable):
                await self._store.drop_round(runtime.session_id, request_key(call.state.request["id"]))

    async def claim(self, session_id: str, request_id: Any, claimant: str) -> TakenRound | None:
        """The open input round of a request whose stream broke on another replica, taken over
        by `claimant` (this replica); None: there is none to carry on."""
        if not self._store.shared:
            return None
        try:
            claimed = await self._store.claim_round(
                session_id, request_key(request_id), claimant, asked_ids, self._settings.input.round_timeout_s
            )
        except StoreUnavailable:
            return None
        if claimed is None:
            return None
        record, left = claimed
        return taken_round(record, left)

    async def carry_on(self, taken: TakenRound, runtime: Runtime, seen_seq: int, channel: ReplyChannel) -> list[Action]:
        """Await the answers of a round taken over (its client resumed the stream here, having
        seen events up to `seen_seq`); the actions that follow the round."""
        loop = asyncio.get_running_loop()
        waiting: Waiting = {}
        for key, message in taken.sent.items():
            server_id = message["id"]
            future: asyncio.Future[JSONDict] = loop.create_future()
            answer = taken.left.get(str(server_id))
            if answer is not None:
                future.set_result(orjson.loads(answer))
            else:
                runtime.pending[server_id] = future
            waiting[future] = (key, server_id)
        log.info("input_round_taken_over", session=short_hash(runtime.session_id), asks=len(waiting))
        if seen_seq < taken.seq:
            # The client never got these: ask them here, under the same ids (asked once).
            for message in taken.sent.values():
                await channel.send(message)
        return await self._await_answers(taken.call, runtime, channel, waiting)
