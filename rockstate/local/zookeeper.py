"""A real ZooKeeper for tests: Debian's ``zookeeper`` package run standalone as a plain process on 127.0.0.1.

``ZooKeeperServer(data_dir)`` writes a ``zoo.cfg`` next to its data, starts
``ZooKeeperServerMain`` on a free port and waits until a client connects;
``stop()`` ends it by its PID. ``start()`` again reuses the port and the data
directory, so what was written (and the sessions still within their timeout)
survives a restart, as it does for a restarted server in production.

``tickTime`` is short (0.2 s) so sessions may be as short as 0.4 s (twice the
tick): tests that wait for a session to expire stay fast.

``ZooKeeperEnsemble(data_dir, size=3)`` runs a quorum of such servers
(``QuorumPeerMain``, each ``zoo.cfg`` with the ``server.N`` lines and a
``myid``), whose ``hosts`` lists every server; one can be stopped and started
as a machine of a real ensemble would.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
from typing import Any

from ..errors import ConfigError
from .runners import free_port, wait_until

JARS = ("/usr/share/java/zookeeper.jar",)  # libzookeeper-java's manifest names its dependencies
TICK_MS = 200


_PROBE_LOG = logging.getLogger(__name__ + ".probe")
_PROBE_LOG.setLevel(logging.CRITICAL)  # a refused probe is the expected answer while the server starts


def _connects(hosts: str) -> bool:
    from kazoo.client import KazooClient
    from kazoo.handlers.threading import KazooTimeoutError

    client = KazooClient(hosts, timeout=1.0, connection_retry={"max_tries": 0}, logger=_PROBE_LOG)
    try:
        client.start(timeout=1.0)
        return True
    except KazooTimeoutError:
        return False
    finally:
        client.stop()
        client.close()


class ZooKeeperServer:
    def __init__(self, data_dir: str, port: int | None = None, myid: int | None = None,
                 quorum: dict[int, tuple[int, int]] | None = None) -> None:
        """``myid`` and ``quorum`` (each server's id: its peer and election ports): a member of an ensemble."""
        missing = [jar for jar in JARS if not os.path.exists(jar)]
        if missing or not shutil.which("java"):
            raise ConfigError(f"ZooKeeper is not installed ({', '.join(missing) or 'no java'} missing): "
                              "run scripts/setup.sh, which installs Debian's zookeeper package")
        self.data_dir = os.path.abspath(data_dir)
        self.port = port or free_port()
        self.myid, self.quorum = myid, quorum
        self.proc: subprocess.Popen | None = None

    @property
    def hosts(self) -> str:
        """The connection string clients are given."""
        return f"127.0.0.1:{self.port}"

    def _write_config(self) -> str:
        os.makedirs(os.path.join(self.data_dir, "data"), exist_ok=True)
        path = os.path.join(self.data_dir, "zoo.cfg")
        with open(path, "w") as f:
            f.write(f"tickTime={TICK_MS}\n"
                    f"dataDir={os.path.join(self.data_dir, 'data')}\n"
                    f"clientPort={self.port}\nclientPortAddress=127.0.0.1\n"
                    "admin.enableServer=false\n"  # its HTTP port would be one more to pick
                    f"minSessionTimeout={2 * TICK_MS}\nmaxSessionTimeout=60000\n")
            if self.quorum:
                f.write("initLimit=10\nsyncLimit=5\n" + "".join(
                    f"server.{n}=127.0.0.1:{peer}:{election}\n" for n, (peer, election) in sorted(self.quorum.items())))
        if self.quorum:
            with open(os.path.join(self.data_dir, "data", "myid"), "w") as f:
                f.write(f"{self.myid}\n")
        return path

    def launch(self) -> None:
        """Start the process; ``start`` also waits until it accepts clients."""
        config = self._write_config()
        main = "quorum.QuorumPeerMain" if self.quorum else "ZooKeeperServerMain"
        with open(os.path.join(self.data_dir, "zookeeper.log"), "ab") as log:
            self.proc = subprocess.Popen(
                ["java", "-Xmx128m", "-XX:+UseSerialGC", "-cp", ":".join(JARS), f"org.apache.zookeeper.server.{main}", config],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def start(self, timeout: float = 30.0) -> "ZooKeeperServer":
        self.launch()
        return self.wait(timeout)

    def wait(self, timeout: float = 30.0) -> "ZooKeeperServer":
        proc = self.proc
        wait_until(lambda: proc.poll() is not None or _connects(self.hosts), timeout, "ZooKeeper to accept clients")
        if proc.poll() is not None:
            raise RuntimeError(f"ZooKeeper exited at start (code {proc.returncode}); see {self.data_dir}/zookeeper.log")
        return self

    def stop(self, kill: bool = False) -> None:
        """End the server by its PID (``kill``: SIGKILL, as a crash)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def restart(self, kill: bool = False) -> None:
        self.stop(kill)
        self.start()

    def __enter__(self) -> "ZooKeeperServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class ZooKeeperEnsemble:
    def __init__(self, data_dir: str, size: int = 3) -> None:
        quorum = {n: (free_port(), free_port()) for n in range(1, size + 1)}
        self.servers = [ZooKeeperServer(os.path.join(data_dir, f"zk{n}"), myid=n, quorum=quorum) for n in quorum]

    @property
    def hosts(self) -> str:
        return ",".join(server.hosts for server in self.servers)

    def start(self, timeout: float = 60.0) -> "ZooKeeperEnsemble":
        for server in self.servers:  # all at once: a member answers clients only once a quorum has formed
            server.launch()
        for server in self.servers:
            server.wait(timeout)
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def __enter__(self) -> "ZooKeeperEnsemble":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
