"""A client workload for the history checker: threads doing random single-key reads, writes and compare-and-sets,
and batch puts (a write of each of its keys, each key's its own process in the history), on a few keys of a cluster, each recorded in a ``History`` (``recording.py``) that ``history.check_history`` judges."""

from __future__ import annotations

import random
import threading
from typing import Callable

from ..local.cluster import wait_until
from ..errors import RockstateError
from .recording import CAS, READ, WRITE, History


def keys_for(rs, per_partition: int = 1) -> list[int]:
    """Small int keys, ``per_partition`` in every partition."""
    keys, count = [], {}
    for k in range(10_000):
        pid = rs.partition_of(k)
        if count.get(pid, 0) < per_partition:
            count[pid] = count.get(pid, 0) + 1
            keys.append(k)
        if len(keys) == per_partition * rs.partitions:
            return keys
    raise AssertionError("no keys for some partition")


class Workload:
    """Client threads, each with its own connection, doing random reads, writes and compare-and-sets on
    a few keys and recording every one in ``history``. Written values are unique.

    Several workloads may share a history: ``first`` numbers this one's processes after another's.
    ``enter``: called first in each client thread (to move it into a network namespace, say); ``timeout``: each
    client's retry and request timeout."""

    def __init__(self, cluster, history: History, keys: list, threads: int = 6, seed: int = 0, first: int = 0,
                 enter: Callable[[], None] | None = None, timeout: float = 10.0) -> None:
        self.cluster, self.history, self.keys = cluster, history, keys
        self.first, self.enter, self.timeout = first, enter, timeout
        self.done = [0] * threads
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(p, random.Random(seed * 100 + first + p)), daemon=True)
                         for p in range(threads)]

    def _run(self, index: int, rnd: random.Random) -> None:
        try:
            if self.enter is not None:
                self.enter()
            process = self.first + index
            with self.cluster.connect(retry_timeout=self.timeout, timeout=self.timeout) as rs:
                state = rs.value_state("register", create=True)  # read before any write
                seen: dict = {}
                serial = 0
                while not self._stop.is_set():
                    serial += 1
                    self._one(process, rnd, state, seen, process * 1_000_000 + serial)
                    self.done[index] += 1
        except BaseException as e:  # noqa: BLE001 -- reported by check()
            self.errors.append(e)

    def _one(self, process, rnd, state, seen, unique) -> None:
        h, key, dice = self.history, rnd.choice(self.keys), rnd.random()
        if dice < 0.4:
            op = h.invoke(process, READ, key)
            try:
                seen[key] = value = state.get(key)
            except RockstateError as e:
                h.fail(op, e)  # a read changes nothing: a failed one is left out
            else:
                h.ok(op, value)
        elif dice < 0.6:
            op = h.invoke(process, WRITE, key, unique)
            try:
                state.put(key, unique)
            except RockstateError as e:
                h.info(op, e)  # it may have been applied before the error
            else:
                h.ok(op, None)
                seen[key] = unique
        elif dice < 0.7:  # a batch put: a write of each key (a piece per partition, replicated as runs)
            batch = {k: f"{unique}.{j}" for j, k in enumerate(rnd.sample(self.keys, min(len(self.keys), rnd.randint(2, 6))))}
            ops = {k: h.invoke((process, j), WRITE, k, v) for j, (k, v) in enumerate(batch.items())}
            try:
                state.put_many(batch)
            except RockstateError as e:
                for op in ops.values():
                    h.info(op, e)  # each may have been applied before the error
            else:
                for op in ops.values():
                    h.ok(op, None)
                seen.update(batch)
        else:
            expected = seen.get(key)
            op = h.invoke(process, CAS, key, (expected, unique))
            try:
                applied = state.compare_and_set(key, expected, unique)
            except RockstateError as e:
                h.info(op, e)  # it may have been applied before the error
            else:
                h.ok(op, applied)
                if applied:
                    seen[key] = unique

    def wait_ops(self, n: int, timeout: float = 30.0) -> None:
        """Wait until every thread has completed ``n`` more operations."""
        target = [d + n for d in self.done]
        try:
            wait_until(lambda: self.errors or all(d >= t for d, t in zip(self.done, target)), timeout, f"{n} operations per thread")
        except RockstateError as e:  # say where the clients are stuck
            status = self.cluster.status()
            stuck = [r for r in status.get("replicas", []) if r.get("waiting_for_election") or r.get("primary") is None]
            raise AssertionError(f"{e}: done {self.done} of {target}; partitions without a primary {stuck}; "
                                 f"owners {status.get('owners')}; last events {status.get('events', [])[-12:]}") from e
        assert not self.errors, self.errors

    def __enter__(self) -> "Workload":
        for th in self._threads:
            th.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for th in self._threads:
            th.join(30)
        assert not any(th.is_alive() for th in self._threads)

    def kinds(self) -> dict:
        ops = self.history.operations()
        return {kind: sum(1 for o in ops if o.kind == kind and o.status == "ok") for kind in (READ, WRITE, CAS)} | {
            "cas applied": sum(1 for o in ops if o.kind == CAS and o.output is True),
            "batch writes": sum(1 for o in ops if o.kind == WRITE and type(o.process) is tuple and o.status == "ok"),
            "info": sum(1 for o in ops if o.status == "info")}


def read_back(rs, history: History, keys: list) -> None:
    """Every key read once more, into the history (process "final"): a lost write shows there."""
    state = rs.value_state("register", create=True)
    for key in keys:
        history.ok(history.invoke("final", READ, key), state.get(key))
