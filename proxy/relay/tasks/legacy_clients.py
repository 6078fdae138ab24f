"""MCP tasks of legacy clients of a 2026-07-28 upstream (relay.legacy_to_modern's sessions): the
2025-11-25 tasks the proxy hosts for them, and the tasks/cancel of upstream tasks their calls
gave up on (docs/translation.md §3.10, docs/design.md §Tasks).

The backend asks `HostedTasks.takes` once per request: only a tasks/* method or a task-augmented
call of a session whose revision has tasks comes here; a plain call is forwarded straight on, and
only a tools/list reply is looked at afterwards (`listed`, which marks the tools' task support).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from ...config import TasksConfig
from ...protocol import jsonrpc
from ...protocol import legacy_tasks as lt
from ...protocol import task_extension as te
from ...protocol.forwarded_call import Finish, SendUpstream, final_reply
from ...state.sessions import LegacySession
from ...upstream.base import Upstream
from ...upstream.errors import UpstreamError
from ..channel import ReplyChannel
from ..scopes import Deadline, TaskScope
from .host import LegacyTaskHost, Notify, TaskChannel

JSONDict = dict[str, Any]
# A hosted task's call (its message without the task) driven with the task's channel.
RunCall = Callable[[JSONDict, ReplyChannel], Awaitable[Finish]]
log = structlog.get_logger(__name__)

TASK_CANCEL_S = 5.0  # how long a tasks/cancel for an abandoned upstream task may take


class HostedTasks:
    """The 2025-11-25 tasks the proxy hosts for the legacy clients of a modern upstream (which
    knows no such tasks): a task-augmented call runs here as a plain one, the tasks/* methods are
    answered by the task host."""

    def __init__(self, host: LegacyTaskHost | None, config: TasksConfig) -> None:
        self._host = host
        self._mark_tools = config.mark_tools

    @property
    def hosting(self) -> bool:
        """Whether the proxy hosts tasks at all (initialize declares them to clients that can)."""
        return self._host is not None

    def serves(self, legacy_version: str) -> bool:
        """Whether a session's requests come here: its revision has tasks and the proxy hosts them."""
        return self._host is not None and lt.supports_tasks(legacy_version)

    def takes(self, session: LegacySession, message: JSONDict) -> bool:
        """Whether a request is the hosted tasks' to serve: a tasks/* method or a task-augmented
        call, in a session `serves` answers yes for."""
        # The message first (the usual: a plain call, no task), the session's revision after.
        if message["method"] not in lt.TASK_METHODS and not lt.is_task_request(message):
            return False
        return self.serves(session.legacy_version)

    async def request(
        self,
        session: LegacySession,
        message: JSONDict,
        channel: ReplyChannel,
        notify: Notify,
        run_call: RunCall,
    ) -> JSONDict:
        """A request `takes` answers yes for; `notify` tells the session of its tasks' status changes."""
        host = self._host
        assert host is not None  # only asked after takes()
        if message["method"] in lt.TASK_METHODS:
            return await self._task_request(host, session, message, channel)
        return await self._create_task(host, session, message, notify, run_call)

    def listed(self, session: LegacySession, method: str, reply: JSONDict) -> JSONDict:
        """A forwarded request's reply as the session gets it: a tools/list marks which tools a
        client may run as a task (tasks.mark_tools), in a session `serves` answers yes for."""
        if method != "tools/list" or not self._mark_tools or not self.serves(session.legacy_version):
            return reply
        if not isinstance(reply.get("result"), dict):
            return reply
        return {**reply, "result": lt.mark_tools(reply["result"], session.legacy_version)}

    async def _create_task(
        self, host: LegacyTaskHost, session: LegacySession, message: JSONDict, notify: Notify, run_call: RunCall
    ) -> JSONDict:
        """The call runs as a task the proxy hosts: answered with the task now, the call made
        upstream as a plain one (a 2026-07-28 server knows no 2025-11-25 tasks)."""
        call_message = lt.untasked(message)

        async def run(channel: TaskChannel) -> JSONDict:
            return final_reply(message, await run_call(call_message, channel), session.legacy_version)

        return await host.create(session.principal, message, run, notify=notify)

    async def _task_request(
        self, host: LegacyTaskHost, session: LegacySession, message: JSONDict, channel: ReplyChannel
    ) -> JSONDict:
        method = message["method"]
        if method == "tasks/get":
            return await host.get(session.principal, message)
        if method == "tasks/result":
            return await host.result(session.principal, message, channel)
        if method == "tasks/cancel":
            return await host.cancel(session.principal, message)
        return await host.list(session.principal, message)


class UpstreamTaskCancels:
    """tasks/cancel of upstream tasks whose calls ended without them (the client cancelled, a
    round timed out, the proxy stops): sent in the background, they outlive the call."""

    def __init__(self, upstream: Upstream, within_s: float = TASK_CANCEL_S) -> None:
        self._upstream = upstream
        self._within_s = within_s
        self._cancels = TaskScope("upstream task cancels")

    def spawn(self, send: SendUpstream, credentials: Mapping[str, str]) -> None:
        if self._cancels.closed:
            return
        self._cancels.spawn(self._cancel(send, credentials), name="upstream-task-cancel")

    async def _cancel(self, send: SendUpstream, credentials: Mapping[str, str]) -> None:
        task = te.short_id(str(jsonrpc.params_of(send.message).get("taskId")))
        try:
            with Deadline(self._within_s):
                async with self._upstream.exchange(send.message, {**credentials, **send.headers}) as messages:
                    async for incoming in messages:
                        if "method" not in incoming:
                            error = incoming.get("error")
                            if isinstance(error, dict):
                                log.warning(
                                    "upstream_task_cancel_failed", upstream=self._upstream.name, task=task, error=error
                                )
                                return
                            break
        except (UpstreamError, TimeoutError) as exc:
            log.warning("upstream_task_cancel_failed", upstream=self._upstream.name, task=task, error=str(exc))
            return
        log.info("upstream_task_cancelled", upstream=self._upstream.name, task=task)

    async def settle(self, timeout_s: float = TASK_CANCEL_S) -> None:
        """Shutdown: the tasks/cancel requests under way get a bounded moment, then end."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._cancels.drain()
        await self._cancels.aclose()
