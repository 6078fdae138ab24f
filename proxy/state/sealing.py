"""One primitive for every token the proxy hands out and gets back: authenticated encryption.

Session ids, `requestState`, server-to-client request ids, SSE event ids, internal forwards and
store values that hold client data are all sealed the same way (docs/design.md §Tokens):

    b64url( kid(2) ‖ day(2) ‖ nonce(12) ‖ AES-256-GCM(plaintext) ‖ tag(16) )

The key is HKDF-SHA256 of the secret for one purpose and one UTC day, derived once and cached:
no key derivation per token, and random 96-bit nonces stay far below the 2**32 messages one
GCM key may seal. Sealing, not signing: tokens carry replica addresses and client data, which
nobody but the proxy should read. `aad` binds a token to its context (the caller, a session)
without carrying it. `kid` names the secret, so a token minted before a rotation (sealed with a
secret now in `previous`) is opened with that secret, and nobody else's key is ever tried.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from collections.abc import Callable, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..protocol.jsonrpc import b64url, unb64url

_HEADER = 2 + 2 + 12
_TAG = 16
_DAY_S = 86_400
_KEYS_CACHED = 256  # (secret, purpose, day) keys; a full cache starts afresh
MAX_TOKEN_CHARS = 8192  # nothing longer is even decoded


class Sealer:
    def __init__(self, secret: bytes, previous: Sequence[bytes] = (), clock: Callable[[], float] = time.time) -> None:
        self._secrets = {_kid(key): key for key in (*reversed(previous), secret)}  # the current one wins
        self._kid = _kid(secret)
        self._clock = clock
        self._keys: dict[tuple[bytes, str, int], AESGCM] = {}

    def seal(self, purpose: str, plaintext: bytes, aad: bytes = b"") -> str:
        day = int(self._clock() // _DAY_S) & 0xFFFF
        nonce = os.urandom(12)
        sealed = self._key(self._kid, purpose, day).encrypt(nonce, plaintext, aad)
        return b64url(self._kid + struct.pack(">H", day) + nonce + sealed)

    def open(self, purpose: str, token: object, aad: bytes = b"", max_chars: int = MAX_TOKEN_CHARS) -> bytes | None:
        """The plaintext of a token sealed here for `purpose` and `aad`; None for anything else
        (a token over `max_chars` is not even decoded)."""
        if not isinstance(token, str) or not token or len(token) > max_chars:
            return None
        try:
            raw = unb64url(token)
        except ValueError:
            return None
        if len(raw) < _HEADER + _TAG or raw[:2] not in self._secrets:
            return None
        (day,) = struct.unpack(">H", raw[2:4])
        try:
            return self._key(raw[:2], purpose, day).decrypt(raw[4:16], raw[16:], aad)
        except InvalidTag:
            return None

    def _key(self, kid: bytes, purpose: str, day: int) -> AESGCM:
        cached = self._keys.get((kid, purpose, day))
        if cached is None:
            if len(self._keys) >= _KEYS_CACHED:
                self._keys.clear()
            info = f"mcp-era-proxy/{purpose}/{day}".encode()
            key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(self._secrets[kid])
            cached = self._keys[(kid, purpose, day)] = AESGCM(key)
        return cached


def _kid(secret: bytes) -> bytes:
    return hashlib.sha256(b"mcp-era-proxy/kid" + secret).digest()[:2]
