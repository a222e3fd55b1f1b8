"""The partition table: partition -> owner node (its primary), its backups, with an epoch that grows on every change.

A replicated cluster's table also names, per partition, its backups, those
of them in sync with the primary, and the partition's replica epoch (it grows
with every change of that partition's replica set: backups refuse batches of
an older one). ``backup_count`` 0 leaves those empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Table:
    epoch: int
    owners: tuple[str | None, ...]
    addresses: dict[str, str] = field(default_factory=dict)  # node id -> host:port
    since: tuple[int, ...] = ()  # epoch at which each partition got its current owner
    backups: tuple[tuple[str, ...], ...] = ()  # per partition; empty: not replicated
    in_sync: tuple[tuple[str, ...], ...] = ()  # per partition: the backups that hold every acknowledged write
    replica_epochs: tuple[int, ...] = ()
    backup_count: int = 0
    replication: str = "sync"
    replica_timeout: float = 1.0

    @classmethod
    def empty(cls, partitions: int) -> "Table":
        return cls(0, (None,) * partitions, {}, (0,) * partitions)

    @property
    def partitions(self) -> int:
        return len(self.owners)

    def owner_address(self, pid: int) -> str | None:
        owner = self.owners[pid]
        return None if owner is None else self.addresses.get(owner)

    def owned_by(self, node_id: str) -> list[int]:
        return [p for p, owner in enumerate(self.owners) if owner == node_id]

    def backups_of(self, pid: int) -> tuple[str, ...]:
        return self.backups[pid] if self.backups else ()

    def in_sync_of(self, pid: int) -> tuple[str, ...]:
        return self.in_sync[pid] if self.in_sync else ()

    def replica_epoch(self, pid: int) -> int:
        return self.replica_epochs[pid] if self.replica_epochs else 0

    def with_owners(self, owners: list[str | None], addresses: dict[str, str]) -> "Table":
        """The next table: a new epoch, and ``since`` bumped for every partition that changed owner."""
        epoch = self.epoch + 1
        since = tuple(epoch if new != old else s for new, old, s in zip(owners, self.owners, self.since))
        return replace(self, epoch=epoch, owners=tuple(owners), addresses=dict(addresses), since=since)

    def with_addresses(self, addresses: dict[str, str]) -> "Table":
        return replace(self, epoch=self.epoch + 1, addresses=dict(addresses))

    def with_replicas(self, primaries: list[str | None], backups: list[list[str]], in_sync: list[list[str]],
                      epochs: list[int], backup_count: int, replication: str, replica_timeout: float,
                      addresses: dict[str, str]) -> "Table":
        """The next table with these replica sets (the owners are their primaries)."""
        table = self.with_owners(primaries, addresses)
        return replace(table, backups=tuple(map(tuple, backups)), in_sync=tuple(map(tuple, in_sync)),
                       replica_epochs=tuple(epochs), backup_count=backup_count, replication=replication,
                       replica_timeout=replica_timeout)

    def to_wire(self) -> dict:
        wire = {"epoch": self.epoch, "owners": list(self.owners), "addresses": self.addresses, "since": list(self.since)}
        if self.backups:
            wire |= {"backups": [list(b) for b in self.backups], "in_sync": [list(s) for s in self.in_sync],
                     "replica_epochs": list(self.replica_epochs), "backup_count": self.backup_count,
                     "replication": self.replication, "replica_timeout": self.replica_timeout}
        return wire

    @classmethod
    def from_wire(cls, data: dict) -> "Table":
        return cls(data["epoch"], tuple(data["owners"]), dict(data["addresses"]), tuple(data["since"]),
                   tuple(map(tuple, data.get("backups", ()))), tuple(map(tuple, data.get("in_sync", ()))),
                   tuple(data.get("replica_epochs", ())), data.get("backup_count", 0), data.get("replication", "sync"),
                   data.get("replica_timeout", 1.0))
