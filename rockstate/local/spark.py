"""Real Spark outside the driver's process, from the installed pyspark distribution, for tests and the demo.

``StandaloneSpark``: a standalone master and workers (Spark's own launch
classes through ``bin/spark-class``), each in its own JVM, bound to
127.0.0.1; executors run in further JVMs with their own Python workers.
``ConnectServer``: a local Spark Connect server (``bin/spark-submit`` of
``SparkConnectServer``); clients reach it at ``remote``. Both stop their
processes by PID on exit.

Executors import rockstate as the driver does: the driver's ``PYTHONPATH``
is handed to them through Spark's configuration (``executor_env``), never
assumed from the driver's environment.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack, closing

import pyspark

SPARK_HOME = os.path.dirname(pyspark.__file__)


def connect_server_bundled() -> bool:
    """Whether the installed pyspark can start a Spark Connect server: its jar is bundled from Spark 4.0 on (3.5's
    pip package has the client only; the server needs --packages org.apache.spark:spark-connect_2.12)."""
    jars = os.path.join(SPARK_HOME, "jars")
    return os.path.isdir(jars) and any(name.startswith("spark-connect_") for name in os.listdir(jars))


def _free_port() -> int:
    return _free_ports(1)[0]


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: their sockets stay bound until all are chosen (chosen one after another, a port
    closed can be handed out again, and two Spark services would then race for it)."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(closing(socket.socket())) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def _env() -> dict:
    return {**os.environ, "SPARK_HOME": SPARK_HOME, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
            "SPARK_NO_DAEMONIZE": "1"}


def executor_env() -> dict[str, str]:
    """Spark settings that give executors' Python workers the driver's Python and import path."""
    conf = {"spark.pyspark.python": sys.executable, "spark.pyspark.driver.python": sys.executable}
    if os.environ.get("PYTHONPATH"):
        conf["spark.executorEnv.PYTHONPATH"] = os.environ["PYTHONPATH"]
    return conf


def _stop(processes: list[subprocess.Popen], grace: float = 15.0) -> None:
    """SIGTERM, newest first, then SIGKILL what is left after ``grace`` seconds."""
    for proc in reversed(processes):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in processes:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait(condition, timeout: float, what: str, processes: list[subprocess.Popen], logs: list[str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [p for p in processes if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{what}: a Spark process exited with {dead[0].returncode}; see {logs}")
        try:
            if condition():
                return
        except OSError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{what}: not ready after {timeout:.0f} s; see {logs}")


class StandaloneSpark:
    """A standalone master and ``workers`` workers (one core, ``memory`` each) on 127.0.0.1."""

    def __init__(self, root: str, workers: int = 2, memory: str = "1g") -> None:
        self.root, self.workers, self.memory = root, workers, memory
        self.port, self.ui, *self.worker_uis = _free_ports(2 + workers)
        self.master = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen] = []
        self.logs: list[str] = []

    def _start(self, name: str, *args: str) -> None:
        log = os.path.join(self.root, f"{name}.log")
        self.logs.append(log)
        with open(log, "wb") as out:
            self.processes.append(subprocess.Popen([os.path.join(SPARK_HOME, "bin", "spark-class"), *args],
                                                   stdout=out, stderr=subprocess.STDOUT, env=_env(), cwd=self.root))

    def alive_workers(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=2) as reply:
            return sum(w["state"] == "ALIVE" for w in json.load(reply)["workers"])

    def __enter__(self) -> "StandaloneSpark":
        os.makedirs(self.root, exist_ok=True)
        try:
            self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                        "--port", str(self.port), "--webui-port", str(self.ui))
            for i in range(self.workers):
                work = os.path.join(self.root, f"worker-{i}")
                self._start(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", self.master, "--host", "127.0.0.1",
                            "--cores", "1", "--memory", self.memory, "--webui-port", str(self.worker_uis[i]), "--work-dir", work)
            _wait(lambda: self.alive_workers() == self.workers, 120, "standalone Spark", self.processes, self.logs)
        except BaseException:
            _stop(self.processes)
            raise
        return self

    def __exit__(self, *exc) -> None:
        _stop(self.processes)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]


class ConnectServer:
    """A Spark Connect server on 127.0.0.1 running ``master`` (default ``local[2,3]``); clients use ``remote``."""

    def __init__(self, root: str, master: str = "local[2,3]", conf: dict[str, str] | None = None) -> None:
        self.root, self.master, self.conf = root, master, dict(conf or {})
        self.port = _free_port()
        self.remote = f"sc://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen] = []
        self.log = os.path.join(root, "connect-server.log")

    def _listening(self) -> bool:
        with closing(socket.create_connection(("127.0.0.1", self.port), timeout=1)):
            return True

    def __enter__(self) -> "ConnectServer":
        os.makedirs(self.root, exist_ok=True)
        conf = {"spark.connect.grpc.binding.address": "127.0.0.1", "spark.connect.grpc.binding.port": str(self.port),
                "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1", "spark.ui.enabled": "false",
                **executor_env(), **self.conf}
        args = [os.path.join(SPARK_HOME, "bin", "spark-submit"), "--master", self.master,
                "--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "--name", "rockstate-connect"]
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        with open(self.log, "wb") as out:
            self.processes.append(subprocess.Popen([*args, "spark-internal"], stdout=out, stderr=subprocess.STDOUT,
                                                   env=_env(), cwd=self.root))
        try:
            _wait(self._listening, 180, "Spark Connect server", self.processes, [self.log])
        except BaseException:
            _stop(self.processes)
            raise
        return self

    def __exit__(self, *exc) -> None:
        _stop(self.processes)
