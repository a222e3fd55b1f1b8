"""The cluster's secrets and TLS contexts, from config.

The secrets authenticate every connection by challenge-response, both ways
(see ``rpc/auth.py``): they never cross the wire and are never logged. The
node secret (``secret_file``) is what coordinators and nodes present and
accept from each other; ``client_secret_file`` and ``admin_secret_file``
give clients and administrators credentials of their own (docs/security.md).
Each file holds one secret per line: the first is presented, every one is
accepted, so a secret is rotated without downtime by adding the new one as a
second line everywhere, then making it the first, then removing the old. TLS is on
when a certificate is configured; clients check the server's certificate
against the CA file, and a client certificate, when sent, must chain to it
too. Clients need no certificate: they prove themselves with the secret.

HTTP (the coordinator's status page, its JSON API and /metrics; a node's
/metrics) takes a credential of its own, ``http_secret_file``: read-only,
sent as a password (basic auth, any user name, or a bearer token), so it does
cross the wire (inside TLS when a certificate is configured: HTTP serves TLS
with the RPC ports' certificate). The RPC secrets are never accepted on HTTP,
and may not be an HTTP credential too. A cluster with a secret and no HTTP
credential refuses every HTTP request (``http_refusal``).
"""

from __future__ import annotations

import base64
import hmac
import os
import ssl
from dataclasses import dataclass

from ..config import SecurityConfig
from ..errors import ConfigError
from ..rpc.auth import NODE, Credentials

SECRET_ENV = "ROCKSTATE_SECRET"


def load_secrets(secret_file: str | None, env: str | None = SECRET_ENV, what: str = "secret_file") -> list[bytes]:
    """The secrets in ``secret_file``, one per line (blank lines skipped), else $``env``'s, else none."""
    if secret_file:
        try:
            with open(secret_file, "rb") as f:
                secrets = [line.strip() for line in f.read().splitlines() if line.strip()]
        except OSError as e:
            raise ConfigError(f"cannot read {what} {secret_file!r}: {e.strerror}") from None
        if not secrets:
            raise ConfigError(f"{what} {secret_file!r} is empty")
        return secrets
    value = os.environ.get(env) if env else None
    return [value.encode()] if value else []


def load_secret(secret_file: str | None) -> bytes | None:
    """The secret this process presents: the first in ``secret_file``, else $ROCKSTATE_SECRET, else None (no authentication)."""
    secrets = load_secrets(secret_file)
    return secrets[0] if secrets else None


@dataclass(frozen=True)
class Security:
    """What a process needs to serve and to call its peers."""

    secret: bytes | None = None
    server_ssl: ssl.SSLContext | None = None
    client_ssl: ssl.SSLContext | None = None
    http_secrets: tuple[bytes, ...] = ()  # the read-only HTTP credentials (http_secret_file), every one accepted

    def http_refusal(self, authorization: str) -> tuple[int, str, dict[str, str]] | None:
        """None when an HTTP request with this ``Authorization`` header may be answered, else the refusal's
        status, text and headers: 401 without the HTTP credential, 403 when the cluster has a secret and no HTTP
        credential (HTTP is closed: the RPC secrets are never accepted here)."""
        if self.http_secrets:
            if _carries(authorization, self.http_secrets):
                return None
            return (401, "give the HTTP credential (http_secret_file) as the password, any user name, or as a bearer "
                         "token; the cluster's RPC secrets are not accepted over HTTP\n",
                    {"WWW-Authenticate": 'Basic realm="rockstate"'})
        if self.secret:
            return (403, "HTTP is closed: this cluster has a secret but no HTTP credential; set security.http_secret_file "
                         "(--http-secret-file) on this process (the RPC secrets are never accepted over HTTP; see docs/security.md)\n", {})
        return None  # a cluster without secrets: open, as its RPC ports are

    @property
    def checkpoint_keys(self) -> tuple[bytes, ...]:
        """Keys of the checkpoints' HMAC, one per node secret (the first signs): derived from the node secret, never
        stored in the bucket; none without a secret."""
        from ..checkpoint.signing import checkpoint_key

        if not self.secret:
            return ()
        nodes = [s for s, roles in getattr(self.secret, "accepted", ((bytes(self.secret), {NODE}),)) if NODE in roles]
        first = bytes(self.secret)
        return tuple(checkpoint_key(s) for s in [first] + [s for s in nodes if s != first])

    def __repr__(self) -> str:  # never show the secret
        return (f"Security(secret={'set' if self.secret else 'none'}, http_secrets={len(self.http_secrets)}, "
                f"tls={self.server_ssl is not None or self.client_ssl is not None})")

    @classmethod
    def from_config(cls, config: SecurityConfig) -> "Security":
        node = load_secrets(config.secret_file)
        client = load_secrets(config.client_secret_file, None, "client_secret_file")
        admin = load_secrets(config.admin_secret_file, None, "admin_secret_file")
        if (client or admin) and not node:
            raise ConfigError("client_secret_file and admin_secret_file need a node secret too (secret_file or ROCKSTATE_SECRET)")
        http = load_secrets(config.http_secret_file, None, "http_secret_file")
        if set(http) & set(node + client + admin):
            raise ConfigError("http_secret_file holds a secret of secret_file, client_secret_file or admin_secret_file: the HTTP "
                              "credential is sent as a password and must be a secret of its own (an RPC secret never crosses the wire)")
        from .zkstore import set_process_auth  # coordinators authenticate to ZooKeeper with a credential derived from it

        set_process_auth(node[0] if node else None)
        return cls(
            Credentials.of(node, client, admin) if node else None,
            server_context(config.tls_cert_file, config.tls_key_file, config.tls_ca_file),
            client_context(config.tls_ca_file, config.tls_cert_file, config.tls_key_file),
            tuple(http),
        )


def _carries(header: str, secrets: tuple[bytes, ...]) -> bool:
    """Whether an ``Authorization`` header (basic: any user name, the secret as password; or bearer) carries one of
    ``secrets`` (each compared, no early exit)."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        given = value.strip().encode()
    elif scheme.lower() == "basic":
        try:
            given = base64.b64decode(value.strip(), validate=True).partition(b":")[2]
        except ValueError:
            return False
    else:
        return False
    found = False
    for secret in secrets:
        found |= hmac.compare_digest(given, secret)
    return found


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
