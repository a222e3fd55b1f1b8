"""The routing client: the state handles' backend over a cluster.

It caches the partition table, sends a batch as one request per owner (all
owners at once, see ``call_many``), and on NOT_OWNER, a moving partition or a
lost connection refreshes the table and retries the groups that failed, until
``retry_timeout``; then it raises a ``ClusterTimeoutError`` naming the last
error. Between two tries it waits for a newer table (``tables.py``) rather
than sleeping: a partition promoted after its node's death is retried as soon
as the nodes have the table, not at the end of the backoff's wait.
Synchronous and thread-safe: it runs inside Spark executors.

Retries: reads and scans are safe to repeat. Each write and compare-and-set
carries a request id, the same in all its retries, and the owner applies it
once (``store/requests.py``), so a retry after a lost reply neither appends
twice nor overwrites a later write.
"""

from __future__ import annotations

import logging
from ssl import SSLContext
import threading
from typing import Any, Callable, Iterable, cast

import numpy as np

from ...api import Rockstate
from ...checkpoint.manifest import checksum_file
from ...errors import (ClusterTimeoutError, ConnectionLostError, PartitionUnavailableError, ProtocolError, RockstateError,
                       StoreClosedError, UnknownOperationError)
from ...retry import Retry
from ...ops import run_groups
from ...runs import get_many_as_runs, objects
from ...rpc.client import Channel, call_many
from ...rpc.messages import Message
from ...states import Checkpointer
from ...store import StateSpec, requests
from .. import protocol as p
from .bulk import upload_and_ingest
from .checkpoints import ClusterCheckpointClient
from .tables import Tables
from .events import Subscription
from ..leader_channel import CoordinatorChannel
from ..security import load_secret
from ..table import Table

log = logging.getLogger(__name__)


class ClusterBackend:
    def __init__(self, address: str, *, timeout: float = 30.0, retry_timeout: float = 30.0,
                 secret: bytes | str | None = None, ssl: SSLContext | None = None, wait: bool = False,
                 read_from_backup: bool = False) -> None:
        """``secret``: the cluster's shared secret (default: $ROCKSTATE_SECRET); ``ssl``: a client TLS context.

        ``wait``: retry the first contact with the coordinator too (a Spark
        task starting while it restarts); by default a coordinator that cannot
        be reached at all is reported at once, as a wrong address or a TLS
        mismatch is, and only later requests are retried.
        """
        self.address = address
        self.retry_timeout = retry_timeout
        self.read_from_backup = read_from_backup
        self._runs_written = True  # batch puts as ``WriteRuns`` (False: a node of an earlier version refused one)
        self.retry = Retry(deadline=retry_timeout)
        self._timeout = timeout
        self._secret = load_secret(None) if secret is None else secret
        self._ssl = ssl
        self._closed = False
        self._coordinator = CoordinatorChannel(address, self._new_channel)  # it follows the leader among several
        self._channels: dict[str, Channel] = {}
        self._lock = threading.Lock()
        self.checkpointer: Checkpointer | None = ClusterCheckpointClient(self._coordinator, self._ask)  # one: it remembers the last restore
        self.tables = Tables(self._coordinator, self._ask, timeout, wait)
        self.partitions = self.table.partitions

    # -- table and channels --------------------------------------------------

    def _ask(self, msg: Message, timeout: float | None = None) -> Any:
        """A call to the coordinator, retried while it cannot be reached (restarting) until ``retry_timeout``.

        Only for requests that may be repeated: reads, idempotent updates, and
        a checkpoint trigger (a second checkpoint is harmless).
        """
        return self.retry.replace(retry_on=lambda e: isinstance(e, ConnectionLostError)).call(
            self._coordinator.call, msg, timeout,
            give_up=lambda e: ClusterTimeoutError(f"gave up after {self.retry_timeout:g}s reaching the coordinator: {e}"))

    @property
    def table(self) -> Table:
        return self.tables.table

    @property
    def max_key_bytes(self) -> int:
        return self.tables.limits["max_key_bytes"]

    @property
    def max_value_bytes(self) -> int:
        return self.tables.limits["max_value_bytes"]

    def refresh(self) -> Table:
        return self.tables.refresh()

    def _new_channel(self, address: str) -> Channel:
        return Channel(address, timeout=self._timeout, secret=self._secret, ssl=self._ssl, name="client")

    def _channel(self, address: str) -> Channel:
        with self._lock:
            if self._closed:
                raise StoreClosedError("this cluster client is closed")
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = self._new_channel(address)
            return channel

    def _routed(self, groups: dict[int, Any], make: Callable[[int, list], Message],
                address_of: Callable[[Table, int], str | None] = Table.owner_address) -> dict[int, Any]:
        """Send each partition's group to its owner (or ``address_of``), one request per node; retry what failed."""
        if len(groups) == 1:  # one partition (a one-key call): no grouping by owner
            [(pid, group)] = groups.items()
            answer = self._on_owner(pid, lambda channel, epoch: channel.call(make(epoch, [[pid, group]])), address_of)
            return {pid: None if answer is None else answer[0]}
        results: dict[int, Any] = {}
        pending = dict(groups)

        def attempt() -> dict[int, Any]:
            table = self.table
            by_owner, last_error = _by_owner(table, pending, lambda pid: pid, address_of)
            owners = list(by_owner.items())
            calls = [(self._channel(addr), make(table.epoch, [[pid, pending[pid]] for pid in pids])) for addr, pids in owners]
            for (addr, pids), answer in zip(owners, self._call_all(calls)):
                if isinstance(answer, RockstateError):
                    if not answer.retryable:
                        raise answer
                    last_error = answer
                    continue
                for pid, value in zip(pids, answer if answer is not None else [None] * len(pids)):
                    results[pid] = value
                    del pending[pid]
            if pending:
                raise cast(RockstateError, last_error)  # set: a partition stays pending only after an error
            return results

        return self._retried(attempt, lambda: sorted(pending))

    @staticmethod
    def _call_all(calls: list) -> list:
        if len(calls) == 1:  # the common case of one owner: no need to overlap anything
            channel, msg = calls[0]
            try:
                return [channel.call(msg)]
            except RockstateError as e:
                return [e]
        return call_many(calls)

    def _retried(self, attempt: Callable[[], Any], pids: Callable[[], list[int]]) -> Any:
        """``attempt()`` retried on retryable errors, refreshing the table in between, until ``retry_timeout``."""
        def give_up(error: BaseException) -> ClusterTimeoutError:
            left = pids()
            return ClusterTimeoutError(f"gave up after {self.retry_timeout:g}s on partitions {left[:8]}: {error}",
                                       partitions=left[:64])

        try:  # the first attempt outside the retry loop: setting one up costs a one-key get ~15% of its time
            return attempt()
        except RockstateError as e:
            if not e.retryable:
                raise
        self.tables.refresh_quietly()
        return self.retry.call(attempt, sleep=self.tables.wait, give_up=give_up)

    # -- the Backend protocol --------------------------------------------------

    def define_state(self, spec: StateSpec, create: bool = True) -> StateSpec:
        return StateSpec.from_dict(self._ask(p.DefineState(spec=spec.to_dict(), create=create)))

    def write(self, ops_by_pid: dict[int, list]) -> None:
        self._write_groups(ops_by_pid, requests.new_id())

    def _write_groups(self, ops_by_pid: dict[int, list], request: bytes) -> None:
        self._routed(ops_by_pid, lambda epoch, groups: p.Write(epoch=epoch, groups=groups, request=request))

    def write_runs(self, op: int, state: str, pids: list[int], counts: list[int], keys: list[bytes],
                   values: list[bytes] | None) -> None:
        """``runs.py``: each owner's runs in one ``WriteRuns`` (all owners at once), as columns, applied once per
        request id; what failed retried. A node of an earlier version refuses the message: the runs go as ``Write``
        groups from then on, with the same request id (a run it or another node applied is not applied again)."""
        request = requests.new_id()
        if self._runs_written:
            def write(epoch: int, runs: list[int], at: list[int] | None) -> p.WriteRuns:
                return p.WriteRuns(epoch=epoch, state=state, pids=[pids[r] for r in runs], counts=[counts[r] for r in runs],
                                   keys=keys if at is None else list(map(keys.__getitem__, at)),
                                   values=values if values is None or at is None else list(map(values.__getitem__, at)),
                                   request=request)
            try:
                self._routed_runs(pids, counts, write, lambda runs, at, answer: None)
                return
            except UnknownOperationError as e:
                log.warning("a node refused runs of a batch put (%s): batch puts go as a group per partition from now on", e)
                self._runs_written = False
        self._write_groups(dict(run_groups(op, state, pids, counts, keys, values)), request)

    def get_many(self, state: str, keys_by_pid: dict[int, list[bytes]]) -> dict[int, list[bytes | None]]:
        return get_many_as_runs(self.read_runs, state, keys_by_pid)

    def read_runs(self, state: str, pids: list[int], counts: list[int], keys: list[bytes]) -> list[bytes | None]:
        """``runs.py``: each owner's runs in one ``Read`` (all owners at once), as columns; what failed retried."""
        backup = self.read_from_backup
        address_of = _backup_address if backup else Table.owner_address

        def read(epoch: int, runs: list[int], at: list[int] | None) -> p.Read:
            return p.Read(epoch=epoch, state=state, pids=[pids[r] for r in runs], counts=[counts[r] for r in runs],
                          keys=keys if at is None else list(map(keys.__getitem__, at)), backup=backup)

        if not keys:
            return []
        if len(pids) == 1:  # one partition (a one-key get): no grouping by owner
            return self._on_owner(pids[0], lambda channel, epoch: _values(channel.call(read(epoch, [0], None)), len(keys)),
                                  address_of)
        values = np.empty(len(keys), dtype=object)

        def take(runs: list[int], at: list[int] | None, answer: Any) -> None:
            values[slice(None) if at is None else at] = objects(_values(answer, len(keys) if at is None else len(at)))

        self._routed_runs(pids, counts, read, take, address_of)
        return values.tolist()

    def _routed_runs(self, pids: list[int], counts: list[int], make: Callable[[int, list[int], list[int] | None], Message],
                     take: Callable[[list[int], list[int] | None, Any], None],
                     address_of: Callable[[Table, int], str | None] = Table.owner_address) -> None:
        """Runs of keys (``runs.py``) to their partitions' owners (or ``address_of``), each owner's in one request,
        ``make(table epoch, its runs, the indices of their keys or None for all)``, all owners at once; ``take(runs,
        at, answer)`` for each answered; what failed retried, the table refreshed."""
        run_of_key = np.repeat(np.arange(len(pids)), counts)
        pending = set(range(len(pids)))

        def attempt() -> None:
            table = self.table
            by_owner, last_error = _by_owner(table, sorted(pending), pids.__getitem__, address_of)
            calls, at_of = [], []
            for address, runs in by_owner.items():
                if len(runs) == len(pids):  # all to one owner (a Spark task's): the keys as they are
                    at = None
                else:
                    chosen = np.zeros(len(pids), dtype=bool)
                    chosen[runs] = True
                    at = np.flatnonzero(chosen[run_of_key]).tolist()
                at_of.append((runs, at))
                calls.append((self._channel(address), make(table.epoch, runs, at)))
            for (runs, at), answer in zip(at_of, self._call_all(calls)):
                if isinstance(answer, RockstateError):
                    if not answer.retryable:
                        raise answer
                    last_error = answer
                    continue
                take(runs, at, answer)
                pending.difference_update(runs)
            if pending:
                raise cast(RockstateError, last_error)  # set: a run stays pending only after an error

        self._retried(attempt, lambda: sorted({pids[r] for r in pending}))

    def compare_and_set(self, state: str, pid: int, key: bytes, expected: bytes | None, new: bytes) -> bool:
        """Atomically on the partition's owner; answers whether it applied.

        Retried like a write until ``retry_timeout``: its request id makes the
        owner answer a retry with the first attempt's outcome. A
        ``ClusterTimeoutError`` therefore means it may or may not have applied.
        """
        request = requests.new_id()
        return self._on_owner(pid, lambda channel, epoch: channel.call(
            p.CompareAndSet(epoch=epoch, groups=[[pid, [state, key, expected, new]]], request=request))[0])

    def _on_owner(self, pid: int, call: Callable[[Channel, int], Any],
                  address_of: Callable[[Table, int], str | None] = Table.owner_address) -> Any:
        """``call(channel to pid's owner (or ``address_of``), table epoch)``, retried on NOT_OWNER, a moving
        partition or a lost connection (refreshing the table) until ``retry_timeout``."""
        def attempt() -> Any:
            table = self.table
            address = address_of(table, pid)
            if address is None:
                raise PartitionUnavailableError(f"partition {pid} has no live owner", partition=pid)
            return call(self._channel(address), table.epoch)

        return self._retried(attempt, lambda: [pid])

    def scan(self, state: str, pid: int, prefix: bytes, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        return self._on_owner(pid, lambda channel, epoch: [tuple(entry) for entry in channel.call(
            p.Scan(epoch=epoch, partition=pid, state=state, prefix=prefix, after=after, limit=limit))])

    def scan_many(self, state: str, pages_by_pid: dict[int, tuple]) -> dict[int, tuple[list[bytes], list[bytes]]]:
        """A page of each partition, ``(prefix, after, stop, limit)`` as ``scan`` (``stop``: the first key not
        wanted, None: none), as (keys, values): one request per owner."""
        found = self._routed({pid: list(page) for pid, page in pages_by_pid.items()},
                             lambda epoch, groups: p.ScanMany(epoch=epoch, state=state, groups=groups, columns=True))
        return {pid: p.page_of(page) for pid, page in found.items()}

    # -- bulk ingestion (see cluster/ingest.py) ------------------------------------

    def ingest_sst(self, state: str, pid: int, path: str) -> int:
        """Ingest an SST file made by ``ingest.write_sst`` into ``state`` of partition ``pid``; returns its size.

        The file goes to the partition's owner; on NOT_OWNER, a moving partition
        or a lost connection the table is refreshed and the whole upload is
        retried (ingesting a file twice is harmless) until ``retry_timeout``.
        """
        size, checksum = checksum_file(path)
        return self._on_owner(pid, lambda channel, epoch: upload_and_ingest(channel, epoch, pid, state, path, size, checksum))

    # -- staged micro-batch transactions (see store/staging.py) ------------------

    def stage(self, query: str, batch: int, operator: str, attempt: int, seq: int, ops_by_pid: dict[int, list]) -> None:
        self._routed(ops_by_pid, lambda epoch, groups: p.Stage(
            epoch=epoch, query=query, batch=batch, operator=operator, attempt=attempt, seq=seq, groups=groups))

    def stage_done(self, query: str, batch: int, operator: str, attempt: int, pieces_by_pid: dict[int, int]) -> None:
        self._routed(pieces_by_pid, lambda epoch, groups: p.StageDone(
            epoch=epoch, query=query, batch=batch, operator=operator, attempt=attempt, groups=groups))

    def advance_batches(self, query: str, batch: int, pids: Iterable[int] | None = None) -> dict[int, int | None]:
        """Apply the query's staged batches below ``batch`` on ``pids`` (default all); answers each one's applied batch."""
        pids = range(self.partitions) if pids is None else pids
        return self._routed(dict.fromkeys(pids), lambda epoch, groups: p.AdvanceBatches(
            epoch=epoch, query=query, batch=batch, groups=groups))

    def finish_task(self, query: str, batch: int, operator: str, run: str, task: int, tasks: int,
                    pids: list, record_pids: list, failed: str | None = None) -> dict[int, list]:
        """Count a task of the batch's operator on ``record_pids`` (see store/staging.finish_task)."""
        return self._routed(dict.fromkeys(record_pids), lambda epoch, groups: p.FinishTask(
            epoch=epoch, query=query, batch=batch, operator=operator, run=run, task=task, tasks=tasks,
            pids=list(pids), failed=failed, groups=groups))

    def seal(self, query: str, batch: int, operator: str) -> dict[int, bool]:
        return self._routed(dict.fromkeys(range(self.partitions)), lambda epoch, groups: p.Seal(
            epoch=epoch, query=query, batch=batch, operator=operator, groups=groups))

    # -- events --------------------------------------------------------------------

    def events(self, after: int = 0, wait: float = 0.0) -> list[dict]:
        """Events with ``seq`` > ``after``; waits up to ``wait`` seconds for the first one."""
        return self._ask(p.Events(after=after, wait=wait), timeout=wait + self._timeout)

    def subscribe(self, callback: Callable[[dict], None], *, from_now: bool = True) -> "Subscription":
        """Call ``callback(event)`` in a background thread for every new cluster event."""
        known = self.events() if from_now else []
        return Subscription(self.events, callback, known[-1]["seq"] if known else 0)

    # -- checkpoints (``checkpointer``) and the coordinator's answers ---------------

    def count(self, state: str) -> int:
        return self._ask(p.Count(state=state))

    def stats(self) -> dict:
        return self._ask(p.ClusterStats())

    def report_pipeline(self, record: dict) -> None:
        self._ask(p.PipelineProgress(record=record))

    def status(self) -> dict:
        return self._ask(p.Status())

    def close(self) -> None:
        self._coordinator.close()
        with self._lock:
            self._closed = True
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()


def _by_owner(table: Table, items: Iterable[int], pid_of: Callable[[int], int],
              address_of: Callable[[Table, int], str | None]) -> tuple[dict[str, list[int]], RockstateError | None]:
    """``items`` grouped by the address of their partition's owner (``address_of``), and the error of those whose
    partition has none (None: all have one)."""
    by_owner: dict[str | None, list[int]] = {}
    for item in items:
        by_owner.setdefault(address_of(table, pid_of(item)), []).append(item)
    unowned = by_owner.pop(None, [])
    error = PartitionUnavailableError(f"partitions {[pid_of(i) for i in unowned[:5]]} have no live owner") if unowned else None
    return cast(dict[str, list[int]], by_owner), error


def _values(answer: Any, n: int) -> list:
    """A node's answer to a ``Read`` of ``n`` keys, checked."""
    if type(answer) is not list or len(answer) != n:
        raise ProtocolError(f"a node answered a read of {n} keys with {type(answer).__name__} of "
                            f"{len(answer) if isinstance(answer, list) else '?'} items")
    return answer


def _backup_address(table: Table, pid: int) -> str | None:
    """A stale read's node: the partition's first in-sync backup, else its primary."""
    for node in table.in_sync_of(pid):
        if node in table.addresses:
            return table.addresses[node]
    return table.owner_address(pid)


CLIENT_SETTINGS = {
    "timeout": "seconds one request to a node or the coordinator may take before it is retried",
    "retry_timeout": "seconds a call keeps retrying (partitions moving or being restored, a node or the coordinator restarting) "
                     "before it raises ClusterTimeoutError naming the last error; retries never apply a write twice",
    "wait": "also retry the first contact with the coordinator (a Spark task starting while it restarts); False: a coordinator "
            "that cannot be reached, a wrong address or a TLS mismatch is reported at once",
    "secret": "the cluster's shared secret, str or bytes (None: $ROCKSTATE_SECRET, if set)",
    "ssl": "an ssl.SSLContext for a cluster with TLS, e.g. rockstate.cluster.security.client_context(ca_file)",
    "read_from_backup": "serve reads from an in-sync backup of each partition (stale reads: they may miss the latest "
                        "writes, and a key read twice may go back in time); writes still go to the primary",
}


def connect(address: str, *, timeout: float = 30.0, retry_timeout: float = 30.0, wait: bool = False,
            secret: bytes | str | None = None, ssl: SSLContext | None = None, read_from_backup: bool = False) -> Rockstate:
    return Rockstate(ClusterBackend(address, timeout=timeout, retry_timeout=retry_timeout, wait=wait, secret=secret, ssl=ssl,
                                    read_from_backup=read_from_backup))


connect.__doc__ = """A client of the cluster whose coordinator is at ``address`` ("host:port"; several coordinators
as "host:port,host:port,..." or "zk://zkhost:port,.../<cluster_name>": it follows the leader).

Settings (docs/configuration.md lists them too):

""" + "\n".join(f"    {name}: {meaning}." for name, meaning in CLIENT_SETTINGS.items())
