"""Same-era upstream state bound to its caller, in `auth.mode: resource_server`.

There the upstream sees only the proxy's own credentials (upstream.headers): every caller looks
the same to it, so what it binds to the token it sees (its legacy session id, a modern
`requestState`) would let one caller's handle serve another. The proxy binds them instead: what
the client gets is the upstream's value sealed with the caller's principal as associated data
(state/sealing.py), opened on the way back with the principal of whoever presents it. Another caller's
principal does not open it, so it never reaches the upstream. One shared secret: any replica
opens it. In passthrough mode nothing here runs: the upstream sees each caller's token and binds
its state itself.
"""

from __future__ import annotations

from typing import Any

from ..state.sealing import MAX_TOKEN_CHARS, Sealer

SESSION_PURPOSE = "rs-sid"  # a legacy upstream's Mcp-Session-Id
STATE_PURPOSE = "rs-rst"  # a modern upstream's requestState


class CallerBinding:
    __slots__ = ("_max_state_chars", "_sealer")

    def __init__(self, sealer: Sealer, max_state_chars: int = MAX_TOKEN_CHARS) -> None:
        """`max_state_chars`: the longest sealed requestState opened. The upstream's is opaque and
        unbounded, so the app sets it to the request body bound: whatever a client can send back opens."""
        self._sealer = sealer
        self._max_state_chars = max_state_chars

    def seal_session(self, upstream_id: str, principal: str) -> str:
        return self._sealer.seal(SESSION_PURPOSE, upstream_id.encode(), principal.encode())

    def open_session(self, token: str, principal: str) -> str | None:
        """The upstream's session id inside `token` if it was sealed for `principal`, else None."""
        return _text(self._sealer.open(SESSION_PURPOSE, token, principal.encode()))

    def seal_state(self, state: str, principal: str) -> str:
        return self._sealer.seal(STATE_PURPOSE, state.encode(), principal.encode())

    def open_state(self, token: object, principal: str) -> str | None:
        return _text(self._sealer.open(STATE_PURPOSE, token, principal.encode(), self._max_state_chars))

    def request(self, message: Any, principal: str) -> tuple[Any, bool] | None:
        """A modern request with the upstream's own requestState back in place of the sealed one:
        (the message, whether it changed); None when its requestState is not one sealed for
        `principal` (foreign, tampered, or never the proxy's)."""
        if not isinstance(message, dict):
            return message, False
        params = message.get("params")
        if not isinstance(params, dict) or "requestState" not in params:
            return message, False
        state = self.open_state(params["requestState"], principal)
        if state is None:
            return None
        return {**message, "params": {**params, "requestState": state}}, True

    def reply(self, value: Any, principal: str) -> Any | None:
        """A reply (a message or a batch) with each result's requestState sealed for `principal`;
        None when there is none (the reply stays as it came)."""
        if isinstance(value, list):
            items = [self.reply(item, principal) for item in value]
            if all(item is None for item in items):
                return None
            return [new if new is not None else old for new, old in zip(items, value, strict=True)]
        if not isinstance(value, dict):
            return None
        result = value.get("result")
        if not isinstance(result, dict) or not isinstance(result.get("requestState"), str):
            return None
        return {**value, "result": {**result, "requestState": self.seal_state(result["requestState"], principal)}}


def _text(plaintext: bytes | None) -> str | None:
    if plaintext is None:
        return None
    try:
        return plaintext.decode()
    except UnicodeDecodeError:
        return None
