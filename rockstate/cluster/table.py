"""The partition table: partition -> owner node (its primary), its backups, with an epoch that grows on every change.

A replicated cluster's table also names, per partition, its backups, those
of them in sync with the primary, and the partition's replica epoch (it grows
with every change of that partition's replica set: backups refuse batches of
an older one). ``backup_count`` 0 leaves those empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ProtocolError


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

    def delta_from(self, base: "Table") -> dict | None:
        """What a node holding ``base`` needs to make this table: the rows that changed and the table-wide fields
        (a table is ~26 kB at P=1024, decoded and compared whole by every node for every change: at 16 nodes a
        leave's tables were a fifth of each node's CPU, and their encoding per node most of the coordinator's).
        None when only the whole table will do (another partition count, replicated or not)."""
        if base.partitions != self.partitions or bool(base.backups) != bool(self.backups):
            return None
        changed: set[int] = set()
        for old, new in ((base.owners, self.owners), (base.since, self.since), (base.backups, self.backups),
                         (base.in_sync, self.in_sync), (base.replica_epochs, self.replica_epochs)):
            if old != new:  # one comparison in C when this part is unchanged
                changed.update(pid for pid, (a, b) in enumerate(zip(old, new)) if a != b)
        replicated = bool(self.backups)
        rows = [[pid, self.owners[pid], self.since[pid], list(self.backups[pid]) if replicated else [],
                 list(self.in_sync[pid]) if replicated else [], self.replica_epochs[pid] if replicated else 0]
                for pid in sorted(changed)]
        return {"base": base.epoch, "epoch": self.epoch, "partitions": self.partitions, "addresses": self.addresses,
                "rows": rows, "backup_count": self.backup_count, "replication": self.replication,
                "replica_timeout": self.replica_timeout}

    def patched(self, delta: Any) -> "Table | None":
        """The table ``delta`` (``delta_from``) makes of this one; None when this is not its base (the sender then
        sends the whole table). A delta that does not fit this table's shape is refused (``ProtocolError``)."""
        if not isinstance(delta, dict) or type(delta.get("base")) is not int:
            raise ProtocolError("a table delta is a map with its base epoch")
        if delta["base"] != self.epoch or delta.get("partitions") != self.partitions:
            return None
        epoch, addresses, rows = delta.get("epoch"), delta.get("addresses"), delta.get("rows")
        timeout: Any = delta.get("replica_timeout")
        if (type(epoch) is not int or epoch <= self.epoch or not isinstance(addresses, dict) or not isinstance(rows, list)
                or type(delta.get("backup_count")) is not int or type(delta.get("replication")) is not str
                or type(timeout) not in (int, float)
                or not all(type(k) is str and type(v) is str for k, v in addresses.items())):
            raise ProtocolError(f"table delta {delta.get('epoch')!r} on {self.epoch}: its fields are not a table's")
        owners, since = list(self.owners), list(self.since)
        backups, in_sync, epochs = list(self.backups), list(self.in_sync), list(self.replica_epochs)
        for row in rows:
            if not (type(row) is list and len(row) == 6 and type(row[0]) is int and 0 <= row[0] < self.partitions
                    and (row[1] is None or type(row[1]) is str) and type(row[2]) is int and type(row[3]) is list
                    and type(row[4]) is list and type(row[5]) is int
                    and all(type(n) is str for n in row[3] + row[4])):
                raise ProtocolError(f"table delta {epoch} on {self.epoch}: a row is not [partition, owner, since, "
                                    "backups, in_sync, replica epoch]")
            pid = row[0]
            owners[pid], since[pid] = row[1], row[2]
            if backups:
                backups[pid], in_sync[pid], epochs[pid] = tuple(row[3]), tuple(row[4]), row[5]
        return replace(self, epoch=epoch, owners=tuple(owners), addresses=dict(addresses), since=tuple(since),
                       backups=tuple(backups), in_sync=tuple(in_sync), replica_epochs=tuple(epochs),
                       backup_count=delta["backup_count"], replication=delta["replication"], replica_timeout=float(timeout))

    @classmethod
    def from_wire(cls, data: dict) -> "Table":
        return cls(data["epoch"], tuple(data["owners"]), dict(data["addresses"]), tuple(data["since"]),
                   tuple(map(tuple, data.get("backups", ()))), tuple(map(tuple, data.get("in_sync", ()))),
                   tuple(data.get("replica_epochs", ())), data.get("backup_count", 0), data.get("replication", "sync"),
                   data.get("replica_timeout", 1.0))
