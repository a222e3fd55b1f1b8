"""Shared-secret challenge–response, the authentication step of the handshake.

A server with a secret sends a random nonce; the client answers
HMAC-SHA256(secret, nonce). The secret never crosses the wire and an answer
is worthless for any other nonce. This proves the client to the server;
TLS (an ``ssl.SSLContext`` on both ends) proves the server and hides the traffic.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any

from ..errors import AuthenticationError

from .messages import Challenge, Proof

Secret = bytes | str


def _sign(secret: Secret, nonce: bytes) -> bytes:
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, nonce, hashlib.sha256).digest()


def new_challenge() -> Challenge:
    return Challenge(nonce=os.urandom(32))


def answer(secret: Secret | None, challenge: Challenge) -> Proof:
    if secret is None:
        raise AuthenticationError("the server requires a cluster secret and this client has none")
    return Proof(digest=_sign(secret, challenge.nonce))


def check(secret: Secret, challenge: Challenge, wire: Any) -> None:
    """Accept the client's answer (a wire message) or raise ``AuthenticationError``."""
    digest = wire.get("digest") if isinstance(wire, dict) and wire.get("op") == Proof.op else None
    if not isinstance(digest, bytes) or not hmac.compare_digest(digest, _sign(secret, challenge.nonce)):
        raise AuthenticationError("the client did not prove it knows the cluster secret")
