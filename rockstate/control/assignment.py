"""The partition table's owners: a pure function of the old table and the live nodes.

Rules of ``assign(owners, nodes)`` (P = ``len(owners)``, N = live nodes, q, r = divmod(P, N)):

* Balanced: every live node ends with q or q + 1 partitions; exactly r nodes get q + 1.
* The r "ceil" places go to the nodes that already hold the most (live-owned)
  partitions, ties broken by smaller id, so as few partitions as possible leave.
* A partition whose owner is live stays unless that owner holds more than its
  target; an over-full node keeps its lowest-numbered partitions and gives up
  the rest. The number of such moves is the minimum that reaches balance.
* Unassigned partitions (None) and those of nodes not in ``nodes`` always move.
* Freed partitions, in ascending order, fill under-full nodes in id order.
* Deterministic: no I/O, clocks or randomness; ``nodes`` is deduplicated and
  sorted, so its iteration order does not matter.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..errors import ClusterError, InvalidInputError

__all__ = ["assign", "counts", "moves"]


def assign(owners: Sequence[str | None], nodes: Iterable[str]) -> list[str]:
    """Return the new owner of every partition (see the module docstring for the rules)."""
    live = sorted(set(nodes))
    if not live:
        raise ClusterError("no live nodes to own partitions")
    q, r = divmod(len(owners), len(live))

    held: dict[str, list[int]] = {n: [] for n in live}
    freed: list[int] = []
    for p, owner in enumerate(owners):
        if owner is not None and owner in held:
            held[owner].append(p)
        else:
            freed.append(p)

    by_load = sorted(live, key=lambda n: (-len(held[n]), n))
    target = {n: q + (1 if i < r else 0) for i, n in enumerate(by_load)}

    new: list[str | None] = [None] * len(owners)
    for n in live:
        keep = held[n][: target[n]]
        freed.extend(held[n][target[n] :])
        for p in keep:
            new[p] = n
    freed.sort()

    it = iter(freed)
    for n in live:
        for _ in range(target[n] - min(len(held[n]), target[n])):
            new[next(it)] = n
    assert all(o is not None for o in new)
    return new  # type: ignore[return-value]


def moves(old: Sequence[str | None], new: Sequence[str]) -> list[tuple[int, str | None, str]]:
    """``(partition, from, to)`` for every partition whose owner changes, in partition order."""
    if len(old) != len(new):
        raise InvalidInputError(
            f"tables of different partition counts: {len(old)} and {len(new)}",
            old=len(old),
            new=len(new),
        )
    return [(p, a, b) for p, (a, b) in enumerate(zip(old, new)) if a != b]


def counts(owners: Sequence[str | None]) -> dict[str, int]:
    """Partitions per owner (None is not counted), keys in id order."""
    out: dict[str, int] = {}
    for o in owners:
        if o is not None:
            out[o] = out.get(o, 0) + 1
    return dict(sorted(out.items()))
