"""The control plane simulated (bench/control_sim.py) at a bounded size: 200 nodes in 10 zones, P=2,000, backup_count=1,
through joins, a graceful leave, deaths and a zone loss. Placement moves ~1/N on a join, a zone loss leaves every
partition a live in-sync replica (no restore from a checkpoint), and a plan stays cheap."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

from control_sim import run  # noqa: E402

NODES, PARTITIONS = 200, 2000


def test_control_plane_at_200_nodes_and_2000_partitions():
    sim = run(NODES, PARTITIONS, zones=10, backup_count=1)
    rows = {}
    for name, alive, plan_ms, moved, added, dropped, promoted, restored, after_event, after_plan, rounds in sim.rows:
        rows.setdefault(name.split(" (")[0] if name.startswith("zone") else name, []).append(
            (alive, plan_ms, moved, added, promoted, restored, after_event, after_plan))
    for alive, plan_ms, moved, added, *_ in rows["join"]:
        assert moved <= 2.0 / alive, (alive, moved)  # ~1/N of the primaries (a rounding either way)
        assert added <= 4.0 / alive, (alive, added)  # ~1/N of the primaries and ~1/N of the backups
    for name, events in rows.items():
        for alive, plan_ms, moved, added, promoted, restored, after_event, after_plan in events:
            assert restored == 0, name  # backup_count=1 and zones: an in-sync replica survives every event
            assert (after_event >= 1 or name == "start") and after_plan == 2, (name, after_event, after_plan)
            assert plan_ms < 2000, (name, plan_ms)  # CPU ms; ~10x below on an idle machine
    [zone_loss] = [events[0] for name, events in rows.items() if name.startswith("zone")]
    assert zone_loss[4] > 0  # the lost zone's primaries: their backups took over
