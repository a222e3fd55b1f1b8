"""A cluster for one test, and the check that it left nothing behind (after dask.distributed's ``gen_cluster``).

``gen_cluster`` decorates a test: the test gets a started ``LocalCluster`` as its ``cluster`` argument (in
process unless ``processes=True``), the cluster is stopped when the test ends, and then the test fails if a
thread, a file descriptor (a socket, a RocksDB file), a child process or an asyncio task of the cluster is still
there::

    @gen_cluster(nodes=2, partitions=8, checkpoints="file://{root}/chk")
    def test_checkpoint(cluster, tmp_path):
        with cluster.connect() as rs:
            ...

``{root}`` in a string option is the cluster's root directory (a fresh temporary directory, removed afterwards,
unless ``root`` is given). ``local_cluster(...)`` is the same as a ``with`` block, for a test that starts
clusters one after another or a fixture shared by a module; ``no_leaks()`` is the check alone.

What counts as a leak: a thread, fd or child process that was not there when the block began and is still there
``LEAK_GRACE`` seconds after it ended (threads finish, sockets close and processes are reaped in the meantime),
and any asyncio task still pending on the in-process cluster's loop once every node and coordinator stopped.
Threads of the interpreter's and Spark's own that live on by design (``LONG_LIVED_THREADS``) are not counted.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, TypeVar

from ..local.cluster import LocalCluster

__all__ = ["LEAK_GRACE", "LONG_LIVED_THREADS", "Leaks", "LeakError", "gen_cluster", "local_cluster", "no_leaks"]

LEAK_GRACE = 5.0  # seconds a thread, fd or process gets to go away after the block (a loaded machine is slow)

# threads that outlive a test by design: (name prefix, module prefix of the thread's target), either may be ""
LONG_LIVED_THREADS: tuple[tuple[str, str], ...] = (
    ("", "py4j"),  # PySpark's gateway: its connection and callback threads live as long as the Spark session
    ("", "pyspark"),
    ("", "concurrent.futures"),  # an idle worker of a shared pool (e.g. asyncio.to_thread's default executor)
    ("ThreadPoolExecutor-", ""),
    ("asyncio_", ""),  # a loop's default executor: shut down (without waiting) when its loop closes
    ("pydevd.", ""),  # a debugger
    ("pytest_timeout", ""),
)


class LeakError(AssertionError):
    """What a test left behind (its message lists each thing, with a leaked thread's stack)."""


@dataclass
class Leaks:
    threads: list[str] = field(default_factory=list)
    fds: list[str] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.threads or self.fds or self.processes or self.tasks)

    def __str__(self) -> str:
        parts = []
        for what, items in (("thread", self.threads), ("file descriptor", self.fds), ("child process", self.processes),
                            ("asyncio task", self.tasks)):
            if items:
                parts.append(f"{len(items)} leaked {what}(s):\n" + "\n".join(f"  - {item}" for item in items))
        return "\n".join(parts)


def _long_lived(thread: threading.Thread) -> bool:
    target = getattr(thread, "_target", None)
    module = getattr(target, "__module__", None) or type(thread).__module__ or ""
    return any((not name or thread.name.startswith(name)) and (not mod or module.startswith(mod))
               and (name or mod) for name, mod in LONG_LIVED_THREADS)


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.is_alive()}


def _describe_thread(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident or -1)
    stack = "".join(traceback.format_stack(frame)[-6:]) if frame is not None else "    (no stack)\n"
    target = getattr(thread, "_target", None)
    where = f" target={getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', target)}" if target else ""
    return f"{thread.name!r} (daemon={thread.daemon}{where}); its stack:\n" + "".join(
        "      " + line + "\n" for line in stack.rstrip().splitlines())


def _fds() -> dict[int, str]:
    """This process's open file descriptors: fd -> what it is (a path, socket:[inode], pipe:[inode], ...)."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    return found


def _children() -> dict[int, str]:
    """This process's child processes (zombies included: a child nobody waited for): pid -> its command line."""
    pids: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/children") as f:
                pids.update(int(p) for p in f.read().split())
    found = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # gone meanwhile
        found[pid] = f"pid {pid} [{state}] {cmd[:200] or '(zombie)'}"
    return found


@dataclass
class _Snapshot:
    threads: set[threading.Thread]
    fds: dict[int, str]
    children: dict[int, str]

    @classmethod
    def now(cls) -> "_Snapshot":
        return cls(_threads(), _fds(), _children())

    def new_since(self, before: "_Snapshot") -> Leaks:
        threads = [t for t in self.threads - before.threads if not _long_lived(t)]
        # an fd number reused for something else counts as new; one of a long-lived thread's is not a leak of ours
        fds = {fd: what for fd, what in self.fds.items() if before.fds.get(fd) != what}
        children = {pid: what for pid, what in self.children.items() if pid not in before.children}
        return Leaks(threads=[_describe_thread(t) for t in sorted(threads, key=lambda t: t.name)],
                     fds=[f"fd {fd} -> {what}" for fd, what in sorted(fds.items())],
                     processes=sorted(children.values()))


@contextlib.contextmanager
def no_leaks(grace: float = LEAK_GRACE, tasks: Callable[[], list[str]] | None = None) -> Iterator[None]:
    """Raise ``LeakError`` if the block leaves a thread, fd or child process behind (after up to ``grace``
    seconds for them to go), or ``tasks()`` (asked once the block ended) names pending asyncio tasks. Not
    checked when the block raised: its own error says more."""
    before = _Snapshot.now()
    yield
    pending = tasks() if tasks is not None else []
    deadline = time.monotonic() + grace
    while True:
        gc.collect()  # an unreferenced socket or file is closed when collected: not a leak of the code under test
        leaks = _Snapshot.now().new_since(before)
        if not leaks or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    leaks.tasks = pending
    if leaks:
        raise LeakError(f"the test left behind:\n{leaks}")


def _format_options(options: dict[str, Any], root: str) -> dict[str, Any]:
    return {k: v.replace("{root}", root) if isinstance(v, str) else v for k, v in options.items()}


def _pending_tasks(clusters: list[LocalCluster]) -> list[str]:
    """What the in-process clusters' loops still ran once their nodes and coordinators stopped."""
    return [task for c in clusters for task in getattr(c._runner, "pending_at_close", [])]


@contextlib.contextmanager
def local_cluster(nodes: int = 3, partitions: int = 16, *, processes: bool = False, check_leaks: bool = True,
                  grace: float = LEAK_GRACE, **options: Any) -> Iterator[LocalCluster]:
    """A started ``LocalCluster`` (in process by default) for the block; stopped after it, then checked for
    leaks (``LeakError``). ``options``: LocalCluster's other arguments; ``{root}`` in a string is its root."""
    own_root = options.get("root") is None
    root = tempfile.mkdtemp(prefix="rockstate-test-cluster-") if own_root else str(options.pop("root"))
    options = _format_options(options, root)
    started: list[LocalCluster] = []
    try:
        with no_leaks(grace, tasks=lambda: _pending_tasks(started)) if check_leaks else contextlib.nullcontext():
            started.append(LocalCluster(nodes=nodes, partitions=partitions, root=root, processes=processes, **options))
            with started[0] as cluster:  # one that fails to start stops what it started
                yield cluster
    finally:
        if own_root:
            shutil.rmtree(root, ignore_errors=True)


F = TypeVar("F", bound=Callable[..., Any])


def gen_cluster(nodes: int = 3, partitions: int = 16, **options: Any) -> Callable[[F], F]:
    """Decorate a test whose first argument is the cluster: it runs with a started cluster of ``nodes`` nodes
    (``local_cluster``'s options), which is stopped and checked for leaks after it. The test's other arguments
    are pytest fixtures and parameters as usual. ``{tmp_path}`` in a string option is the test's ``tmp_path``."""
    wants_tmp_path = any(isinstance(v, str) and "{tmp_path}" in v for v in options.values())

    def decorate(test: F) -> F:
        signature = inspect.signature(test)
        params = list(signature.parameters.values())
        if not params:
            raise TypeError(f"{test.__qualname__}: a gen_cluster test takes the cluster as its first argument")
        fixtures = params[1:]
        takes_tmp_path = any(p.name == "tmp_path" for p in fixtures)
        if wants_tmp_path and not takes_tmp_path:
            fixtures.append(inspect.Parameter("tmp_path", inspect.Parameter.POSITIONAL_OR_KEYWORD))

        @functools.wraps(test)
        def run(**kwargs: Any) -> Any:
            tmp_path = kwargs["tmp_path"] if takes_tmp_path else kwargs.pop("tmp_path", None)
            opts: dict[str, Any] = {
                k: v.replace("{tmp_path}", str(tmp_path)) if isinstance(v, str) else v for k, v in options.items()}
            with local_cluster(nodes, partitions, **opts) as cluster:
                return test(cluster, **kwargs)

        run.__signature__ = signature.replace(parameters=fixtures)  # type: ignore[attr-defined]  # pytest's fixtures
        return run  # type: ignore[return-value]

    return decorate
