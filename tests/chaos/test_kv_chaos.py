"""The key-value chaos run's schedule (the run itself is ``make chaos``: a few minutes per seed)."""

import pytest

from rockstate.testing.kv_chaos import KINDS, MAX_NODES, MIN_NODES, draw_schedule


@pytest.mark.parametrize("seed", range(20))
def test_schedule_is_drawn_from_the_seed_and_keeps_enough_nodes(seed):
    schedule = draw_schedule(seed, actions=12)
    assert schedule == draw_schedule(seed, actions=12) and len(schedule) == 12
    running, killed = 3, 0
    for kind, seconds in schedule:
        assert kind in KINDS and (seconds > 0) == (kind == "cut")
        running += {"kill": -1, "remove": -1, "restart": 1, "add": 1}.get(kind, 0)
        killed += {"kill": 1, "restart": -1}.get(kind, 0)
        assert MIN_NODES <= running and running + killed <= MAX_NODES and killed >= 0
    assert "cut" not in {kind for kind, _ in draw_schedule(seed, actions=12, cuts=False)}
