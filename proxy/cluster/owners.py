"""Which replica owns a live object: boot ids, and sealed tokens naming their owner."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Generic, TypeVar

import orjson

from ..protocol import jsonrpc
from ..state.sealing import Sealer
from ..state.sessions import short_hash

_SERVER_REQUEST = "srq"  # the sealing purpose of server-to-client request ids


V = TypeVar("V", int, str)  # the value an owner token carries beside its owner


def new_boot_id() -> str:
    return secrets.token_hex(8)


@dataclass(frozen=True, slots=True)
class Owner:
    """One replica process: its boot id, and where other replicas reach it (None: nowhere)."""

    boot: str
    address: str | None


class OwnerGone(Exception):
    """The replica holding a live object cannot be reached, or is a new process now."""

    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome  # "owner_gone" | "refused" (its listener would not open our envelope)


def call_lost() -> jsonrpc.JSONDict:
    """The error a client gets for a call whose owner is gone: it must issue the call again."""
    return {
        "code": jsonrpc.INTERNAL_ERROR,
        "message": "the proxy replica holding the parked call is gone; the call must be re-issued",
        "data": {"reason": "upstream_call_lost", "reissue": True},
    }


# ---------------------------------------------------------------- tokens naming their owner


class OwnerTokens(Generic[V]):
    """Tokens naming the replica that minted them: `[boot, address, value]`, sealed for one
    purpose, bound to a context by the associated data each mint and open is given. Any replica
    opens them (the secret is shared) and learns whom to forward to."""

    def __init__(self, sealer: Sealer, owner: Owner, purpose: str, value_type: type[V]) -> None:
        self._sealer = sealer
        self._owner = owner
        self._purpose = purpose
        self._value_type: type[V] = value_type

    def mint(self, value: V, aad: bytes) -> str:
        plaintext = orjson.dumps([self._owner.boot, self._owner.address, value])
        return self._sealer.seal(self._purpose, plaintext, aad)

    def open(self, token: object, aad: bytes) -> tuple[Owner, V] | None:
        """The replica a token names and its value; None if the proxy did not seal it for `aad`."""
        if not isinstance(token, str):
            return None
        plaintext = self._sealer.open(self._purpose, token, aad)
        if plaintext is None:
            return None
        try:
            boot, address, value = orjson.loads(plaintext)
        except (orjson.JSONDecodeError, ValueError, TypeError):
            return None
        if not isinstance(boot, str) or not isinstance(address, (str, type(None))):
            return None
        if not isinstance(value, self._value_type):
            return None
        return Owner(boot, address), value


# ---------------------------------------------------------------- server-to-client request ids


class ServerRequestIds:
    """The ids of the requests the proxy sends a legacy client on its session: sealed strings
    naming this replica and counting within the session, bound to the session (a hash of its id
    as associated data). Legacy clients echo them verbatim in their answers."""

    def __init__(self, sealer: Sealer, owner: Owner) -> None:
        self._tokens = OwnerTokens(sealer, owner, _SERVER_REQUEST, int)

    def mint(self, session_id: str, count: int) -> str:
        return self._tokens.mint(count, _session_aad(session_id))

    def owner_of(self, request_id: object, session_id: str) -> Owner | None:
        """The replica that sent the request `request_id` names in this session; None if the id
        is not one the proxy sealed for it."""
        opened = self._tokens.open(request_id, _session_aad(session_id))
        return opened[0] if opened is not None else None


def _session_aad(session_id: str) -> bytes:
    return short_hash(session_id).encode()
