"""The tasks the proxy hosts for 2025-11-25 clients of a 2026-07-28 upstream: runs each task's call
and answers tasks/get, tasks/result, tasks/cancel and tasks/list from the task store.

A task-augmented `tools/call` is answered at once with the task; its call runs here, in a scope of
this host's (not the request's, not the session's: the task outlives both), through the same
translation a plain call gets (relay.legacy_to_modern drives it). What the call sends the client
meanwhile (input requests, progress, logs) is tagged with the task and waits for a `tasks/result`
stream, where the client expects it; its answers come back to the call as any answer does. The
record (protocol.legacy_tasks.TaskRecord) is in the store from the start and changes there, so any
replica answers tasks/get, tasks/list and, once it ended, tasks/result (docs/design.md §Tasks).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import structlog

from ...config import TasksConfig
from ...errors import ProxyError
from ...metrics import Metrics
from ...protocol import jsonrpc
from ...protocol import legacy_tasks as lt
from ...state.sessions import StoreUnavailable, short_hash
from ...state.task_records import TaskStore
from ..channel import Caller, ReplyChannel
from ..scopes import TaskScope

JSONDict = dict[str, Any]
Notify = Callable[[JSONDict], None]
Run = Callable[["TaskChannel"], Awaitable[JSONDict]]
Watcher = Callable[[lt.TaskRecord], None]
log = structlog.get_logger(__name__)
_NOTES_KEPT = 256  # notifications held for a tasks/result stream at most (the oldest go first)
_ENDED_KEPT = 256  # ended tasks whose held notifications still wait for a tasks/result (the oldest go first)


class _Live:
    """A task whose call runs on this replica: its latest record, its call, and what waits for
    a tasks/result stream."""

    __slots__ = ("answered", "answers", "asking", "ended", "latest", "notify", "outbox", "readers", "record", "task")

    def __init__(self, record: lt.TaskRecord, notify: Notify | None) -> None:
        self.record = record
        self.notify = notify
        self.task: asyncio.Task[None] | None = None
        self.ended = asyncio.Event()
        self.outbox: deque[JSONDict] = deque()
        self.readers: list[ReplyChannel] = []
        # A 2026-07-28 client's input round: what the call asks, what tasks/update answered so far.
        self.asking: JSONDict | None = None
        self.answers: JSONDict = {}
        self.answered = asyncio.Event()
        self.latest: Caller | None = None  # the caller of the latest request about the task (seen_from)


class TaskChannel:
    """Where a task's call sends what is for the client: the open tasks/result streams, else held
    for the next one. An input request moves the task to `input_required`."""

    can_stream = True
    resumable = False  # its rounds are the task's, not a request's a client could resume elsewhere

    def __init__(self, host: LegacyTaskHost, live: _Live) -> None:
        self._host = host
        self._live = live

    async def send(self, message: dict[str, Any]) -> None:
        live = self._live
        tagged = lt.related(message, live.record.task_id)
        if "id" in message:
            await self._host.update(live, lt.asked(live.record, self._host.now()))
        if live.readers:
            await live.readers[-1].send(tagged)
            return
        if "id" not in message and sum("id" not in m for m in live.outbox) >= _NOTES_KEPT:
            oldest = next(m for m in live.outbox if "id" not in m)
            live.outbox.remove(oldest)
        live.outbox.append(tagged)

    async def answered(self) -> None:
        """The client answered every input request of a round: the task works again."""
        await self._host.update(self._live, lt.answered(self._live.record, self._host.now()))

    @property
    def task_id(self) -> str:
        return self._live.record.task_id

    @property
    def latest(self) -> Caller | None:
        """The caller of the latest request about the task (None: none since it was made)."""
        return self._live.latest

    def time_left(self) -> float:
        """Seconds the task is kept yet (its call may take as long)."""
        return max(self._live.record.expires_at - self._host.now(), 0.001)

    def exchange_bound_s(self, request_bound_s: float) -> float:
        return self.time_left()

    async def ask(self, requests: JSONDict) -> JSONDict:
        """A 2026-07-28 client's input round: the requests shown in tasks/get until tasks/update
        answered every one; returns the answers."""
        return await self._host.ask(self._live, requests)


class LegacyTaskHost:
    def __init__(
        self,
        config: TasksConfig,
        store: TaskStore,
        metrics: Metrics,
        *,
        owner: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._store = store
        self._metrics = metrics
        self._owner = owner
        self.now = clock
        max_ttl_ms = int(config.max_ttl_s * 1000)
        self._policy = lt.Policy(
            default_ttl_ms=min(int(config.default_ttl_s * 1000), max_ttl_ms),
            max_ttl_ms=max_ttl_ms,
            poll_interval_ms=config.poll_interval_ms,
            page_size=config.page_size,
        )
        self._live: dict[tuple[str, str], _Live] = {}
        # What an ended call left held: a client that polls tasks/get until the task ended and only
        # then opens tasks/result (the TypeScript SDK's callToolStream) gets its progress there.
        self._leftover: OrderedDict[tuple[str, str], list[JSONDict]] = OrderedDict()
        self._watchers: dict[tuple[str, str], set[Watcher]] = {}
        self._scope = TaskScope("hosted tasks")

    # ------------------------------------------------------------ requests

    async def create(self, principal: str, message: JSONDict, run: Run, notify: Notify | None = None) -> JSONDict:
        """A task-augmented tools/call: the task, at once; `run(channel)` makes the call's final
        reply meanwhile."""
        record = await self.start(principal, message, run, notify)
        return jsonrpc.result_response(message["id"], lt.create_task_result(record))

    async def start(self, principal: str, message: JSONDict, run: Run, notify: Notify | None = None) -> lt.TaskRecord:
        """A task for the tools/call `message`, kept and running (`run(channel)` makes the call's
        final reply); its record, for the answer in the client's revision."""
        with refusals():
            if await self._store.count(principal) >= self._config.max_per_caller:
                raise ProxyError(
                    jsonrpc.LIMIT_EXCEEDED,
                    f"too many tasks kept for this caller (tasks.max_per_caller = {self._config.max_per_caller}); "
                    "let some expire first",
                    outcome="rejected",
                )
            record = lt.new_task(secrets.token_urlsafe(18), principal, message, self.now(), self._policy, self._owner)
            live = _Live(record, notify)
            await self._put(record)
        self._live[(principal, record.task_id)] = live
        live.task = self._scope.spawn(self._run(live, run), name="legacy-task")
        self._metrics.tasks.labels("created").inc()
        log.info("task_created", task=short_hash(record.task_id), tool=record.tool, ttl_ms=record.ttl_ms)
        return record

    async def get(self, principal: str, message: JSONDict) -> JSONDict:
        return jsonrpc.result_response(message["id"], lt.task_object(await self.record(principal, message)))

    async def result(self, principal: str, message: JSONDict, channel: ReplyChannel) -> JSONDict:
        """Blocks until the task ends; meanwhile what the call has for the client goes on this
        request's stream (a client that cannot take a stream gets it once it ended)."""
        with refusals():
            task_id = lt.task_id_of(message)
            record = await self._find(principal, task_id)
            live = self._live.get((principal, task_id))
            if live is not None:  # even one that just ended: it is leaving, and what it held with it
                record = await self._await_live(live, channel)
            while not record.terminal:  # the call runs on another replica: follow the store
                await asyncio.sleep(record.poll_interval_ms / 1000)
                record = await self._find(principal, task_id)
            if channel.can_stream:
                for note in self._leftover.pop((principal, task_id), ()):
                    await channel.send(note)
            return lt.result_reply(record, message["id"])

    async def cancel(self, principal: str, message: JSONDict) -> JSONDict:
        record = await self.record(principal, message)
        return jsonrpc.result_response(message["id"], lt.task_object(await self._cancel(record)))

    async def withdraw(self, principal: str, message: JSONDict) -> None:
        """A 2026-07-28 client's tasks/cancel: the task is cancelled unless it ended already (then
        nothing changes, and the client gets the same acknowledgement)."""
        record = await self.record(principal, message)
        if not record.terminal:
            with contextlib.suppress(ProxyError):  # it ended meanwhile: nothing to cancel
                await self._cancel(record)

    async def _cancel(self, record: lt.TaskRecord) -> lt.TaskRecord:
        principal, task_id = record.principal, record.task_id
        with refusals():
            live = self._live.get((principal, task_id))
            cancelled = lt.cancelled(live.record if live is not None else record, self.now())
            if live is not None:
                await self.update(live, cancelled)
                if live.task is not None:
                    live.task.cancel()  # the upstream call ends with it (its exchange is closed)
            else:
                # The call runs on another replica: the task is cancelled for the client now, and
                # that replica keeps it so when its call ends (it reads the record first).
                await self._put(cancelled)
        self._metrics.tasks.labels("cancelled").inc()
        log.info("task_cancelled", task=short_hash(task_id))
        return cancelled

    async def record(self, principal: str, message: JSONDict) -> lt.TaskRecord:
        """The caller's task `params.taskId` names (-32602 for an unknown, foreign or expired one)."""
        with refusals():
            return await self._find(principal, lt.task_id_of(message))

    async def answer(self, principal: str, message: JSONDict, responses: JSONDict) -> None:
        """A 2026-07-28 client's tasks/update: answers to the task's outstanding input requests.
        Answers to keys not outstanding (never asked, answered already) are ignored, as the
        extension says; the task goes on once every request of the round is answered."""
        record = await self.record(principal, message)
        live = self._live.get((principal, record.task_id))
        if live is None and record.status == "input_required":
            # Its call runs on a replica this one cannot replay to: the answers would be lost.
            raise ProxyError(
                jsonrpc.INTERNAL_ERROR,
                "the task's call runs on another replica, which cannot be reached: answer it there",
                data={"taskId": record.task_id, "reason": "task_elsewhere"},
            )
        if live is None or live.asking is None:
            return
        for key, response in responses.items():
            if key in live.asking and key not in live.answers:
                live.answers[key] = response
        outstanding = {k: v for k, v in live.asking.items() if k not in live.answers}
        if outstanding:
            await self.update(live, lt.asked(live.record, self.now(), outstanding))
        else:
            live.answered.set()

    async def ask(self, live: _Live, requests: JSONDict) -> JSONDict:
        live.asking, live.answers = requests, {}
        live.answered.clear()
        await self.update(live, lt.asked(live.record, self.now(), requests))
        try:
            await live.answered.wait()
            answers = live.answers
        finally:
            live.asking, live.answers = None, {}
        await self.update(live, lt.answered(live.record, self.now()))
        return answers

    def watch(self, principal: str, records: list[lt.TaskRecord], on_change: Watcher) -> Callable[[], None]:
        """Call `on_change(record)` whenever one of these tasks of the caller's changes (a 2026-07-28
        listen stream): at once for those running here, at the poll interval from the store for
        those running on another replica. Returns what stops it."""
        keys = [(principal, record.task_id) for record in records]
        for key in keys:
            self._watchers.setdefault(key, set()).add(on_change)
        elsewhere = [r for r in records if (principal, r.task_id) not in self._live and not r.terminal]
        poller = self._scope.spawn(self._poll(elsewhere, on_change), name="task-watch") if elsewhere else None

        def stop() -> None:
            if poller is not None:
                poller.cancel()
            for key in keys:
                watchers = self._watchers.get(key)
                if watchers is not None:
                    watchers.discard(on_change)
                    if not watchers:
                        del self._watchers[key]

        return stop

    async def _poll(self, records: list[lt.TaskRecord], on_change: Watcher) -> None:
        """Follow records another replica writes, until each ended or is gone."""
        seen = {record.task_id: record for record in records}
        while seen:
            await asyncio.sleep(self._policy.poll_interval_ms / 1000)
            for task_id, last in list(seen.items()):
                try:
                    record = await self._read(last.principal, task_id)
                except StoreUnavailable:
                    continue  # tried again at the next interval
                if record is None:
                    del seen[task_id]
                    continue
                if record != last:
                    on_change(record)
                    seen[task_id] = record
                if record.terminal:
                    del seen[task_id]

    async def runner_of(self, principal: str, message: JSONDict) -> str:
        """The replica running the call of the caller's task `params.taskId` names, as its record
        says (`boot@address`); "" for this one, none (it ended) or no such task of the caller's."""
        task_id = jsonrpc.params_of(message).get("taskId")
        if not isinstance(task_id, str) or (principal, task_id) in self._live:
            return ""
        try:
            record = await self._read(principal, task_id)
        except StoreUnavailable:
            return ""  # served here, which reports the store's failure
        if record is None or record.terminal or record.principal != principal or record.owner == self._owner:
            return ""
        return record.owner

    async def known(self, principal: str, task_ids: list[str]) -> list[lt.TaskRecord]:
        """The records of those of `task_ids` that are the caller's tasks, running or kept (a
        listen acknowledges only those)."""
        found = []
        for task_id in task_ids:
            try:
                found.append(await self._find(principal, task_id))
            except lt.TaskRefused:
                continue
        return found

    async def list(self, principal: str, message: JSONDict) -> JSONDict:
        with refusals():
            params = jsonrpc.params_of(message)
            after = lt.decode_cursor(params["cursor"]) if params.get("cursor") is not None else None
            found = await self._store.page(principal, after, self._policy.page_size + 1)
            records = [r for r in (lt.TaskRecord.decode(data) for data in found) if r is not None]
        return jsonrpc.result_response(message["id"], lt.list_result(records, self._policy.page_size))

    # ------------------------------------------------------------ the call

    async def _run(self, live: _Live, run: Run) -> None:
        record = live.record
        try:
            try:
                reply = await run(TaskChannel(self, live))
            except ProxyError as exc:
                reply = exc.reply(None)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # this task was cancelled: tasks/cancel, or the proxy shutting down
                # An answer it awaited was withdrawn: the session it asked ended meanwhile.
                reply = jsonrpc.error_response(
                    None, jsonrpc.INTERNAL_ERROR, "the session the task asked for input ended before answering"
                )
            except Exception as exc:  # a defect: the task fails, it does not stay working forever
                log.exception("task_call_failed", task=short_hash(record.task_id))
                reply = jsonrpc.error_response(None, jsonrpc.INTERNAL_ERROR, f"the call failed: {type(exc).__name__}")
            await self._finish(live, reply)
        except asyncio.CancelledError:
            if not live.record.terminal:  # not by tasks/cancel: the proxy is shutting down
                with contextlib.suppress(StoreUnavailable):
                    await self.update(live, lt.lost(live.record, "the proxy shut down", self.now()))
            raise
        finally:
            key = (record.principal, record.task_id)
            # Input requests die with the call; notifications stay for the next tasks/result.
            notes = [m for m in live.outbox if "id" not in m]
            if notes:
                self._leftover[key] = notes
                while len(self._leftover) > _ENDED_KEPT:
                    self._leftover.popitem(last=False)
            live.ended.set()
            self._live.pop(key, None)

    async def _finish(self, live: _Live, reply: JSONDict) -> None:
        stored = await self._stored(live.record)
        if stored is not None and stored.terminal:  # cancelled on another replica meanwhile
            live.record = stored
            log.info("task_ended", task=short_hash(stored.task_id), status=stored.status)
            return
        done = lt.finished(live.record, reply, self.now())
        if done is not live.record:
            try:
                await self.update(live, done)
            except StoreUnavailable:
                log.warning("task_result_not_kept", task=short_hash(done.task_id))
                return
        self._metrics.tasks.labels(done.status).inc()
        log.info("task_ended", task=short_hash(done.task_id), status=done.status)

    async def _await_live(self, live: _Live, channel: ReplyChannel) -> lt.TaskRecord:
        if not channel.can_stream:
            await live.ended.wait()
            return live.record
        live.readers.append(channel)
        try:
            while live.outbox:
                await channel.send(live.outbox.popleft())
            await live.ended.wait()
        finally:
            live.readers.remove(channel)
        return live.record

    # ------------------------------------------------------------ records

    async def update(self, live: _Live, record: lt.TaskRecord) -> None:
        """A change of the task's status: kept, and told to the session that made it."""
        if record is live.record:
            return
        status_changed = record.status != live.record.status
        live.record = record
        await self._put(record)
        if status_changed and live.notify is not None:
            live.notify(lt.status_notification(record))
        for watcher in tuple(self._watchers.get((record.principal, record.task_id), ())):
            watcher(record)

    async def _put(self, record: lt.TaskRecord) -> None:
        left = max(record.expires_at - self.now(), 0.001)
        await self._store.put(record.principal, record.task_id, record.encode(), record.created_at, left)

    async def _read(self, principal: str, task_id: str) -> lt.TaskRecord | None:
        """The record in the store (None: none, or one this version does not read); raises
        StoreUnavailable."""
        data = await self._store.get(principal, task_id)
        return lt.TaskRecord.decode(data) if data is not None else None

    async def _stored(self, record: lt.TaskRecord) -> lt.TaskRecord | None:
        try:
            return await self._read(record.principal, record.task_id)
        except StoreUnavailable:
            return None

    async def _find(self, principal: str, task_id: str) -> lt.TaskRecord:
        live = self._live.get((principal, task_id))
        if live is not None:
            return lt.visible(live.record, principal, self.now())
        return lt.visible(await self._read(principal, task_id), principal, self.now())

    def seen_from(self, record: lt.TaskRecord, caller: Caller) -> None:
        """The task's caller asked of it again: its call, if it runs here, goes on with what that
        request carried (a refreshed token), from its next round."""
        live = self._live.get((record.principal, record.task_id))
        if live is not None:
            live.latest = caller

    @property
    def running(self) -> int:
        return len(self._live)

    async def drain(self) -> None:
        """Wait for the calls running now to end (and their records to be written)."""
        await self._scope.drain()

    async def close(self) -> None:
        """Shutdown: the calls still running end, their tasks failed ("the proxy shut down")."""
        await self._scope.aclose()


@contextlib.contextmanager
def refusals() -> Iterator[None]:
    """A TaskRefused of the core, raised as the JSON-RPC error the client gets."""
    try:
        yield
    except lt.TaskRefused as exc:
        raise ProxyError(exc.code, exc.message, data=exc.data, outcome="rejected") from None
