"""The legacy client's reply to a forwarded call (forwarded_call.py) that finished: the modern
result downgraded to the client's revision, or the error as it is, under the client's request id.
`outcome_message` is the modern-level reply in between, the form the response cache keeps."""

from __future__ import annotations

from typing import Any

from . import jsonrpc
from . import legacy_to_modern as l2m
from .forwarded_actions import Finish

JSONDict = dict[str, Any]


def final_reply(request: JSONDict, finish: Finish, legacy_version: str) -> JSONDict:
    """The legacy client's reply to `request` for a finished call (final_message, in one step)."""
    result = finish.result if finish.result is not None else {}
    return _legacy_reply(request, finish.error, result, legacy_version)


def outcome_message(finish: Finish) -> JSONDict:
    """A finished call as the modern-level reply it stands for (what the response cache keeps)."""
    if finish.error is not None:
        return {"jsonrpc": "2.0", "error": finish.error}
    return {"jsonrpc": "2.0", "result": finish.result if finish.result is not None else {}}


def final_message(request: JSONDict, reply: JSONDict, legacy_version: str) -> JSONDict:
    """The legacy client's reply to `request` from the modern-level `reply` (the result downgraded
    to the client's revision; an error as it is)."""
    error = reply.get("error")
    error = error if isinstance(error, dict) else None
    return _legacy_reply(request, error, jsonrpc.obj(reply.get("result")), legacy_version)


def _legacy_reply(request: JSONDict, error: JSONDict | None, result: JSONDict, legacy_version: str) -> JSONDict:
    if error is not None:
        return {"jsonrpc": "2.0", "id": request["id"], "error": error}
    return jsonrpc.result_response(request["id"], l2m.result_to_downstream(request["method"], result, legacy_version))
