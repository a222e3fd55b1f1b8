"""The control plane at scale, simulated: ``control/``'s state machines at 1,000 nodes and 10,000 partitions (issue 33).

No processes, no I/O: the coordinator's pure state machines -- ``Membership``
(joins, leaves, deaths), ``replica_placement.plan`` (where every partition's
primary and backups go, zones respected), ``InSyncSets`` (the in-sync sets, the
elections after a death) -- driven by a simulator that carries out every step
they answer at once (a copy is "caught up" as soon as it is added; an election's
candidates all answer with the same position). Per event:

- plan ms: one ``replica_placement.plan`` over the whole table, CPU ms of the planning thread (goal: <= 50 ms);
- primaries moved, replicas added / dropped: what the plan changes, as a fraction
  of P (a join should move ~1/N of the primaries and ~1/N of the backups);
- promoted / restored: after a death or a zone loss, partitions whose primary a
  backup replaced (an election) or that had no in-sync replica left (a restore
  from the checkpoint: 0 when ``backup_count`` >= 1 and zones keep replicas apart);
- min in-sync: the fewest in-sync replicas of any partition once the event is done;
- coordinator MB: what the coordinator's state (members, in-sync sets, the
  table) holds in memory (tracemalloc), and the table's size as published (msgpack).

    .venv/bin/python bench/control_sim.py [--nodes 1000] [--partitions 10000] [--zones 10] [--backups 1]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(__file__))

import msgpack  # noqa: E402

from common import print_table  # noqa: E402
from rockstate.control import replica_placement  # noqa: E402
from rockstate.control.in_sync import AskPositions, InSyncSets, Promoted, RestoreFromCheckpoint  # noqa: E402
from rockstate.control.membership import MemberStatus, Membership  # noqa: E402
from rockstate.control.replica_placement import StepKind  # noqa: E402


class Simulation:
    """A coordinator's control state, with every action carried out at once."""

    def __init__(self, nodes: int, partitions: int, zones: int, backup_count: int, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.P, self.backup_count, self.zone_count = partitions, backup_count, zones
        self.membership = Membership(heartbeat_timeout=10.0)
        self.zones: dict[str, str] = {}
        self.now = 0.0
        for _ in range(nodes):
            self._register()
        self.sets = InSyncSets(backup_count, [[] for _ in range(partitions)])
        self.rows: list[list[object]] = []
        self.event("start", lambda: None)
        print(f"  {self.rows[-1]}", file=sys.stderr, flush=True)

    def _register(self, zone: str | None = None) -> str:
        node, _ = self.membership.register(None, f"host:{len(self.zones)}", self.now)
        self.zones[node] = zone or f"z{len(self.zones) % self.zone_count}"
        return node

    def alive(self) -> list[str]:
        return [m.node_id for m in self.membership.alive()]

    # -- carrying out ---------------------------------------------------------------

    def _plan(self) -> tuple[float, replica_placement.ReplicaPlan]:
        statuses = self.membership.statuses()
        zones = {n: z for n, z in self.zones.items() if statuses.get(n) is MemberStatus.ALIVE}
        start = time.thread_time()  # CPU time: a shared machine's load stretches wall time several-fold
        plan = replica_placement.plan(self.sets.table(), statuses, self.backup_count, zones)
        return (time.thread_time() - start) * 1000, plan

    def _carry_out(self, plan: replica_placement.ReplicaPlan) -> tuple[int, int, int]:
        """The plan's steps, per partition in order (ADD, then PROMOTE, then DROP), each copy caught up at once."""
        moved = added = dropped = 0
        for step in plan.steps:
            s = self.sets[step.partition]
            if step.kind is StepKind.ADD:
                if s.primary is None:  # a new cluster's first placement: the first replica is the primary
                    self.sets.restored(step.partition, step.node) if step.partition in self.sets.lost() else self.sets.moved(
                        step.partition, step.node)
                    continue
                self.sets.add_backup(step.partition, step.node)
                self.sets.caught_up(step.partition, step.node, self.sets[step.partition].epoch)
                added += 1
            elif step.kind is StepKind.PROMOTE:
                if s.primary != step.node and self.sets.promote(step.partition, step.node, s.primary):
                    moved += 1
            elif step.kind is StepKind.DROP:
                if step.node == s.primary:
                    continue  # promoted away already: it left the set
                if self.sets.drop(step.partition, step.node) is not None:
                    dropped += 1
        return moved, added, dropped

    def _dead(self, nodes: list[str]) -> tuple[int, int]:
        promoted = restored = 0
        pending = []
        for a in self.sets.members_dead(nodes):
            if isinstance(a, AskPositions):
                pending.append(a)
            elif isinstance(a, RestoreFromCheckpoint):
                restored += 1
                target = min(self.alive(), key=lambda n: self.rng.random())
                self.sets.restored(a.partition, target)
        for a in pending:
            for b in self.sets.positions(a.partition, dict.fromkeys(a.nodes, 100), self.now):
                if isinstance(b, Promoted):
                    promoted += 1
                elif isinstance(b, RestoreFromCheckpoint):
                    restored += 1
        return promoted, restored

    def min_in_sync(self) -> int:
        """The fewest in-sync replicas on serving members (alive, or leaving: it serves until its replicas moved off)."""
        alive = {n for n, st in self.membership.statuses().items() if st in (MemberStatus.ALIVE, MemberStatus.LEAVING)}
        return min(len(s.in_sync & alive) for s in self.sets.sets)

    def event(self, name: str, change) -> None:
        """``change()`` (membership events), then plan and carry out until the plan has nothing left to do."""
        promoted, restored = change() or (0, 0)
        lost_now = self.min_in_sync()  # before any re-replication: what the event itself left
        plan_ms, plan = self._plan()
        moved, added, dropped = self._carry_out(plan)
        rounds = 1
        while rounds < 5:  # the coordinator plans again once steps are done (drops refused until adds caught up)
            _, again = self._plan()
            if not again.steps:
                break
            m, a, d = self._carry_out(again)
            moved, added, dropped, rounds = moved + m, added + a, dropped + d, rounds + 1
        self.rows.append([name, len(self.alive()), plan_ms, moved / self.P, added / self.P, dropped / self.P,
                          promoted, restored, lost_now, self.min_in_sync(), rounds])
        print(f"  {self.rows[-1]}", file=sys.stderr, flush=True)

    # -- the events ---------------------------------------------------------------------

    def join(self) -> None:
        self.event("join", lambda: self._register() and None)

    def leave(self) -> None:
        node = self.rng.choice(self.alive())

        def change() -> None:
            self.membership.leave(node)  # LEAVING: no target; the plan moves its replicas off it

        self.event("graceful leave", change)
        self.membership.left(node)
        self._dead([node])  # gone: out of every set (the plan moved everything off it first)

    def death(self) -> None:
        node = self.rng.choice(self.alive())

        def change():
            self.membership.members[node].status = MemberStatus.DEAD
            return self._dead([node])

        self.event("kill -9 of a node", change)

    def zone_loss(self) -> None:
        zone = self.zones[self.rng.choice(self.alive())]
        gone = [n for n in self.alive() if self.zones[n] == zone]

        def change():
            for n in gone:
                self.membership.members[n].status = MemberStatus.DEAD
            return self._dead(gone)

        self.event(f"zone {zone} lost ({len(gone)} nodes)", change)


def coordinator_bytes(sim: Simulation) -> tuple[float, float]:
    """(MB the coordinator's state takes in memory, MB of the table as published)."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    copy = InSyncSets.from_wire(sim.backup_count, sim.sets.to_wire())
    members = Membership.from_wire(10.0, sim.membership.to_wire(), 0.0)
    table = copy.table()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del members, table
    wire = len(msgpack.packb(sim.sets.to_wire())) + len(msgpack.packb(sim.membership.to_wire()))
    return held / 1e6, wire / 1e6


def run(nodes: int, partitions: int, zones: int, backup_count: int, seed: int = 1) -> Simulation:
    sim = Simulation(nodes, partitions, zones, backup_count, seed)
    sim.join()
    sim.join()
    sim.leave()
    sim.death()
    sim.death()
    sim.zone_loss()
    sim.join()
    return sim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--zones", type=int, default=10)
    parser.add_argument("--backups", type=int, default=1)
    args = parser.parse_args()
    start = time.perf_counter()
    sim = run(args.nodes, args.partitions, args.zones, args.backups)
    memory, wire = coordinator_bytes(sim)
    print_table(f"control plane simulated: {args.nodes} nodes in {args.zones} zones, P={args.partitions}, "
                f"backup_count={args.backups} (fractions of P; goal: plan <= 50 ms, a join moves ~1/N)",
                ["event", "alive", "plan ms", "primaries moved", "replicas added", "replicas dropped", "promoted",
                 "restored", "min in-sync after event", "min in-sync after plan", "plan rounds"],
                [[r[0], r[1], r[2], f"{r[3]:.4f}", f"{r[4]:.4f}", f"{r[5]:.4f}", *r[6:]] for r in sim.rows])
    print(f"\n1/N at {args.nodes} nodes = {1 / args.nodes:.4f}; coordinator state in memory {memory:.1f} MB, "
          f"as saved/published {wire:.2f} MB; whole simulation {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
