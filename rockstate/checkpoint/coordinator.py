"""The checkpoint coordinator's state machine: no I/O, no clock, no threads.

The caller (the embedded driver in ``local.py``, or the cluster coordinator)
feeds it events with the current time and carries out the actions it returns.

States of one checkpoint::

    trigger()                 ack() x P                 metadata_written()
    ─────────▶ IN_PROGRESS ─────────────▶ (WriteMetadata) ─────────────▶ COMPLETED
                   │  decline() / fail() / tick() past the timeout
                   └────────────────────────────────────────────────────▶ ABORTED

Transitions:

- ``trigger(now)`` (manual) or ``tick(now)`` (periodic, when due): a new id,
  larger than every id seen (in the storage too); returns ``Trigger`` (send
  barrier ``checkpoint_id`` to every partition, with ``retained`` so nodes
  know which checkpoints' files they may reference). Refused with
  ``CheckpointInProgressError`` while a checkpoint is in flight or the last
  one's garbage is being collected: at most one in flight. Periodic triggers
  also wait ``min_pause`` after the end of the previous checkpoint; manual
  ones do not (like Flink's savepoints).
- ``ack(id, manifest)``: one partition's manifest. A duplicate is ignored
  (acks may be retried). The last of the P acks returns ``WriteMetadata``:
  the caller writes ``chk-N/_metadata``, the commit point. An ack for a
  checkpoint no longer in flight returns ``Discard`` (its uploads go).
- ``metadata_written(id)``: COMPLETED. Returns ``Completed``: checkpoints
  beyond ``retained`` to delete, and the shared files only they reference —
  never a file a retained checkpoint references. The caller deletes them,
  then calls ``gc_done()``; no checkpoint starts meanwhile. ``sweep_due(now)``
  says whether that caller should also list the storage for files no retained
  checkpoint uses (leftovers of aborted checkpoints, dead uploads): after the
  first completion, after any abort since the last sweep, and otherwise every
  ``SWEEP_EVERY`` seconds, since a listing is O(files stored) (``swept(now)``
  once done).
- ``decline(id, partition, reason)``, ``fail(id, reason)``, or ``tick(now)``
  / ``timeouts(now)`` past ``timeout``: ABORTED. Returns ``Aborted``: the checkpoint's folder and
  the shared files its acked manifests uploaded, to delete; and whether the
  consecutive failures now exceed ``tolerable_failures``. A completion resets
  that count.

History keeps the last ``HISTORY`` checkpoints: id, state, trigger, start,
duration, size, bytes uploaded, failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ..errors import CheckpointError, CheckpointInProgressError
from .manifest import CheckpointMetadata, ManifestRef, PartitionManifest, group_bytes
from .storage import checkpoint_dir, checkpoint_id_of, manifest_location, referenced_paths

HISTORY = 100
SWEEP_EVERY = 600.0  # seconds between listings of the storage while no checkpoint aborts

IN_PROGRESS, COMPLETED, ABORTED = "IN_PROGRESS", "COMPLETED", "ABORTED"


@dataclass
class CheckpointPolicy:
    retained: int = 3
    interval: float | None = None  # seconds between periodic checkpoints; None: manual only
    timeout: float = 600.0
    min_pause: float = 0.0
    tolerable_failures: int = 3


@dataclass
class CheckpointRecord:
    """One line of the history."""

    checkpoint_id: int
    state: str
    trigger: str  # "manual", "periodic" or "storage" (found there at start)
    started_at: float
    partitions: int
    duration: float | None = None
    size: int = 0
    uploaded_bytes: int = 0
    acked: int = 0
    failure: str | None = None
    retained: bool = False  # COMPLETED and still kept in the storage
    max_pause: float = 0.0  # longest write pause of a partition (sync phase), seconds

    @property
    def id(self) -> int:
        return self.checkpoint_id

    @property
    def bytes_uploaded(self) -> int:
        return self.uploaded_bytes

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class CompletedCheckpoint:
    """What retention needs to know about a completed checkpoint: every path it references."""

    checkpoint_id: int
    paths: frozenset[str]  # shared files (and anything else outside its own chk-N folder)
    record: CheckpointRecord


@dataclass(frozen=True)
class Trigger:
    checkpoint_id: int
    retained: tuple[int, ...]  # completed checkpoints kept: their shared files may be referenced


@dataclass(frozen=True)
class WriteMetadata:
    checkpoint_id: int
    metadata: CheckpointMetadata


@dataclass(frozen=True)
class Completed:
    record: CheckpointRecord
    drop_checkpoints: tuple[int, ...]  # delete these chk-N folders
    delete_files: tuple[str, ...]  # and these shared files


@dataclass(frozen=True)
class Aborted:
    record: CheckpointRecord
    delete_dir: str  # the checkpoint's chk-N folder
    delete_files: tuple[str, ...]  # shared files its acked partitions uploaded
    failures_exceeded: bool


@dataclass(frozen=True)
class Discard:
    """A late ack of a checkpoint that is no longer in flight: what it uploaded goes."""

    checkpoint_id: int
    delete_files: tuple[str, ...]


@dataclass
class _InFlight:
    record: CheckpointRecord
    states: dict
    manifests: dict[int, PartitionManifest] = field(default_factory=dict)


class CheckpointCoordinator:
    def __init__(
        self,
        partitions: int,
        policy: CheckpointPolicy | None = None,
        cluster: str = "default",
        existing_ids: Iterable[int] = (),
        completed: Iterable[CompletedCheckpoint] = (),
    ) -> None:
        self.partitions = partitions
        self.policy = policy or CheckpointPolicy()
        self.cluster = cluster
        self._completed: dict[int, CompletedCheckpoint] = {c.checkpoint_id: c for c in completed}
        self._next_id = max([0, *existing_ids, *self._completed]) + 1
        self._history: dict[int, CheckpointRecord] = {}
        for c in sorted(self._completed.values(), key=lambda c: c.checkpoint_id):
            c.record.retained = True
            self._remember(c.record)
        self.in_flight: _InFlight | None = None
        self.collecting = False
        self.consecutive_failures = 0
        self._last_end: float | None = None
        self._last_periodic: float | None = None
        self._last_sweep: float | None = None
        self._aborted_since_sweep = False

    # -- queries -----------------------------------------------------------------

    @property
    def retained_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self._completed))

    @property
    def latest_completed(self) -> int | None:
        return max(self._completed) if self._completed else None

    @property
    def next_id(self) -> int:
        return self._next_id

    def retained_paths(self) -> dict[int, frozenset[str]]:
        """Retained checkpoint id -> the paths outside its own folder that it references."""
        return {c: self._completed[c].paths for c in sorted(self._completed)}

    def history(self) -> list[CheckpointRecord]:
        return [self._history[i] for i in sorted(self._history)]

    def next_periodic(self) -> float | None:
        """When the next periodic checkpoint is due (None: no periodic checkpoints)."""
        if self.policy.interval is None:
            return None
        due = 0.0 if self._last_periodic is None else self._last_periodic + self.policy.interval
        if self._last_end is not None:
            due = max(due, self._last_end + self.policy.min_pause)
        return due

    def next_wakeup(self) -> float | None:
        """The earliest time at which ``tick`` may have something to do."""
        times = [t for t in (self.next_periodic(),) if t is not None]
        if self.in_flight is not None:
            times.append(self.in_flight.record.started_at + self.policy.timeout)
        return min(times) if times else None

    # -- events --------------------------------------------------------------------

    def trigger(self, now: float, manual: bool = True, states: Mapping | None = None) -> Trigger:
        if self.in_flight is not None:
            raise CheckpointInProgressError(
                f"checkpoint {self.in_flight.record.checkpoint_id} is in progress", checkpoint_id=self.in_flight.record.checkpoint_id
            )
        if self.collecting:
            raise CheckpointInProgressError("the previous checkpoint's garbage is being collected")
        chk = self._next_id
        self._next_id += 1
        record = CheckpointRecord(chk, IN_PROGRESS, "manual" if manual else "periodic", now, self.partitions)
        self.in_flight = _InFlight(record, dict(states or {}))
        self._remember(record)
        if not manual:
            self._last_periodic = now
        return Trigger(chk, self.retained_ids)

    def tick(self, now: float) -> list[Trigger | Aborted]:
        """Timeouts, then a periodic trigger when due."""
        actions: list[Trigger | Aborted] = []
        aborted = self.timeouts(now)
        if aborted is not None:
            actions.append(aborted)
        due = self.next_periodic()
        if due is not None and now >= due and self.in_flight is None and not self.collecting:
            actions.append(self.trigger(now, manual=False))
        return actions

    def timeouts(self, now: float) -> Aborted | None:
        """Abort the checkpoint in flight if it is past its timeout."""
        flight = self.in_flight
        if flight is None or now - flight.record.started_at < self.policy.timeout:
            return None
        return self._abort(now, f"timed out after {self.policy.timeout:g} s ({len(flight.manifests)} of {self.partitions} partitions acked)")

    def ack(self, checkpoint_id: int, manifest: PartitionManifest | dict, now: float) -> WriteMetadata | Discard | None:
        m = manifest if isinstance(manifest, PartitionManifest) else PartitionManifest.from_dict(manifest)
        flight = self.in_flight
        if flight is None or flight.record.checkpoint_id != checkpoint_id:
            uploaded = [f.path for f in m.files if f.uploaded] + [manifest_location(m)]
            return Discard(checkpoint_id, tuple(uploaded))
        if m.checkpoint_id != checkpoint_id or not 0 <= m.partition < self.partitions:
            raise CheckpointError(f"ack for checkpoint {checkpoint_id} carries the manifest of {m.checkpoint_id}/p{m.partition}")
        if m.partition in flight.manifests:
            return None  # a retried ack
        flight.manifests[m.partition] = m
        flight.record.acked = len(flight.manifests)
        if len(flight.manifests) < self.partitions:
            return None
        meta = CheckpointMetadata(
            checkpoint_id=checkpoint_id,
            partitions=self.partitions,
            manifests=_refs([flight.manifests[p] for p in range(self.partitions)]),
            states=flight.states,
            created_at=flight.record.started_at,
            duration=now - flight.record.started_at,
            cluster=self.cluster,
        )
        return WriteMetadata(checkpoint_id, meta)

    def metadata_written(self, checkpoint_id: int, now: float) -> Completed:
        flight = self._current(checkpoint_id)
        if len(flight.manifests) < self.partitions:
            raise CheckpointError(f"checkpoint {checkpoint_id} has {len(flight.manifests)} of {self.partitions} acks")
        record = flight.record
        record.state, record.duration, record.retained = COMPLETED, now - record.started_at, True
        record.size = sum(m.size for m in flight.manifests.values())
        record.uploaded_bytes = sum(m.uploaded_bytes for m in flight.manifests.values())
        record.max_pause = max((m.sync_seconds for m in flight.manifests.values()), default=0.0)
        paths = referenced_paths(flight.manifests.values(), checkpoint_id)
        self._completed[checkpoint_id] = CompletedCheckpoint(checkpoint_id, paths, record)
        self.in_flight, self._last_end, self.consecutive_failures = None, now, 0
        keep, drop = plan_retention(self._completed, self.policy.retained)
        dropped = {c: self._completed.pop(c) for c in drop}
        for c in dropped.values():
            c.record.retained = False
        self.collecting = bool(drop)
        return Completed(record, tuple(drop), tuple(sorted(unreferenced(dropped.values(), self._completed.values()))))

    def gc_done(self) -> None:
        self.collecting = False

    def sweep_due(self, now: float) -> bool:
        return self._last_sweep is None or self._aborted_since_sweep or now - self._last_sweep >= SWEEP_EVERY

    def swept(self, now: float) -> None:
        self._last_sweep, self._aborted_since_sweep = now, False

    def decline(self, checkpoint_id: int, partition: int, reason: str, now: float) -> Aborted | None:
        """A partition could not snapshot: the checkpoint is aborted (None if it is no longer in flight)."""
        if self.in_flight is None or self.in_flight.record.checkpoint_id != checkpoint_id:
            return None
        return self._abort(now, f"partition {partition}: {reason}")

    def fail(self, checkpoint_id: int, reason: str, now: float) -> Aborted | None:
        """The caller could not finish it (e.g. writing _metadata failed)."""
        if self.in_flight is None or self.in_flight.record.checkpoint_id != checkpoint_id:
            return None
        return self._abort(now, reason)

    # -- helpers ---------------------------------------------------------------

    def _current(self, checkpoint_id: int) -> _InFlight:
        if self.in_flight is None or self.in_flight.record.checkpoint_id != checkpoint_id:
            raise CheckpointError(f"checkpoint {checkpoint_id} is not in progress")
        return self.in_flight

    def _abort(self, now: float, reason: str) -> Aborted:
        flight = self.in_flight
        assert flight is not None
        record = flight.record
        record.state, record.duration, record.failure = ABORTED, now - record.started_at, reason
        uploaded = sorted(f.path for m in flight.manifests.values() for f in m.files if f.uploaded and f.shared)
        self.in_flight, self._last_end = None, now
        self.consecutive_failures += 1
        self._aborted_since_sweep = True
        return Aborted(record, checkpoint_dir(record.checkpoint_id), tuple(uploaded), self.consecutive_failures > self.policy.tolerable_failures)

    def _remember(self, record: CheckpointRecord) -> None:
        self._history[record.checkpoint_id] = record
        for old in sorted(self._history)[:-HISTORY]:
            del self._history[old]


# -- retention: pure functions ------------------------------------------------------


def plan_retention(completed: Iterable[int], retained: int) -> tuple[list[int], list[int]]:
    """(keep, drop): the ``retained`` newest completed checkpoints are kept."""
    ids = sorted(completed)
    cut = max(0, len(ids) - max(1, retained))
    return ids[cut:], ids[:cut]


def unreferenced(dropped: Iterable[CompletedCheckpoint], retained: Iterable[CompletedCheckpoint]) -> set[str]:
    """Paths the dropped checkpoints reference and no retained one does."""
    keep = set().union(*(c.paths for c in retained))
    return set().union(*(c.paths for c in dropped)) - keep


def plan_sweep(listed: Iterable[str], retained: Mapping[int, Iterable[str]], in_flight: int | None = None) -> list[str]:
    """Files of a storage listing that no retained checkpoint uses.

    ``retained`` maps each retained checkpoint id to the paths it references
    (its manifests' files). Kept: the retained checkpoints' ``chk-N`` folders
    and every file they reference, the in-flight checkpoint's folder, every
    savepoint, and anything outside ``shared/`` and ``chk-N/``. Run it only
    when no checkpoint is uploading: an in-flight upload's shared files are
    not known until its ack.
    """
    keep = set().union(*(set(p) for p in retained.values()))
    out = []
    for path in listed:
        chk = checkpoint_id_of(path)
        if chk is not None:
            if chk not in retained and chk != in_flight:
                out.append(path)
        elif path.startswith("shared/") and path not in keep:
            out.append(path)
    return out


def _refs(manifests: list[PartitionManifest]) -> list[ManifestRef]:
    """How ``_metadata`` names each manifest: by the file it is stored in, a group's bytes made once for all of its
    partitions."""
    groups: dict[str, list[PartitionManifest]] = {}
    for m in manifests:
        groups.setdefault(manifest_location(m), []).append(m)
    stored = {path: group_bytes(ms) if ms[0].key_group is not None and ms[0].format >= 3 else None  # (2: a bundle)
              for path, ms in groups.items()}
    return [ManifestRef.of(m, manifest_location(m), stored[manifest_location(m)]) for m in manifests]
