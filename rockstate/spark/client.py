"""How Spark executors reach the state: a picklable client spec and one connection per worker.

The driver cannot hand its connection to executors: they are other
processes, and a socket does not pickle. So ``transform_with_state(client=...)``
turns what it is given into a ``StateClientSpec`` (the coordinator's address
and connection options), which travels inside the task closure. Each Python
worker process opens one ``ClusterBackend`` per spec the first time a task
needs it and keeps it for the tasks that follow (PySpark reuses workers), so
a task costs no connection set-up.

An embedded store (``rockstate.open``) lives in the driver process and holds
an exclusive lock on its files: executors cannot use it, so passing one is
refused with ``UnsupportedClientError`` before any job starts.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

from ..api import Rockstate
from ..cluster.client.backend import ClusterBackend
from ..errors import UnsupportedClientError
from ..states import Backend
from ..store.catalog import StateSpec


@dataclass(frozen=True)
class StateClientSpec:
    """What an executor needs to connect to a rockstate cluster; small, hashable and picklable.

    ``timeout`` and ``retry_timeout`` are ``rockstate.connect``'s options;
    ``secret`` is the cluster's shared secret when it requires authentication.
    """

    address: str
    timeout: float = 30.0
    retry_timeout: float = 30.0
    secret: bytes | None = None

    def open_backend(self) -> Backend:
        """A new connection; ``backend_for`` caches one per spec and process."""
        return ClusterBackend(self.address, timeout=self.timeout, retry_timeout=self.retry_timeout, secret=self.secret, wait=True)


def as_spec(client: object) -> StateClientSpec:
    """The spec for ``client``: an address "host:port", a ``StateClientSpec``, or a cluster ``Rockstate``."""
    if isinstance(client, StateClientSpec):
        return client
    if isinstance(client, str):
        if ":" not in client:
            raise UnsupportedClientError(f"client address {client!r} is not 'host:port' of a rockstate coordinator")
        return StateClientSpec(client)
    if isinstance(client, Rockstate):
        backend = client.backend
        if isinstance(backend, ClusterBackend):
            return StateClientSpec(
                backend.address,
                timeout=getattr(backend, "_timeout", 30.0),
                retry_timeout=backend.retry_timeout,
                secret=getattr(backend, "_secret", None),
            )
        raise UnsupportedClientError(
            f"client is a {type(backend).__name__} (an embedded rockstate.open store): it lives in the driver "
            "process and Spark executors cannot reach it; run a cluster and pass its coordinator address, "
            "rockstate.connect(address) or a StateClientSpec"
        )
    raise UnsupportedClientError(
        f"client must be a coordinator address 'host:port', a StateClientSpec or a rockstate.connect() "
        f"handle, got {type(client).__name__}"
    )


_backends: dict[StateClientSpec, Backend] = {}
_lock = threading.Lock()
_defined: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # backend -> {spec asked: spec defined}


def define_state(backend: Backend, spec: StateSpec) -> StateSpec:
    """``backend.define_state(spec)``, asked of the coordinator once per backend: every task of every micro-batch
    defines its operator's states again, and a defined state stays defined (dropping a state is an operator's
    act on a stopped query)."""
    with _lock:
        known = _defined.setdefault(backend, {})
        found = known.get(spec)
    if found is None:
        found = backend.define_state(spec)
        with _lock:
            known[spec] = found
    return found


def backend_for(spec: StateClientSpec) -> Backend:
    """This process's connection for ``spec``, opened on first use and kept for later tasks."""
    with _lock:
        backend = _backends.get(spec)
        if backend is None:
            backend = _backends[spec] = spec.open_backend()
        return backend


def is_open(spec: StateClientSpec) -> bool:
    """Whether this process holds a connection for ``spec`` (``close_clients`` closes them all)."""
    with _lock:
        return spec in _backends


def close_clients() -> None:
    """Close this process's cached connections (the driver's, at the end of a program or test)."""
    with _lock:
        backends = list(_backends.values())
        _backends.clear()
    for backend in backends:
        backend.close()
