"""The cluster secret and TLS contexts, from config.

The secret authenticates every connection by challenge-response (see
``rpc/auth.py``): it never crosses the wire and is never logged. TLS is on
when a certificate is configured; clients check the server's certificate
against the CA file, and a client certificate, when sent, must chain to it
too. Clients need no certificate: they prove themselves with the secret.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass

from ..config import SecurityConfig
from ..errors import ConfigError

SECRET_ENV = "ROCKSTATE_SECRET"


def load_secret(secret_file: str | None) -> bytes | None:
    """The secret from ``secret_file``, else from $ROCKSTATE_SECRET, else None (no authentication)."""
    if secret_file:
        try:
            with open(secret_file, "rb") as f:
                secret = f.read().strip()
        except OSError as e:
            raise ConfigError(f"cannot read secret_file {secret_file!r}: {e.strerror}") from None
        if not secret:
            raise ConfigError(f"secret_file {secret_file!r} is empty")
        return secret
    env = os.environ.get(SECRET_ENV)
    return env.encode() if env else None


@dataclass(frozen=True)
class Security:
    """What a process needs to serve and to call its peers."""

    secret: bytes | None = None
    server_ssl: ssl.SSLContext | None = None
    client_ssl: ssl.SSLContext | None = None

    @property
    def checkpoint_keys(self) -> tuple[bytes, ...]:
        """Keys of the checkpoints' HMAC (derived from the node secret, never stored in the bucket); none without a secret."""
        from ..checkpoint.manifest import checkpoint_key

        return (checkpoint_key(self.secret),) if self.secret else ()

    def __repr__(self) -> str:  # never show the secret
        return f"Security(secret={'set' if self.secret else 'none'}, tls={self.server_ssl is not None or self.client_ssl is not None})"

    @classmethod
    def from_config(cls, config: SecurityConfig) -> "Security":
        return cls(
            load_secret(config.secret_file),
            server_context(config.tls_cert_file, config.tls_key_file, config.tls_ca_file),
            client_context(config.tls_ca_file, config.tls_cert_file, config.tls_key_file),
        )


def server_context(cert: str | None, key: str | None, ca: str | None) -> ssl.SSLContext | None:
    if not cert:
        return None
    try:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        if ca:
            ctx.load_verify_locations(ca)
            ctx.verify_mode = ssl.CERT_OPTIONAL  # a client certificate, when sent, must chain to the CA
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"cannot load TLS certificate {cert!r} / key {key!r}: {e}") from None
    return ctx


def client_context(ca: str | None, cert: str | None = None, key: str | None = None) -> ssl.SSLContext | None:
    if not ca:
        return None
    try:
        ctx = ssl.create_default_context(cafile=ca)
        if cert:
            ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"cannot load TLS CA {ca!r}: {e}") from None
    return ctx
