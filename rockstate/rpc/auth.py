"""Shared-secret challenge–response, both ways, and the roles a secret grants: the authentication step of the handshake.

A server with secrets sends a random nonce; the client answers
HMAC-SHA256(secret, nonce) and a nonce of its own; the server, once it found
the secret the answer was made with, proves it knows that secret too:
``Welcome.proof`` = HMAC-SHA256(secret, "server" + its nonce + the client's).
No secret crosses the wire and an answer is worthless for any other nonce.
Without TLS this is what proves the server to the client (a relay in the
middle can pass the client's answer on, but not forge the server's), though
it does not hide or protect the traffic after it: TLS (an ``ssl.SSLContext``
on both ends) does that.

Roles: a server's ``Credentials`` map each secret it accepts to the roles it
grants (``node``, ``client``, ``admin``; see docs/security.md). A plain
secret (bytes or str) grants every role: a cluster with one secret works as
before roles. Several secrets of one role are accepted at once (rotation).
A client that sent its nonce and gets a ``Welcome`` without the server's
proof refuses it; an older client sends no nonce and gets no proof.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any, Iterable, Mapping

from ..errors import AuthenticationError

from .messages import Challenge, Proof, Welcome

Secret = bytes | str

NODE, CLIENT, ADMIN = "node", "client", "admin"
ROLES = frozenset({NODE, CLIENT, ADMIN})


class Credentials(bytes):
    """The secret this process presents when it calls others (its bytes), and every secret it accepts when it
    serves, each with the roles it grants. Its repr never shows a secret."""

    accepted: tuple[tuple[bytes, frozenset[str]], ...]

    def __new__(cls, presented: bytes, accepted: Mapping[bytes, Iterable[str]]) -> "Credentials":
        self = super().__new__(cls, presented)
        self.accepted = tuple((bytes(k), frozenset(v)) for k, v in accepted.items())
        return self

    def __repr__(self) -> str:
        roles = sorted({r for _, rs in self.accepted for r in rs})
        return f"Credentials({len(self.accepted)} secrets, roles {roles})"

    __str__ = __repr__

    def __reduce__(self):  # pickled whole (a process handing its config on), not as plain bytes
        return (Credentials, (bytes(self), dict(self.accepted)))

    @classmethod
    def of(cls, node: Iterable[bytes], client: Iterable[bytes] = (), admin: Iterable[bytes] = ()) -> "Credentials":
        """Node secrets (the first is presented), and the client's and administrator's. A role without secrets of
        its own is granted by the node secrets: with node secrets only, every secret grants every role."""
        node, client, admin = list(node), list(client), list(admin)
        if not node:
            raise ValueError("credentials need a node secret")
        accepted: dict[bytes, set[str]] = {}
        node_roles = {NODE} | ({CLIENT} if not client else set()) | ({ADMIN} if not admin else set())
        for secrets, roles in ((node, node_roles), (client, {CLIENT}), (admin, {ADMIN})):
            for s in secrets:
                accepted.setdefault(bytes(s), set()).update(roles)
        return cls(node[0], accepted)


def _key(secret: Secret) -> bytes:
    return secret.encode() if isinstance(secret, str) else bytes(secret)


def _sign(secret: Secret, nonce: bytes) -> bytes:
    return hmac.new(_key(secret), nonce, hashlib.sha256).digest()


def _server_sign(secret: Secret, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(_key(secret), b"server" + server_nonce + client_nonce, hashlib.sha256).digest()


def new_challenge() -> Challenge:
    return Challenge(nonce=os.urandom(32))


def answer(secret: Secret | None, challenge: Challenge) -> Proof:
    """The client's answer: its proof, and its own nonce for the server's."""
    if secret is None:
        raise AuthenticationError("the server requires a cluster secret and this client has none")
    if not isinstance(challenge.nonce, bytes) or not 16 <= len(challenge.nonce) <= 256:
        raise AuthenticationError("the server's challenge is not a nonce of 16 to 256 bytes")
    return Proof(digest=_sign(secret, challenge.nonce), nonce=os.urandom(32))


def check(secret: Secret | Credentials, challenge: Challenge, wire: Any) -> tuple[frozenset[str], bytes | None]:
    """Accept the client's answer (a wire message) or raise ``AuthenticationError``; answers the roles its secret
    grants and the server's proof for the ``Welcome`` (None when the client sent no nonce)."""
    digest = wire.get("digest") if isinstance(wire, dict) and wire.get("op") == Proof.op else None
    nonce = wire.get("nonce") if isinstance(wire, dict) else None
    if not isinstance(digest, bytes) or (nonce is not None and (not isinstance(nonce, bytes) or not 16 <= len(nonce) <= 256)):
        raise AuthenticationError("the client did not prove it knows the cluster secret")
    accepted = secret.accepted if isinstance(secret, Credentials) else ((_key(secret), ROLES),)
    roles: set[str] = set()
    matched = None
    for s, grants in accepted:  # every one compared (no early exit): the time does not tell which matched
        if hmac.compare_digest(digest, _sign(s, challenge.nonce)):
            roles |= grants
            matched = matched or s
    if matched is None:
        raise AuthenticationError("the client did not prove it knows the cluster secret")
    return frozenset(roles), (None if nonce is None else _server_sign(matched, challenge.nonce, nonce))


def check_welcome(secret: Secret | None, challenge: Challenge | None, proof: Proof | None, welcome: Welcome) -> None:
    """On the client: a server that challenged must prove it knows the secret the client answered with."""
    if challenge is None or proof is None or proof.nonce is None:
        return
    got = welcome.proof
    if not isinstance(got, bytes) or not hmac.compare_digest(got, _server_sign(secret, challenge.nonce, proof.nonce)):  # type: ignore[arg-type]
        raise AuthenticationError("the server did not prove it knows the cluster secret: it is not this cluster's "
                                  "(or something in the middle relays the handshake)")
