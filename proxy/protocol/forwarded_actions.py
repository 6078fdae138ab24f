"""What a forwarded call (forwarded_call.py: one legacy request on a modern upstream) asks its
driver to do: the actions its events return, executed in order by relay/legacy_to_modern.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .actions import Fail, RelayToClient

__all__ = [
    "Action",
    "Ask",
    "AskClient",
    "Fail",
    "Finish",
    "InputRound",
    "Log",
    "LookupToolHeaders",
    "RelayToClient",
    "Renegotiated",
    "SendUpstream",
    "SuspectEra",
    "WithdrawAsks",
]

JSONDict = dict[str, Any]


@dataclass(frozen=True, slots=True)
class SendUpstream:
    """Send `message` upstream with these headers (credentials are the driver's to add), after
    `delay_s` (load shedding: the upstream asked to be retried with its state only)."""

    message: JSONDict
    headers: dict[str, str]
    delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class LookupToolHeaders:
    """Find the `x-mcp-header` annotations of `tool` (from tools/list); `refresh`: the upstream
    refused the headers sent, so learn them again."""

    tool: str
    refresh: bool


@dataclass(frozen=True, slots=True)
class Ask:
    key: str
    method: str
    params: JSONDict


@dataclass(frozen=True, slots=True)
class AskClient:
    """Send each as a server-to-client request on the reply stream and report every answer."""

    asks: tuple[Ask, ...]


@dataclass(frozen=True, slots=True)
class WithdrawAsks:
    """The answers to these keys are no longer awaited: tell the client (notifications/cancelled)."""

    keys: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Renegotiated:
    """The upstream speaks `version` instead: the session uses it from now on."""

    version: str


@dataclass(frozen=True, slots=True)
class SuspectEra:
    """The upstream's answer does not fit a 2026-07-28 server: detect its era again."""

    reason: str


@dataclass(frozen=True, slots=True)
class InputRound:
    """The upstream answered input_required (counted)."""


@dataclass(frozen=True, slots=True)
class Log:
    level: Literal["info", "warning", "error"]
    event: str
    fields: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Finish:
    """The call is over: the complete modern `result`, or the `error` as the legacy client must
    see it. `cacheable`: the result took none of the client's own answers."""

    result: JSONDict | None = None
    error: JSONDict | None = None
    cacheable: bool = False


Action = (
    SendUpstream
    | LookupToolHeaders
    | RelayToClient
    | AskClient
    | WithdrawAsks
    | Renegotiated
    | SuspectEra
    | InputRound
    | Log
    | Finish
    | Fail
)
