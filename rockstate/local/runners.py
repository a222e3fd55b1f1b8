"""Where LocalCluster's coordinators and nodes run: OS processes of the ``rockstate`` CLI (real SIGKILLs),
or one asyncio loop in a thread of this process (faster to start)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..config import CoordinatorConfig, NodeConfig, flat_values
from ..errors import ClusterError
from ..files import read_json
from ..cluster.coordinator.server import Coordinator
from ..cluster.node.server import Node

START_TIMEOUT = 60.0


@dataclass
class NodeInfo:
    node_id: str
    address: str
    pid: int
    data_dir: str


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


class ProcessRunner:
    def __init__(self, root: str, hosts: Callable[[str], tuple[str, list[str]]]) -> None:
        self.root, self.hosts = root, hosts
        self.logs = os.path.join(root, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.coordinators: dict[int, subprocess.Popen] = {}
        self.procs: dict[str, tuple[subprocess.Popen, NodeInfo]] = {}

    @staticmethod
    def _flags(config: CoordinatorConfig | NodeConfig) -> list[str]:
        """A flag for every setting that differs from its default."""
        defaults = flat_values(type(config)())
        return [arg for name, value in flat_values(config).items() if value != defaults[name]
                for arg in (f"--{name.replace('_', '-')}", str(value))]

    def _spawn(self, args: list[str], name: str) -> subprocess.Popen:
        """``name``'s process (its log: ``name``.log); the host's prefix execs it, so its PID is the process's."""
        log = open(os.path.join(self.logs, f"{name}.log"), "ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "ROCKSTATE_PARENT_PID": str(os.getpid())}  # it ends with this process
        try:
            return subprocess.Popen([*self.hosts(name)[1], sys.executable, "-m", "rockstate.cli", *args], stdout=log,
                                    stderr=subprocess.STDOUT, env=env)
        finally:
            log.close()

    def _address_of(self, proc: subprocess.Popen, data_dir: str, what: str) -> dict:
        path = os.path.join(data_dir, "address.json")

        def ready():
            if proc.poll() is not None:
                raise ClusterError(f"{what} exited with code {proc.returncode} while starting; see logs in {self.logs}")
            info = read_json(path)
            return info if info and info.get("pid") == proc.pid else None

        return wait_until(ready, START_TIMEOUT, f"{what} to start")

    def start_coordinators(self, configs: dict[int, CoordinatorConfig]) -> list[str]:
        """Start these coordinators (index -> config) all at once; their addresses, in that order."""
        for index, config in configs.items():
            self.coordinators[index] = self._spawn(["coordinator", *self._flags(config)], f"coordinator{index or ''}")
        return [self._address_of(self.coordinators[i], c.data_dir, "the coordinator")["address"] for i, c in configs.items()]

    def start_nodes(self, configs: list[NodeConfig]) -> list[NodeInfo]:
        procs = [self._spawn(["node", *self._flags(c)], os.path.basename(c.data_dir)) for c in configs]
        infos = []
        try:
            for proc, config in zip(procs, configs):
                found = self._address_of(proc, config.data_dir, f"node in {config.data_dir}")
                infos.append(NodeInfo(found["node_id"], found["address"], proc.pid, config.data_dir))
        except BaseException:
            for proc in procs:
                _kill(proc)
            raise
        for proc, info in zip(procs, infos):
            self.procs[info.node_id] = (proc, info)
        return infos

    def running(self) -> list[NodeInfo]:
        return [info for proc, info in self.procs.values() if proc.poll() is None]

    def stop_node(self, info: NodeInfo, timeout: float) -> None:
        proc, _ = self.procs.pop(info.node_id)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise ClusterError(f"node {info.node_id} did not leave within {timeout:g}s; killed") from None

    def kill_node(self, info: NodeInfo) -> None:
        proc, _ = self.procs.pop(info.node_id)
        _kill(proc)

    def kill_coordinator(self, index: int) -> None:
        proc = self.coordinators.pop(index, None)
        if proc is not None:
            _kill(proc)

    def close(self) -> None:
        for proc, _ in self.procs.values():
            _kill(proc)
        self.procs.clear()
        for proc in self.coordinators.values():
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                _kill(proc)
        self.coordinators.clear()


async def _left_running(grace: float = 1.0) -> list[str]:
    """The tasks on this loop other than the caller still pending after ``grace`` seconds (cancelled ones
    get that long to finish): where each was started, and where it waits."""
    deadline = time.monotonic() + grace
    while True:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
        if not tasks or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    return sorted(_describe_task(t) for t in tasks)


def _describe_task(task: asyncio.Task) -> str:
    coro = task.get_coro()
    code = getattr(coro, "cr_code", None)
    frame = getattr(coro, "cr_frame", None)
    started = f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})" if code is not None else repr(coro)
    waits = f", waiting at line {frame.f_lineno}" if frame is not None else ""
    return f"{task.get_name()}: {started}{waits}"


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


class ThreadRunner:
    """Everything on one asyncio loop in a daemon thread of this process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="rockstate-local-cluster", daemon=True)
        self.thread.start()
        self.coordinators: dict[int, Coordinator] = {}
        self.nodes: dict[str, Node] = {}
        self.pending_at_close: list[str] = []  # tasks still on the loop after every node and coordinator stopped

    def _run(self, coro, timeout: float = START_TIMEOUT):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start_coordinators(self, configs: dict[int, CoordinatorConfig]) -> list[str]:
        async def start(index, config):
            coordinator = self.coordinators[index] = Coordinator(config)
            await coordinator.start()
            return coordinator.address

        return [self._run(start(index, config)) for index, config in configs.items()]

    def start_nodes(self, configs: list[NodeConfig]) -> list[NodeInfo]:
        async def start(config):
            node = Node(config)
            await node.start()
            return node

        infos = []
        for config in configs:  # one loop: in turn (they would not start faster together)
            node = self._run(start(config))
            self.nodes[node.node_id] = node
            infos.append(NodeInfo(node.node_id, node.address, os.getpid(), node.data_dir))
        return infos

    def running(self) -> list[NodeInfo]:
        return [NodeInfo(n.node_id, n.address, os.getpid(), n.data_dir) for n in self.nodes.values()]

    def stop_node(self, info: NodeInfo, timeout: float) -> None:
        self._run(self.nodes.pop(info.node_id).leave(), timeout)

    def kill_node(self, info: NodeInfo) -> None:
        self._run(self.nodes.pop(info.node_id).stop())

    def kill_coordinator(self, index: int) -> None:
        coordinator = self.coordinators.pop(index, None)
        if coordinator is not None:
            self._run(coordinator.stop())

    def close(self) -> None:
        async def stop_all():
            for node in self.nodes.values():
                await node.stop()
            for coordinator in self.coordinators.values():
                await coordinator.stop()
            self.pending_at_close = await _left_running()

        try:
            self._run(stop_all())
        finally:
            self.nodes.clear()
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()
