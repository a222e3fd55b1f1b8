"""LocalCluster: a coordinator and N nodes on 127.0.0.1, for tests, demos and trying things out.

With ``zookeeper=True`` it also runs a ZooKeeper server (Debian's package, a
plain process with a temporary data directory) and ``coordinators`` of them,
one elected leader; nodes and clients are given every coordinator's address.

With ``processes=True`` (the default) each is a separate OS process running
the ``rockstate`` CLI; ``kill_node`` is a real SIGKILL. With
``processes=False`` they all run on one asyncio loop in a thread of this
process: faster to start, for tests that do not need real process deaths.
Either way, leaving the ``with`` block stops everything that was started.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any, Callable

from ..api import Rockstate
from ..config import CoordinatorConfig, NodeConfig, SecurityConfig
from ..errors import ClusterError, ConfigError, RockstateError
from ..files import read_json
from ..cluster.client.backend import ClusterBackend, connect
from .runners import START_TIMEOUT, NodeInfo, ProcessRunner, ThreadRunner, wait_until
from ..cluster.security import client_context

__all__ = ["LocalCluster", "NodeInfo", "wait_until"]

class LocalCluster:
    def __init__(
        self,
        nodes: int = 3,
        partitions: int = 16,
        root: str | None = None,
        *,
        processes: bool = True,
        heartbeat_timeout: float = 3.0,
        node_memory_bytes: int = 64 << 20,
        secret: str | None = None,
        tls: dict[str, str] | None = None,
        checkpoints: str | None = None,
        checkpoint_interval: float | None = None,
        coordinator_settings: dict[str, Any] | None = None,
        coordinators: int = 1,
        zookeeper: bool | str = False,
        zookeeper_session_timeout: float = 1.5,
        backup_count: int | None = None,
        hosts: Callable[[str], tuple[str, list[str]]] | None = None,
    ) -> None:
        """``secret``: a shared secret every connection must prove; ``tls``: {"cert", "key", "ca"} PEM
        files used by every process (and ``ca`` by clients from ``connect()``). ``zookeeper``: True starts a
        ZooKeeper server for the cluster, a "host:port,..." string uses that one; ``coordinators`` > 1 needs it.
        ``hosts``: where each process runs, by name ("coordinator", "node0", ...): the address it listens on and
        the command prefix that starts it there (``ip netns exec <namespace>``: ``rockstate.testing.netns``)."""
        if coordinators > 1 and not zookeeper:
            raise ConfigError(f"{coordinators} coordinators need ZooKeeper to elect their leader: pass zookeeper=True")
        if hosts is not None and not processes:
            raise ConfigError("hosts place processes: pass processes=True")
        self.hosts = hosts or (lambda name: ("127.0.0.1", []))
        self.coordinator_count = coordinators
        self.zookeeper: str | None = zookeeper if isinstance(zookeeper, str) else None
        self.zookeeper_server = None
        self._start_zookeeper = zookeeper is True
        self.zookeeper_session_timeout = zookeeper_session_timeout
        self.partitions = partitions
        self._initial_nodes = nodes
        self._own_root = root is None
        self.root = os.path.abspath(root or tempfile.mkdtemp(prefix="rockstate-cluster-"))
        self.heartbeat_timeout = heartbeat_timeout
        self.node_memory_bytes = node_memory_bytes
        self.processes = processes
        self._runner = ProcessRunner(self.root, self.hosts) if processes else ThreadRunner()
        self.secret = secret
        self.checkpoints, self.checkpoint_interval = checkpoints, checkpoint_interval
        # more CoordinatorConfig fields; the first nodes get their partitions once all have joined
        self.coordinator_settings = {"initial_cluster_size": max(nodes, 1), **(coordinator_settings or {})}
        if backup_count is not None:  # None: the coordinator's default
            self.coordinator_settings["backup_count"] = backup_count
        secret_file = None
        if secret:
            secret_file = os.path.join(self.root, "secret")
            with open(os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(secret)
        tls = tls or {}
        self.security = SecurityConfig(secret_file=secret_file, tls_cert_file=tls.get("cert"), tls_key_file=tls.get("key"),
                                       tls_ca_file=tls.get("ca"))
        self._node_dirs: dict[str, str] = {}  # node id -> data dir
        self._zones: dict[str, str | None] = {}  # data dir -> zone
        self._next_dir = 0
        self.address = ""

    # -- life cycle --------------------------------------------------------

    def _coordinator_config(self, port: int, index: int = 0) -> CoordinatorConfig:
        ha = {"zookeeper": self.zookeeper, "zookeeper_session_timeout": self.zookeeper_session_timeout} if self.zookeeper else {}
        return CoordinatorConfig(
            host=self.hosts(f"coordinator{index or ''}")[0], port=port, data_dir=os.path.join(self.root, f"coordinator{index or ''}"),
            partitions=self.partitions, heartbeat_timeout=self.heartbeat_timeout, security=self.security,
            checkpoints=self.checkpoints, checkpoint_interval=self.checkpoint_interval,
            **{"http_port": 0, **ha, **self.coordinator_settings},
        )

    def start(self) -> "LocalCluster":
        try:
            if self._start_zookeeper:
                from .zookeeper import ZooKeeperServer

                self.zookeeper_server = ZooKeeperServer(os.path.join(self.root, "zookeeper")).start()
                self.zookeeper = self.zookeeper_server.hosts
            self.coordinator_addresses = self._runner.start_coordinators(
                {i: self._coordinator_config(0, i) for i in range(self.coordinator_count)})
            self.address = ",".join(self.coordinator_addresses)
            self._start_nodes([self._new_data_dir(None) for _ in range(self._initial_nodes)])
            self.wait_replicated()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        try:
            self._runner.close()
        finally:
            if self.zookeeper_server is not None:
                self.zookeeper_server.stop()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def kill_coordinator(self, index: int = 0) -> None:
        """SIGKILL (or, in-process, an abrupt stop) of a coordinator; nodes keep serving."""
        self._runner.kill_coordinator(index)

    def restart_coordinator(self, index: int = 0, **settings: Any) -> None:
        """Start a coordinator again on the same port, from its persisted state; ``settings``: other
        CoordinatorConfig fields for it (its own ``zookeeper`` address: a proxy, in tests)."""
        port = int(self.coordinator_addresses[index].rsplit(":", 1)[1])
        config = self._coordinator_config(port, index).model_copy(update=settings)
        self._runner.start_coordinators({index: config})

    def leader(self) -> int:
        """The index of the leading coordinator (in ``coordinator_addresses``)."""
        return self.coordinator_addresses.index(self.status()["coordinators"]["leader"])

    def kill_leader(self) -> int:
        """SIGKILL the leading coordinator; answers its index (``restart_coordinator(index)`` brings it back)."""
        index = self.leader()
        self.kill_coordinator(index)
        return index

    @property
    def status_url(self) -> str | None:
        """The coordinator's status page (its JSON API is ``status_url + "api/status"``)."""
        return (read_json(os.path.join(self.root, "coordinator", "address.json")) or {}).get("status_url")

    # -- clients -----------------------------------------------------------

    def _client_options(self) -> dict:
        return {"secret": self.secret, "ssl": client_context(self.security.tls_ca_file)}

    def connect(self, **options: Any) -> Rockstate:
        return connect(self.address, **{**self._client_options(), **options})

    def status(self) -> dict:
        backend = ClusterBackend(self.address, wait=self.zookeeper is not None, **self._client_options())  # an election may be under way
        try:
            return backend.status()
        finally:
            backend.close()

    def _status_now(self) -> dict | None:
        """The status, or None when the coordinator did not answer in time (a loaded machine): asked again.

        Then a pause three times as long as the answer took: the document is built on the coordinator's event loop
        in O(P) (a row per partition's replicas, its sizes), and asked every 20 ms by a wait it kept that loop
        busy (P=1024: a third of its loop samples built or encoded the status), its heartbeats answered late."""
        start = time.monotonic()
        try:
            return self.status()
        except RockstateError as e:
            if e.retryable:
                return None
            raise
        finally:
            time.sleep(3 * (time.monotonic() - start))

    def wait_balanced(self, timeout: float = START_TIMEOUT) -> dict:
        """Wait until every partition is owned by a live node and the table is balanced."""

        seen: list = []

        def balanced():
            status = self._status_now()
            if status is None:
                return None
            seen[:] = [(n["node_id"], n["status"], n["partitions"]) for n in status["nodes"]]
            alive = [n for n in status["nodes"] if n["status"] == "alive"]
            counts = [n["partitions"] for n in alive]
            held = sum(counts) == status["partitions"]
            return status if alive and held and max(counts) - min(counts) <= 1 else None

        try:
            return wait_until(balanced, timeout, "a balanced partition table")
        except ClusterError as e:
            raise ClusterError(f"{e}; nodes (id, status, partitions): {seen}") from None

    def wait_replicated(self, timeout: float = START_TIMEOUT) -> dict:
        """Wait until the table is balanced and every partition has its backups (as many as the live nodes allow), all in sync."""
        self.wait_balanced(timeout)

        short: list = []

        def replicated():
            status = self._status_now()
            if status is None:
                return None
            alive = {n["node_id"] for n in status["nodes"] if n["status"] == "alive"}
            wanted = min(status["backup_count"], len(alive) - 1)
            short[:] = [r for r in status["replicas"] if r["primary"] not in alive or len(r["backups"]) != wanted or not all(
                b["in_sync"] and b["node"] in alive for b in r["backups"])]
            return None if short else status

        try:
            return wait_until(replicated, timeout, "every partition's backups in sync")
        except ClusterError as e:
            raise ClusterError(f"{e}; not yet: {short[:4]}") from None

    # -- nodes -------------------------------------------------------------

    def add_node(self, wait: bool = True, coordinator: str | None = None, zone: str | None = None) -> NodeInfo:
        """``coordinator``: the address the node reaches the coordinator at, if not its own (a proxy, in tests);
        ``zone``: its failure domain (``--zone``)."""
        [info] = self._start_nodes([self._new_data_dir(zone)], coordinator)
        if wait:
            self.wait_balanced()
        return info

    def _new_data_dir(self, zone: str | None) -> str:
        data_dir = os.path.join(self.root, f"node{self._next_dir}")
        self._next_dir += 1
        self._zones[data_dir] = zone
        return data_dir

    def _start_nodes(self, data_dirs: list[str], coordinator: str | None = None) -> list[NodeInfo]:
        """Start a node on each data directory, all at once (a process takes about a second to import)."""
        configs = [NodeConfig(
            coordinator=coordinator or self.address, host=self.hosts(os.path.basename(data_dir))[0], port=0, data_dir=data_dir,
            memory_bytes=self.node_memory_bytes, heartbeat_interval=min(0.5, self.heartbeat_timeout / 5),
            security=self.security, zone=self._zones.get(data_dir),
        ) for data_dir in data_dirs]
        infos = self._runner.start_nodes(configs)
        for info, data_dir in zip(infos, data_dirs):
            self._node_dirs[info.node_id] = data_dir
        return infos

    def nodes(self) -> list[NodeInfo]:
        return self._runner.running()

    def node(self, node_id: str) -> NodeInfo:
        for info in self.nodes():
            if info.node_id == node_id:
                return info
        raise ClusterError(f"no running node {node_id!r}; running: {[n.node_id for n in self.nodes()]}")

    def stop_node(self, node_id: str, timeout: float = 120.0) -> None:
        """Graceful: the node hands its partitions to the others, then exits."""
        self._runner.stop_node(self.node(node_id), timeout)

    def kill_node(self, node_id: str) -> None:
        """SIGKILL (or, in-process, an abrupt stop): no goodbye, partitions stay on its disk."""
        self._runner.kill_node(self.node(node_id))

    def restart_node(self, node_id: str) -> NodeInfo:
        """Start a stopped or killed node again, with its data directory and id."""
        [info] = self._start_nodes([self._node_dirs[node_id]])
        return info
