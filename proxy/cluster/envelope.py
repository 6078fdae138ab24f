"""A replay's envelope: what the forwarding replica seals for the owner's internal listener."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from ..protocol import meta
from ..state.sealing import Sealer

REPLAY_PATH = "/_mep/v1/replay"
TARGET_HEADER = "Mep-Target-Boot"  # whom a replay is for: the envelope's associated data
REPLAYED_HEADER = "Mep-Replayed-By"  # on every reply of the internal listener: the boot that served it
REFUSED_HEADER = "Mep-Replay-Refused"  # on the internal listener's own refusals: why
ENVELOPE_TTL_S = 30.0
_FORWARD = "fwd"
# What a replay carries of the client's request, beside the MCP headers (Mcp-*, which include the
# session id and the protocol version), the trace context and the identity header.
_REPLAYED = frozenset({"accept", "content-type", "authorization", "last-event-id"})
# What the forwarding replica does not copy from the owner's reply: its own framing.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server", "upgrade"}
    | {REPLAYED_HEADER.lower()}
)


# What a replay is served by at its owner: the endpoint's handler for its HTTP method, or a route of
# its own (an HTTP+SSE client's message, for the replica holding its stream).
SSE_MESSAGE_ROUTE = "SSE-MESSAGE"
_ROUTES = frozenset({"POST", "GET", "DELETE", SSE_MESSAGE_ROUTE})


@dataclass(frozen=True, slots=True)
class Envelope:
    method: str
    headers: list[tuple[str, str]]
    body: bytes
    expires: float = 0.0  # set when opened (sealing sets it from the clock)


def seal_envelope(sealer: Sealer, target: str, envelope: Envelope, now: float) -> str:
    head = orjson.dumps({"exp": round(now + ENVELOPE_TTL_S, 3), "m": envelope.method, "h": envelope.headers})
    return sealer.seal(_FORWARD, struct.pack(">I", len(head)) + head + envelope.body, target.encode())


def open_envelope(sealer: Sealer, target: str, token: object, now: float) -> Envelope | None:
    """The replay an envelope sealed for `target` holds, unexpired; None for anything else."""
    plaintext = sealer.open(_FORWARD, token, target.encode())
    if plaintext is None or len(plaintext) < 4:
        return None
    (size,) = struct.unpack(">I", plaintext[:4])
    try:
        head = orjson.loads(plaintext[4 : 4 + size])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(head, dict):
        return None
    expires, method, headers = head.get("exp"), head.get("m"), head.get("h")
    if not isinstance(expires, (int, float)) or expires <= now or method not in _ROUTES:
        return None
    if not isinstance(headers, list) or not all(
        isinstance(pair, list) and len(pair) == 2 and all(isinstance(part, str) for part in pair) for pair in headers
    ):
        return None
    return Envelope(method, [(name, value) for name, value in headers], plaintext[4 + size :], float(expires))


def replayed_headers(headers: Mapping[str, str], identity_header: str | None) -> list[tuple[str, str]]:
    """What of the client's request headers a replay carries (everything its serving reads)."""
    wanted = _REPLAYED | set(meta.TRACE_KEYS) | ({identity_header.lower()} if identity_header else set())
    return [(k, v) for k, v in headers.items() if k.lower() in wanted or k.lower().startswith("mcp-")]
