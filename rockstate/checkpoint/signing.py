"""Checkpoint documents signed and checked: an HMAC-SHA256 of their canonical JSON under a key derived from the
cluster's node secret (which the storage never holds), and the SHA-256 digests that name manifests."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Sequence

from ..errors import CheckpointAuthenticationError


def canonical_json(data: object) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


SIGNATURE_FIELD = "hmac"
_SCHEME = "hmac-sha256:"


def checkpoint_key(secret: bytes) -> bytes:
    """The key that signs checkpoints, derived from the cluster's node secret (which the bucket never holds)."""
    return hmac.new(secret, b"rockstate checkpoint metadata v1", hashlib.sha256).digest()


def digest_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def sign(d: dict, key: bytes) -> dict:
    body = {k: v for k, v in d.items() if k != SIGNATURE_FIELD}
    return {**body, SIGNATURE_FIELD: _SCHEME + hmac.new(key, canonical_json(body), hashlib.sha256).hexdigest()}


def verify(d: dict, keys: Sequence[bytes], where: str, accept_unsigned: bool = False) -> None:
    """Raise ``CheckpointAuthenticationError`` unless ``d`` carries an HMAC by one of ``keys`` (or none, if accepted)."""
    mac = d.get(SIGNATURE_FIELD)
    if mac is None:
        if accept_unsigned:
            return
        raise CheckpointAuthenticationError(
            f"{where} carries no HMAC: it was not written by this cluster's coordinator (planted in the storage, or from "
            "a rockstate older than signing: set accept_unsigned_checkpoints to read those)", path=where)
    body = canonical_json({k: v for k, v in d.items() if k != SIGNATURE_FIELD})
    if not isinstance(mac, str) or not any(
            hmac.compare_digest(mac.encode(), (_SCHEME + hmac.new(k, body, hashlib.sha256).hexdigest()).encode()) for k in keys):
        raise CheckpointAuthenticationError(
            f"{where} fails its HMAC: it was altered in the storage, or signed with another cluster's secret", path=where)
