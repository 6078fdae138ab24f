"""The actions both call machines return to their drivers (forwarded_call.py: legacy client →
modern upstream; parked_call.py: modern client → legacy upstream), each defined once so a driver
or a test matches the same type whichever machine produced it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .outcome import UpstreamFailure

JSONDict = dict[str, Any]


@dataclass(frozen=True, slots=True)
class RelayToClient:
    """Put this notification on the client's reply stream now (a parked call's: the stream of the
    request attached now)."""

    message: JSONDict


@dataclass(frozen=True, slots=True)
class Fail:
    """The client's request fails because the upstream failed: relay the failure. For a forwarded
    call the call is over; a parked call returns it after Release, or after Abandon."""

    failure: UpstreamFailure
