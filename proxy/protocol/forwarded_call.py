"""One legacy request forwarded to a modern upstream, over all its rounds: a sans-IO state machine.

The driver (relay.legacy_to_modern) reports what happens by calling one method per event and
executes the actions each call returns, in order. The state is plain data (`ForwardedCall.state`
round-trips through JSON), so a call can be inspected, stored or resumed elsewhere.

    call.start()                      → LookupToolHeaders | SendUpstream
    call.tool_headers(headers)        → SendUpstream
    call.upstream_message(message)    → RelayToClient | Log, and once the reply came: the next step
    call.upstream_ended()             → Fail (the stream ended without a reply)
    call.upstream_failed(failure)     → SuspectEra? Log Fail
    call.client_answered(key, reply)  → nothing until the round is complete, then SendUpstream
    call.round_timed_out()            → WithdrawAsks Finish
    call.cancelled()                  → WithdrawAsks

The next step after a reply is one of SendUpstream (a retry or the next round), LookupToolHeaders
(refresh after -32020), AskClient (input requests), Finish. Rules: docs/translation.md §3.4-§3.6,
the error table of §3.5; 2026-07-28/basic/patterns/mrtr.mdx.

A call whose request declared the `io.modelcontextprotocol/tasks` extension may be answered with a
task (`resultType: "task"`): the call then follows it (io.modelcontextprotocol/tasks extension
(specification/draft/tasks.md)) with the same events: each SendUpstream is a `tasks/get` (after
the task's poll interval) or a `tasks/update`; an `input_required` task's new `inputRequests` are
asked as a round's are (AskClient, client_answered), their answers go back with `tasks/update`;
the task's inline `result` or `error` finishes the call. `open_task` names a task still running
upstream, which the driver cancels (`cancel_task`) when the call ends without it.

The actions are defined in forwarded_actions.py (RelayToClient and Fail, shared with
parked_call.py, in actions.py) and the client's final reply is built in forwarded_reply.py; the
drivers import them from here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from . import jsonrpc, meta
from . import legacy_to_modern as l2m
from . import task_extension as te
from .detection import recognized_modern_error
from .forwarded_actions import (
    Action,
    Ask,
    AskClient,
    Fail,
    Finish,
    InputRound,
    Log,
    LookupToolHeaders,
    RelayToClient,
    Renegotiated,
    SendUpstream,
    SuspectEra,
    WithdrawAsks,
)
from .forwarded_reply import final_message, final_reply, outcome_message
from .headers import ParamHeader
from .outcome import UpstreamFailure, invalid
from .versions import pick_modern

JSONDict = dict[str, Any]
Phase = Literal["new", "headers", "upstream", "asking", "done"]
TASK_POLL_RETRIES = 3  # polls of an upstream task that may fail in a row before the call fails
TaskStep = Literal["get", "update"]

__all__ = [
    "TASK_POLL_RETRIES",
    "Action",
    "Ask",
    "AskClient",
    "Fail",
    "Finish",
    "ForwardedCall",
    "ForwardedCallState",
    "InputRound",
    "Log",
    "LookupToolHeaders",
    "Phase",
    "RelayToClient",
    "Renegotiated",
    "SendUpstream",
    "SuspectEra",
    "TaskStep",
    "WithdrawAsks",
    "final_message",
    "final_reply",
    "outcome_message",
]

# ---------------------------------------------------------------- state


@dataclass(slots=True)
class ForwardedCallState:
    """Everything one forwarded request is, as plain JSON-able data."""

    request: JSONDict  # the legacy request as the client sent it
    legacy_version: str
    modern_version: str
    capabilities: JSONDict  # the session's client capabilities as modern ones (table B)
    client_info: JSONDict | None
    log_level: str | None
    trace: dict[str, str]  # the request's trace context headers
    tag: str  # names this call's upstream request ids and URL elicitation ids
    upstream: str  # the upstream's label, for messages
    can_stream: bool  # the client accepts SSE: notifications and input requests can reach it
    max_rounds: int
    phase: Phase = "new"
    attempt: int = 0  # upstream requests sent
    rounds: int = 0  # input_required results received
    retried: list[int] = field(default_factory=list)  # error codes already retried once
    param_headers: list[JSONDict] | None = None  # x-mcp-header annotations of the tool called
    input_responses: JSONDict | None = None
    request_state: str | None = None
    progress_floor: float | None = None  # last progress value the client saw, across rounds
    asks: dict[str, JSONDict] = field(default_factory=dict)  # key -> {method, request} this round
    answers: dict[str, JSONDict] = field(default_factory=dict)
    poll_interval_ms: int = 1000  # how often an upstream task is polled when it suggests nothing
    task_id: str | None = None  # the upstream task this call follows
    task_status: str | None = None  # its last status seen; "gone" once the upstream forgot it
    task_poll_ms: int | None = None  # its last pollIntervalMs
    task_step: TaskStep | None = None  # the tasks/* request in flight
    task_asked: list[str] = field(default_factory=list)  # inputRequests keys asked over the task's life
    task_poll_failures: int = 0  # tasks/get that failed in a row (the upstream unreachable a while)


# ---------------------------------------------------------------- machine


class ForwardedCall:
    def __init__(self, state: ForwardedCallState) -> None:
        self.state = state
        self.method: str = state.request["method"]  # read at every step; the request never changes
        # Derived from the state, kept to build each round's request without rebuilding them.
        self._profile: l2m.ClientProfile | None = None
        self._param_headers: tuple[ParamHeader, ...] | None = None

    @classmethod
    def new(
        cls,
        request: JSONDict,
        profile: l2m.ClientProfile,
        legacy_version: str,
        *,
        tag: str,
        upstream: str,
        can_stream: bool,
        max_rounds: int,
        trace: Mapping[str, str] | None = None,
        poll_interval_ms: int = 1000,
    ) -> ForwardedCall:
        call = cls(
            ForwardedCallState(
                request=request,
                legacy_version=legacy_version,
                modern_version=profile.modern_version,
                capabilities=profile.capabilities,
                client_info=profile.client_info,
                log_level=profile.log_level,
                trace=dict(trace or {}),
                tag=tag,
                upstream=upstream,
                can_stream=can_stream,
                max_rounds=max_rounds,
                poll_interval_ms=poll_interval_ms,
            )
        )
        call._profile = profile  # what the state was made from: not made again for the first request
        return call

    @property
    def done(self) -> bool:
        return self.state.phase == "done"

    @property
    def awaiting_upstream(self) -> bool:
        return self.state.phase == "upstream"

    @property
    def upstream_id(self) -> str:
        """The id of the upstream request in flight (or last sent)."""
        return f"{self.state.tag}.{self.state.attempt}"

    @property
    def open_task(self) -> str | None:
        """The upstream task this call follows, while it has not ended there."""
        state = self.state
        if state.task_id is None or state.task_status in te.TERMINAL or state.task_status in ("gone", "abandoned"):
            return None
        return state.task_id

    def cancel_task(self) -> SendUpstream | None:
        """The `tasks/cancel` of the task still open upstream (best effort: the driver sends it
        when the call ends without the task's end, and reads nothing of the ack)."""
        if self.state.task_id is None:  # the usual: the call followed no task
            return None
        task_id = self.open_task
        if task_id is None:
            return None
        self.state.task_status = "abandoned"  # cancelled once
        return self._task_request("tasks/cancel", task_id, f"{self.state.tag}.cancel")

    def pending_keys(self) -> tuple[str, ...]:
        """The input requests of this round still unanswered."""
        return tuple(key for key in self.state.asks if key not in self.state.answers)

    # ------------------------------------------------------------ events

    def start(self) -> list[Action]:
        if self.method == "tools/call":
            params = self.state.request.get("params")
            tool = params.get("name") if isinstance(params, dict) else None
            if isinstance(tool, str):
                self.state.phase = "headers"
                return [LookupToolHeaders(tool, refresh=False)]
        return self._send()

    def tool_headers(self, headers: Sequence[ParamHeader]) -> list[Action]:
        if self.state.phase != "headers":
            return []
        self.state.param_headers = (
            [{"name": h.name, "path": list(h.path), "type": h.type} for h in headers] if headers else []
        )
        self._param_headers = tuple(headers)
        return self._send()

    def upstream_message(self, message: JSONDict) -> list[Action]:
        """One message of the upstream reply stream: a notification, a request, or the reply."""
        if self.state.phase != "upstream":
            return []
        if "method" not in message:
            if message.get("id") not in (self.upstream_id, None):
                return []  # not ours: ignored
            return self._reply(message)
        if "id" in message:  # 2026-07-28 forbids server requests on a response stream
            return [Log("warning", "upstream_request_dropped", {"method": message.get("method")})]
        if not self.state.can_stream:
            return []  # nowhere to relay it: not worth translating
        note = l2m.notification_to_downstream(message, self.state.legacy_version, self.state.log_level)
        if note is None or not self._progress_increases(note):
            return []
        return [RelayToClient(note)]

    def upstream_ended(self) -> list[Action]:
        """The reply stream ended without a reply."""
        if self.state.phase != "upstream":
            return []
        return self._fail(invalid(self.state.upstream, "ended the response stream without a response"))

    def upstream_failed(self, failure: UpstreamFailure) -> list[Action]:
        state = self.state
        if state.phase != "upstream":
            return []
        if state.task_step == "get" and failure.kind in ("unavailable", "timeout") and not failure.is_auth:
            # The task goes on upstream: a poll that did not get through is tried again, a few times.
            state.task_step = None
            state.task_poll_failures += 1
            if state.task_poll_failures <= TASK_POLL_RETRIES:
                assert state.task_id is not None
                fields = {"task": te.short_id(state.task_id), "kind": failure.kind, "attempt": state.task_poll_failures}
                return [Log("warning", "upstream_task_poll_failed", fields), *self._poll()]
        actions: list[Action] = []
        if failure.kind == "http" and failure.http_status in (400, 404, 405):
            actions.append(SuspectEra(f"HTTP {failure.http_status} without a modern error body"))
        return actions + self._fail(failure)

    def client_answered(self, key: str, reply: JSONDict) -> list[Action]:
        """The client's JSON-RPC reply to the input request `key`."""
        state = self.state
        if state.phase != "asking" or key not in state.asks or key in state.answers:
            return []
        ask = state.asks[key]
        value = l2m.input_response_from_downstream(ask["request"], reply, state.legacy_version)
        if value is None:
            error = jsonrpc.obj(reply.get("error"))
            others = tuple(k for k in self.pending_keys() if k != key)
            actions: list[Action] = [WithdrawAsks(others, "the request failed")] if others else []
            code = error.get("code")
            failed = self._error(
                code if isinstance(code, int) else jsonrpc.INTERNAL_ERROR,
                f"client failed {ask['method']}: {error.get('message', 'no result')}",
                error.get("data"),
            )
            return [*actions, failed]
        state.answers[key] = value
        if self.pending_keys():
            return []
        responses = {k: state.answers[k] for k in state.asks}  # in the order asked
        state.asks, state.answers = {}, {}
        if state.task_id is not None:  # a task's input: answered with tasks/update, not a retry
            return self._send_task("update", responses)
        state.input_responses = responses
        return self._send()

    def round_timed_out(self) -> list[Action]:
        if self.state.phase != "asking":
            return []
        return [
            WithdrawAsks(self.pending_keys(), "the client did not answer in time"),
            self._error(jsonrpc.INTERNAL_ERROR, "the client did not answer the input requests in time"),
        ]

    def cancelled(self) -> list[Action]:
        """The client cancelled the request."""
        pending = self.pending_keys() if self.state.phase == "asking" else ()
        self.state.phase = "done"
        return [WithdrawAsks(pending, "request cancelled")] if pending else []

    # ------------------------------------------------------------ steps

    def _send(self, delay_s: float = 0.0) -> list[Action]:
        state = self.state
        state.attempt += 1
        profile = self._profile
        if profile is None or profile.modern_version != state.modern_version:
            profile = self._profile = l2m.ClientProfile(
                state.modern_version, state.capabilities, state.client_info, state.log_level
            )
        message = l2m.to_upstream(
            state.request,
            self.upstream_id,
            profile,
            input_responses=state.input_responses,
            request_state=state.request_state,
        )
        param_headers = self._param_headers
        if param_headers is None:
            param_headers = self._param_headers = tuple(
                ParamHeader(h["name"], tuple(h["path"]), h["type"]) for h in state.param_headers or ()
            )
        headers = l2m.upstream_headers(message, state.modern_version, param_headers)
        if state.trace:
            headers = {**state.trace, **headers}
            message = meta.carry_trace(message, headers)
        elif meta.TRACE_KEYS_SET.intersection(message["params"]["_meta"]):  # to_upstream always makes both
            message = meta.carry_trace(message, headers)  # trace context only in _meta: into headers too
        state.phase = "upstream"
        return [SendUpstream(message, headers, delay_s)]

    def _reply(self, message: JSONDict) -> list[Action]:
        """The upstream's reply: the error ladder, or the result by its resultType."""
        if self.state.task_step is not None:
            return self._task_reply(message)
        error = message.get("error")
        if isinstance(error, dict):
            return self._upstream_error(error, id_less=message.get("id") is None)
        return self._upstream_result(message.get("result"))

    def _upstream_error(self, error: JSONDict, *, id_less: bool) -> list[Action]:
        state = self.state
        code = error.get("code")
        actions: list[Action] = []
        if id_less and not recognized_modern_error(error):
            # A reply that could not even read our request: not a 2026-07-28 server (any more).
            actions.append(SuspectEra(f"error {code} without an id"))
        if code == jsonrpc.UNSUPPORTED_PROTOCOL_VERSION and code not in state.retried:
            state.retried.append(code)
            supported = jsonrpc.obj(error.get("data")).get("supported")
            version = pick_modern(supported)
            if version is None:
                message = f"upstream supports none of our protocol versions: {supported!r}"
                return [*actions, self._error(jsonrpc.INTERNAL_ERROR, message)]
            state.modern_version = version
            return [*actions, Renegotiated(version), *self._send()]
        if code == jsonrpc.HEADER_MISMATCH and self.method == "tools/call" and code not in state.retried:
            # The spec's suggested reaction: learn the tool's headers again and retry once.
            state.retried.append(code)
            state.phase = "headers"
            tool = jsonrpc.obj(state.request.get("params")).get("name")
            if isinstance(tool, str):
                return [*actions, LookupToolHeaders(tool, refresh=True)]
            return actions + self.tool_headers(())
        if code in (jsonrpc.HEADER_MISMATCH, jsonrpc.UNSUPPORTED_PROTOCOL_VERSION):
            return [
                *actions,
                Log("error", "upstream_rejected_translation", {"method": self.method, "error": error}),
                self._error(
                    jsonrpc.INTERNAL_ERROR, f"upstream rejected the translated request: {error.get('message')}"
                ),
            ]
        # Every field of the upstream error is kept; only the code may change.
        state.phase = "done"
        return [*actions, Finish(error=l2m.error_to_downstream(self.method, error))]

    def _upstream_result(self, result: object) -> list[Action]:
        state = self.state
        if te.is_task_result(result) and self.method in te.TASK_METHODS and te.declared(state.capabilities):
            return self._follow(result)
        outcome = l2m.classify_result(self.method, result)
        if isinstance(outcome, l2m.Complete):
            state.phase = "done"
            return [Finish(result=outcome.result, cacheable=state.rounds == 0)]
        if isinstance(outcome, l2m.Invalid):
            return [
                Log("error", "upstream_invalid_result", {"method": self.method, "reason": outcome.reason}),
                self._error(
                    jsonrpc.INTERNAL_ERROR, f"upstream {state.upstream!r} sent an invalid result: {outcome.reason}"
                ),
            ]
        state.rounds += 1
        if state.rounds > state.max_rounds:
            return [
                InputRound(),
                self._error(jsonrpc.INTERNAL_ERROR, f"gave up after {state.max_rounds} rounds of input requests"),
            ]
        state.request_state = outcome.request_state
        if not outcome.input_requests:  # load shedding: retry with the state only, after a pause
            state.input_responses = None
            return [InputRound(), *self._send(delay_s=min(0.05 * state.rounds, 1.0))]
        return [InputRound(), *self._ask(outcome.input_requests)]

    # ------------------------------------------------------------ an upstream task

    def _follow(self, result: object) -> list[Action]:
        """The upstream answered with a task: poll it until it ends."""
        try:
            view = te.parse_task(result, created=True)
        except te.InvalidTask as exc:
            return self._invalid(f"invalid CreateTaskResult: {exc}")
        state = self.state
        state.task_id = view.task_id
        state.task_status, state.task_poll_ms = view.status, view.poll_interval_ms
        tool = jsonrpc.obj(state.request.get("params")).get("name")
        followed = Log(
            "info",
            "upstream_task_followed",
            {"task": te.short_id(view.task_id), "tool": tool, "ttl_ms": view.ttl_ms, "poll_ms": view.poll_interval_ms},
        )
        return [followed, *self._poll()]

    def _task_reply(self, message: JSONDict) -> list[Action]:
        state = self.state
        step, state.task_step = state.task_step, None
        error = message.get("error")
        if isinstance(error, dict):
            if error.get("code") == jsonrpc.INVALID_PARAMS:  # expired, or never known there
                state.task_status = "gone"
                return [self._task_ended("gone"), self._finish_error(te.gone_error(error))]
            return [
                Log("warning", "upstream_failed", {"method": f"tasks/{step}", "error": error}),
                self._finish_error(
                    jsonrpc.error_object(
                        jsonrpc.INTERNAL_ERROR,
                        f"the upstream failed tasks/{step} for the task running this call: {error.get('message')}",
                        {"upstreamError": error},
                    )
                ),
            ]
        state.task_poll_failures = 0
        if step == "update":  # an empty ack; the task moves on in its own time
            return self._poll()
        try:
            view = te.parse_task(message.get("result"))
        except te.InvalidTask as exc:
            return self._invalid(f"invalid tasks/get result: {exc}")
        if view.task_id != state.task_id:
            return self._invalid("tasks/get answered for another task")
        state.task_status = view.status
        if view.poll_interval_ms is not None:
            state.task_poll_ms = view.poll_interval_ms
        if view.status == "completed" and view.result is not None:
            state.phase = "done"
            return [self._task_ended("completed"), Finish(result=view.result)]
        if view.status == "failed" and view.error is not None:
            return [self._task_ended("failed"), self._finish_error(l2m.error_to_downstream(self.method, view.error))]
        if view.status == "cancelled":
            return [self._task_ended("cancelled"), self._finish_error(te.cancelled_error())]
        if view.status == "input_required" and view.input_requests is not None:
            # A snapshot of every outstanding request: a key asked before is not asked again.
            new = {k: v for k, v in view.input_requests.items() if k not in state.task_asked}
            if new:
                state.rounds += 1
                if state.rounds > state.max_rounds:
                    return [
                        InputRound(),
                        self._error(
                            jsonrpc.INTERNAL_ERROR, f"gave up after {state.max_rounds} rounds of input requests"
                        ),
                    ]
                actions = self._ask(new)
                if isinstance(actions[-1], AskClient):
                    state.task_asked.extend(new)
                return [InputRound(), *actions]
        return self._poll()

    def _poll(self) -> list[Action]:
        delay = te.poll_delay_s(self.state.task_poll_ms, self.state.poll_interval_ms)
        return self._send_task("get", None, delay)

    def _send_task(self, step: TaskStep, input_responses: JSONDict | None, delay_s: float = 0.0) -> list[Action]:
        state = self.state
        assert state.task_id is not None
        state.attempt += 1
        send = self._task_request(f"tasks/{step}", state.task_id, self.upstream_id, input_responses, delay_s)
        state.task_step = step
        state.phase = "upstream"
        return [send]

    def _task_request(
        self,
        method: str,
        task_id: str,
        upstream_id: str,
        input_responses: JSONDict | None = None,
        delay_s: float = 0.0,
    ) -> SendUpstream:
        state = self.state
        profile = l2m.ClientProfile(state.modern_version, state.capabilities, state.client_info, state.log_level)
        message = te.request(method, upstream_id, task_id, l2m.request_meta(profile), input_responses)
        headers = te.headers(method, task_id, state.modern_version)
        if state.trace:
            headers = {**state.trace, **headers}
            message = meta.carry_trace(message, headers)
        return SendUpstream(message, headers, delay_s)

    def _task_ended(self, status: str) -> Log:
        assert self.state.task_id is not None
        return Log("info", "upstream_task_ended", {"task": te.short_id(self.state.task_id), "status": status})

    def _finish_error(self, error: JSONDict) -> Finish:
        self.state.phase = "done"
        return Finish(error=error)

    def _invalid(self, reason: str) -> list[Action]:
        return [
            Log("error", "upstream_invalid_result", {"method": self.method, "reason": reason}),
            self._error(jsonrpc.INTERNAL_ERROR, f"upstream {self.state.upstream!r} sent an invalid result: {reason}"),
        ]

    def _ask(self, input_requests: JSONDict) -> list[Action]:
        state = self.state
        asks: list[Ask] = []
        for key, request in input_requests.items():
            try:
                method, params = l2m.input_request_to_downstream(request, state.legacy_version, state.capabilities)
            except l2m.InputRequestRejected as exc:
                # An upstream bug: it must not ask for what the request did not declare.
                return [
                    Log("error", "upstream_input_request_rejected", {"reason": str(exc)}),
                    self._error(jsonrpc.INTERNAL_ERROR, f"upstream asked for input the client cannot give: {exc}"),
                ]
            if method == "elicitation/create" and params.get("mode") == "url":
                # Legacy URL elicitation names each elicitation (2025-11-25/client/elicitation.mdx).
                params = {**params, "elicitationId": f"{state.tag}-{key}-{state.rounds}"}
            asks.append(Ask(key, method, params))
        if not state.can_stream:
            return [self._error(jsonrpc.INTERNAL_ERROR, "the upstream needs input but the client does not accept SSE")]
        state.asks = {ask.key: {"method": ask.method, "request": input_requests[ask.key]} for ask in asks}
        state.answers = {}
        state.phase = "asking"
        return [AskClient(tuple(asks))]

    def _error(self, code: int, message: str, data: Any = None) -> Finish:
        self.state.phase = "done"
        return Finish(error=jsonrpc.error_object(code, message, data))

    def _fail(self, failure: UpstreamFailure) -> list[Action]:
        self.state.phase = "done"
        return [Log("warning", "upstream_failed", {"method": self.method, "error": failure.detail}), Fail(failure)]

    def _progress_increases(self, note: JSONDict) -> bool:
        """Legacy clients must see progress only increase, across rounds too (docs/translation.md §3.6 item 7)."""
        if note.get("method") != "notifications/progress":
            return True
        value = jsonrpc.obj(note.get("params")).get("progress")
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return True
        floor = self.state.progress_floor
        if floor is not None and value <= floor:
            return False
        self.state.progress_floor = value
        return True
