"""The partition table: partition -> owner node, with an epoch that grows on every change."""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Table:
    epoch: int
    owners: tuple[str | None, ...]
    addresses: dict[str, str] = field(default_factory=dict)  # node id -> host:port
    since: tuple[int, ...] = ()  # epoch at which each partition got its current owner

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

    def with_owners(self, owners: list[str | None], addresses: dict[str, str]) -> "Table":
        """The next table: a new epoch, and ``since`` bumped for every partition that changed owner."""
        epoch = self.epoch + 1
        since = tuple(epoch if new != old else s for new, old, s in zip(owners, self.owners, self.since))
        return Table(epoch, tuple(owners), dict(addresses), since)

    def with_addresses(self, addresses: dict[str, str]) -> "Table":
        return replace(self, epoch=self.epoch + 1, addresses=dict(addresses))

    def to_wire(self) -> dict:
        return {"epoch": self.epoch, "owners": list(self.owners), "addresses": self.addresses, "since": list(self.since)}

    @classmethod
    def from_wire(cls, data: dict) -> "Table":
        return cls(data["epoch"], tuple(data["owners"]), dict(data["addresses"]), tuple(data["since"]))
