"""One modern request running on a legacy upstream session, parked while the server waits for the
client's input: a sans-IO state machine.

A legacy server asks the client for input in the middle of a call; a 2026-07-28 client can only
get an `input_required` result and retry. So the upstream call stays open ("parked"), its server
requests become `inputRequests`, and the retry (with `inputResponses` and a signed `requestState`)
resumes the very same call (docs/translation.md §4.5; 2026-07-28/basic/patterns/mrtr.mdx).

The driver (relay.modern_to_legacy, with relay.legacy_call) reports each event by calling a method
and executes the actions returned, in order. The downstream request the call answers now is
"attached" (`downstream`); while parked nothing is, and what the server sends meanwhile is kept in
the state for the retry.

    upstream_message(message)   the call's reply, a server request, or a notification
    upstream_failed(failure) / upstream_ended()
    collect_window_elapsed()    after the first input request, time to surface them
    retry(request, downstream, capabilities, claims, principal)
    park_expired() / detach_expired() / client_gone() / timed_out(failure) / park_refused() / shutdown()
    answers_delivered() / delivery_failed(failure)   the retry's answers were sent upstream, or not

Phases: running (a downstream request is attached) → collecting (it asked; more may follow) →
parked (no request attached) → running again on a valid retry; detached (the client has its
answer, the upstream call runs out on its own, bounded); done.

RelayToClient and Fail are shared with forwarded_call.py (actions.py); the drivers import them from
here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from . import jsonrpc, meta
from . import modern_to_legacy as m2l
from .actions import Fail, RelayToClient
from .outcome import Outcome, UpstreamFailure, invalid
from .request_state import StateClaims, params_digest
from .status import http_status
from .versions import Era

JSONDict = dict[str, Any]
Phase = Literal["running", "collecting", "parked", "detached", "done"]
STATE_INVALID = "requestState is invalid, expired, already used, or belongs to another request"
_BUFFERED_MAX = 256  # notifications kept for the retry while parked (the oldest go first)

__all__ = [
    "STATE_INVALID",
    "Abandon",
    "Action",
    "AnswerServer",
    "Claims",
    "DeliverAnswers",
    "Detach",
    "DownstreamRequest",
    "Fail",
    "Park",
    "ParkedCall",
    "ParkedCallState",
    "Phase",
    "RelayToClient",
    "Release",
    "ReplyClient",
    "StartCollecting",
    "input_required_result",
    "invalid_state",
]

# ---------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class AnswerServer:
    """Send this response to one of the server's requests now."""

    response: JSONDict


@dataclass(slots=True)  # not frozen, as DownstreamRequest
class ReplyClient:
    """The attached request's final reply."""

    outcome: Outcome


@dataclass(frozen=True, slots=True)
class StartCollecting:
    """Report collect_window_elapsed() after `delay_s`."""

    delay_s: float


@dataclass(frozen=True, slots=True)
class Park:
    """Answer the attached request with `input_required` (its requestState sealed from `claims`),
    and report park_expired() if no valid retry comes in time."""

    request_id: jsonrpc.RequestId
    input_requests: JSONDict
    claims: Claims


@dataclass(frozen=True, slots=True)
class Detach:
    """The client has its answer; report detach_expired() after `timeout_s` unless the call ends."""

    timeout_s: float


@dataclass(frozen=True, slots=True)
class DeliverAnswers:
    """Send the client's answers upstream, then report answers_delivered() (or delivery_failed())."""

    responses: tuple[JSONDict, ...]


@dataclass(frozen=True, slots=True)
class Abandon:
    """Give up on the call: send these answers to what the server waits for, cancel the upstream
    request (notifications/cancelled), then free the session."""

    reason: str
    responses: tuple[JSONDict, ...]


@dataclass(frozen=True, slots=True)
class Release:
    """The upstream call is over: free the session."""


_RELEASE = Release()  # it carries nothing: one value serves every call


Action = (
    AnswerServer
    | RelayToClient
    | ReplyClient
    | StartCollecting
    | Park
    | Detach
    | DeliverAnswers
    | Abandon
    | Release
    | Fail
)


@dataclass(frozen=True, slots=True)
class Claims:
    """What a requestState binds: this call, the caller, the request it answers, the round."""

    park_id: str
    principal: str
    method: str
    digest: str
    round: int


@dataclass(slots=True)  # not frozen: made for every request, and frozen fields cost a call each
class DownstreamRequest:
    """The downstream request a call answers now."""

    id: jsonrpc.RequestId
    progress_token: Any = None
    log_level: str | None = None


# ---------------------------------------------------------------- state


@dataclass(slots=True)
class ParkedCallState:
    method: str
    params: JSONDict  # of the first request: what a requestState's digest covers
    principal: str
    park_id: str
    upstream: str  # the upstream's label, for messages
    upstream_id: jsonrpc.RequestId
    capabilities: JSONDict  # of the attached request (a retry may declare others)
    downstream: JSONDict | None  # DownstreamRequest as a dict; None while parked or detached
    server_info: JSONDict | None
    cache_hint: JSONDict | None  # {"ttl_ms", "scope"} for a cacheable method
    collect_window_s: float
    detach_timeout_s: float
    phase: Phase = "running"
    round: int = 0
    pending: dict[str, JSONDict] = field(default_factory=dict)  # key -> {"id", "method", "entry"}
    buffered: list[JSONDict] = field(default_factory=list)  # notifications while parked
    stash: JSONDict | None = None  # what ended the call while parked (_stash): {"reply"} | {"failure"} | {"missing"}


# ---------------------------------------------------------------- machine


class ParkedCall:
    def __init__(self, state: ParkedCallState) -> None:
        self.state = state

    @classmethod
    def new(
        cls,
        *,
        method: str,
        params: JSONDict,
        capabilities: JSONDict,
        downstream: DownstreamRequest,
        principal: str,
        park_id: str,
        upstream: str,
        upstream_id: jsonrpc.RequestId,
        server_info: JSONDict | None,
        cache_hint: m2l.CacheHint | None,
        collect_window_s: float,
        detach_timeout_s: float,
    ) -> ParkedCall:
        hint = {"ttl_ms": cache_hint.ttl_ms, "scope": cache_hint.scope} if cache_hint is not None else None
        return cls(
            ParkedCallState(
                method=method,
                params=params,
                principal=principal,
                park_id=park_id,
                upstream=upstream,
                upstream_id=upstream_id,
                capabilities=capabilities,
                downstream={
                    "id": downstream.id,
                    "progress_token": downstream.progress_token,
                    "log_level": downstream.log_level,
                },
                server_info=server_info,
                cache_hint=hint,
                collect_window_s=collect_window_s,
                detach_timeout_s=detach_timeout_s,
            )
        )

    @property
    def phase(self) -> Phase:
        return self.state.phase

    @property
    def attached(self) -> bool:
        return self.state.phase in ("running", "collecting")

    @property
    def downstream(self) -> DownstreamRequest | None:
        downstream = self.state.downstream
        return (
            DownstreamRequest(downstream["id"], downstream.get("progress_token"), downstream.get("log_level"))
            if downstream
            else None
        )

    # ------------------------------------------------------------ upstream events

    def upstream_message(self, message: JSONDict, *, valid: bool = False) -> list[Action]:
        """`valid`: the transport already found it a JSON-RPC message (jsonrpc.kind not "invalid"),
        so a reply (no method) is a response: it is not classified a second time."""
        if "method" not in message:
            if message.get("id") not in (self.state.upstream_id, None):
                return []
            return self._reply(message, valid)
        if "id" in message:
            return self._server_request(message)
        if message["method"] == "notifications/cancelled":
            # The server withdrew one of its own requests: it no longer waits for that answer.
            self.state.pending.pop(f"s{jsonrpc.params_of(message).get('requestId')}", None)
            return []
        return self._notification(message)

    def upstream_failed(self, failure: UpstreamFailure) -> list[Action]:
        state = self.state
        if state.phase == "parked":
            state.pending.clear()
            self._stash({"failure": asdict(failure)})
            return []
        if state.phase == "done":
            return []
        attached = self.attached
        self._end()
        return [_RELEASE, Fail(failure)] if attached else [_RELEASE]

    def upstream_ended(self) -> list[Action]:
        """The call's reply stream ended without its reply."""
        return self.upstream_failed(invalid(self.state.upstream, "ended the response stream without a response"))

    # ------------------------------------------------------------ timers

    def collect_window_elapsed(self) -> list[Action]:
        state = self.state
        if state.phase != "collecting":
            return []
        if not state.pending:  # every request was withdrawn meanwhile: carry on
            state.phase = "running"
            return []
        return self._park()

    def park_expired(self) -> list[Action]:
        if self.state.phase != "parked":
            return []
        return self._abandon("the client did not retry in time")

    def detach_expired(self) -> list[Action]:
        if self.state.phase != "detached":
            return []
        return self._abandon("the client did not retry in time")

    # ------------------------------------------------------------ downstream events

    def retry(
        self,
        request: JSONDict,
        downstream: DownstreamRequest,
        capabilities: JSONDict,
        claims: StateClaims | None,
        principal: str,
    ) -> list[Action]:
        """A modern retry carrying this call's requestState (`claims`, None if it did not verify)."""
        state = self.state
        params = jsonrpc.params_of(request)
        if (
            claims is None
            or state.phase != "parked"
            or claims.park_id != state.park_id
            or claims.principal != principal
            or claims.method != request.get("method")
            or claims.round != state.round
            or claims.digest != params_digest(params)
        ):
            return [ReplyClient(invalid_state(downstream.id))]
        responses = params.get("inputResponses", {})
        if not isinstance(responses, dict):
            return [ReplyClient(_refusal(downstream.id, "inputResponses must be an object"))]
        state.round += 1  # the token is spent
        state.capabilities = capabilities
        state.downstream = _downstream_dict(downstream)
        state.phase = "running"
        answered = [key for key in state.pending if isinstance(responses.get(key), dict)]
        if not answered:
            return self._resume()
        delivery = tuple(jsonrpc.result_response(state.pending[key]["id"], responses[key]) for key in answered)
        for key in answered:
            del state.pending[key]
        return [DeliverAnswers(delivery)]

    def answers_delivered(self) -> list[Action]:
        """The retry's answers reached the upstream: the call goes on for the retry."""
        if not self.attached:
            return []
        return self._resume()

    def _resume(self) -> list[Action]:
        state = self.state
        stash, state.stash = state.stash, None
        if stash is not None:
            return self._ended_while_parked(stash)
        if state.pending:  # asked again for what is still missing (mrtr.mdx §Error Handling)
            return self._park()
        actions: list[Action] = []
        buffered, state.buffered = state.buffered, []
        for note in buffered:
            actions.extend(self._notification(note))
        return actions

    def shutdown(self) -> list[Action]:
        """The proxy stops: a call that is parked or running out is given up (attached requests are
        cancelled with their handlers, and so end as client_gone)."""
        if self.state.phase not in ("parked", "detached"):
            return []
        return self._abandon("the proxy is shutting down")

    def withdrawn(self) -> list[Action]:
        """The client will not retry: the task the proxy ran the call in was cancelled or ended."""
        if self.state.phase not in ("parked", "detached"):
            return []
        return self._abandon("cancelled by the client")

    def client_gone(self) -> list[Action]:
        """The attached request's stream closed: in 2026-07-28 that is the cancellation."""
        if not self.attached:
            return []
        return self._abandon("cancelled by the client")

    def timed_out(self, failure: UpstreamFailure) -> list[Action]:
        if not self.attached:
            return []
        return [*self._abandon("timed out"), Fail(failure)]

    def park_refused(self) -> list[Action]:
        """The proxy holds its maximum of parked calls: this one cannot wait."""
        downstream = self.downstream
        actions = self._abandon("too many parked calls")
        if downstream is None:
            return actions
        message = "the proxy holds its maximum of calls waiting for input"
        return [*actions, ReplyClient(Outcome(jsonrpc.error_response(downstream.id, jsonrpc.LIMIT_EXCEEDED, message)))]

    def delivery_failed(self, failure: UpstreamFailure) -> list[Action]:
        if self.state.phase == "done":
            return []
        attached = self.attached
        actions = self._abandon("could not deliver the client's answers")
        return [*actions, Fail(failure)] if attached else actions

    # ------------------------------------------------------------ steps

    def _reply(self, message: JSONDict, valid: bool = False) -> list[Action]:
        if not valid and jsonrpc.kind(message) != "response":  # e.g. an error that is no error object
            return self.upstream_failed(invalid(self.state.upstream, "sent a reply that is not JSON-RPC"))
        state = self.state
        phase = state.phase
        if phase == "parked":
            state.pending.clear()  # the server finished: it waits for nothing any more
            self._stash({"reply": message})
            return []
        if phase == "done":
            return []
        attached = phase in ("running", "collecting")  # self.attached, read once
        outcome = self._final(message)
        self._end()
        return [_RELEASE, ReplyClient(outcome)] if attached else [_RELEASE]

    def _final(self, message: JSONDict) -> Outcome:
        state = self.state
        downstream = state.downstream  # read in place: only its id is needed
        request_id = downstream["id"] if downstream else None
        error = message.get("error")
        if isinstance(error, dict):
            error, status = m2l.error_to_downstream(error)
            return Outcome({"jsonrpc": "2.0", "id": request_id, "error": error}, status)
        hint = state.cache_hint
        cache_hint = m2l.CacheHint(hint["ttl_ms"], hint["scope"]) if hint is not None else None
        result = message.get("result")
        result = m2l.result_to_downstream(
            state.method, result if isinstance(result, dict) else {}, state.server_info, cache_hint
        )
        return Outcome({"jsonrpc": "2.0", "id": request_id, "result": result})

    def _server_request(self, request: JSONDict) -> list[Action]:
        state = self.state
        decision = m2l.server_request(request, state.method, state.capabilities)
        if state.phase in ("detached", "done") and not isinstance(decision, m2l.Answer):
            decision = m2l.Answer(error=jsonrpc.error_object(jsonrpc.INTERNAL_ERROR, "the client has gone"))
        if isinstance(decision, m2l.Answer):
            return [AnswerServer(decision.response(request["id"]))]
        if isinstance(decision, m2l.Missing):
            refusal = AnswerServer(m2l.Answer(error=decision.upstream_error).response(request["id"]))
            if state.phase == "parked":
                self._stash({"missing": decision.required})
                return [refusal]
            return [refusal, *self._missing(decision.required)]
        key = f"s{request['id']}"
        state.pending[key] = {"id": request["id"], "method": request["method"], "entry": decision.input_request}
        if state.phase == "running":
            state.phase = "collecting"
            return [StartCollecting(state.collect_window_s)]
        return []

    def _missing(self, required: JSONDict) -> list[Action]:
        """Like a modern server: fail the request with -32021 naming what it lacks. The server got
        an error for its request and may still end the call itself; it is cancelled only if it
        does not within the detach timeout."""
        state = self.state
        downstream = self.downstream
        assert downstream is not None
        # What else it waits for will not be answered either.
        answers: list[Action] = [
            AnswerServer(m2l.abandoned_answer(p["method"]).response(p["id"])) for p in state.pending.values()
        ]
        state.phase = "detached"
        state.downstream = None
        state.pending.clear()
        error = jsonrpc.error_response(
            downstream.id,
            jsonrpc.MISSING_REQUIRED_CAPABILITY,
            "the server needs client capabilities this request did not declare: " + ", ".join(sorted(required)),
            {"requiredCapabilities": required},
        )
        status = http_status(jsonrpc.MISSING_REQUIRED_CAPABILITY, Era.MODERN)
        return [*answers, ReplyClient(Outcome(error, status)), Detach(state.detach_timeout_s)]

    def _notification(self, note: JSONDict) -> list[Action]:
        state = self.state
        if state.phase == "parked":
            state.buffered.append(note)
            del state.buffered[:-_BUFFERED_MAX]
            return []
        downstream = state.downstream
        if not downstream:
            return []
        out = m2l.notification_to_downstream(note, downstream.get("progress_token"), downstream.get("log_level"))
        return [RelayToClient(out)] if out is not None else []

    def _park(self) -> list[Action]:
        state = self.state
        downstream = self.downstream
        assert downstream is not None
        state.phase = "parked"
        state.downstream = None
        claims = Claims(state.park_id, state.principal, state.method, params_digest(state.params), state.round)
        return [Park(downstream.id, {key: p["entry"] for key, p in state.pending.items()}, claims)]

    def _stash(self, ended: JSONDict) -> None:
        """Keep what ended the call while parked, for the retry; only the first: a reply ends its
        stream, whose end then comes too, and after a missing capability the reply only runs the
        call out, as when the call runs."""
        if self.state.stash is None:
            self.state.stash = ended

    def _ended_while_parked(self, stash: JSONDict) -> list[Action]:
        if "missing" in stash:
            return self._missing(stash["missing"])
        if "failure" in stash:
            self._end()
            return [_RELEASE, Fail(UpstreamFailure(**stash["failure"]))]
        outcome = self._final(stash["reply"])
        self._end()
        return [_RELEASE, ReplyClient(outcome)]

    def _abandon(self, reason: str) -> list[Action]:
        state = self.state
        responses = tuple(m2l.abandoned_answer(p["method"]).response(p["id"]) for p in state.pending.values())
        self._end()
        return [Abandon(reason, responses)]

    def _end(self) -> None:
        state = self.state
        state.phase = "done"
        state.downstream = None
        if state.pending:  # most calls never had any: no call to clear them
            state.pending.clear()
        if state.buffered:
            state.buffered.clear()


def input_required_result(input_requests: JSONDict, request_state: str, server_info: JSONDict | None) -> JSONDict:
    """The `input_required` result a parked call answers with (mrtr.mdx §InputRequiredResult)."""
    result: JSONDict = {"resultType": "input_required", "inputRequests": input_requests, "requestState": request_state}
    if server_info is not None:
        result["_meta"] = {meta.SERVER_INFO: server_info}
    return result


def invalid_state(request_id: jsonrpc.RequestId) -> Outcome:
    """The reply to a retry whose requestState does not resume a parked call: refused, never run
    again from scratch (docs/translation.md §4.5)."""
    return _refusal(request_id, STATE_INVALID)


def _refusal(request_id: jsonrpc.RequestId, message: str) -> Outcome:
    status = http_status(jsonrpc.INVALID_PARAMS, Era.MODERN, refused=True)
    return Outcome(jsonrpc.error_response(request_id, jsonrpc.INVALID_PARAMS, message), status)


def _downstream_dict(downstream: DownstreamRequest) -> JSONDict:
    return {"id": downstream.id, "progress_token": downstream.progress_token, "log_level": downstream.log_level}
