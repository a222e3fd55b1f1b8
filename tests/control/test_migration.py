"""One partition's move as the coordinator runs it, driven by hand: step outcomes and times in."""

from rockstate.control.migration import Migration, Step


def run(m: Migration, results: dict, fail_at=None, t=10.0) -> list:
    steps = [m.start(t)]
    while steps[-1] not in (Step.DONE, Step.FAILED):
        t += 1.0
        step = steps[-1]
        steps.append(m.failed(t) if step is fail_at else m.done(t, results.get(step)))
    return steps


def test_a_live_move_freezes_only_for_the_last_delta():
    m = Migration(7, "node-1", "node-2", source_serving=True)
    assert run(m, {Step.PULL: 4096, Step.DELTA: 12}) == [Step.PULL, Step.FREEZE, Step.DELTA, Step.RELEASE, Step.COMMIT, Step.DONE]
    # started at 10, frozen once FREEZE succeeded (12), committed at 15
    assert m.report() == {"bytes": 4096, "delta_ops": 12, "seconds": 5.0, "write_blocked_seconds": 3.0}


def test_the_old_way_freezes_for_the_whole_copy():
    m = Migration(7, "node-1", "node-2", source_serving=True, live=False)
    assert run(m, {Step.PULL: 1, Step.DELTA: 0}) == [Step.FREEZE, Step.PULL, Step.DELTA, Step.RELEASE, Step.COMMIT, Step.DONE]
    assert m.report()["write_blocked_seconds"] == m.report()["seconds"] == 5.0


def test_nothing_to_copy_commits_at_once():
    m = Migration(3, None, "node-2", source_serving=False)
    assert not m.copies and run(m, {}) == [Step.COMMIT, Step.DONE]


def test_a_failure_before_the_release_rolls_back():
    for at in (Step.PULL, Step.FREEZE, Step.DELTA):
        m = Migration(7, "node-1", "node-2", source_serving=True)
        steps = run(m, {}, fail_at=at)
        assert steps[-2:] == [Step.ROLLBACK, Step.FAILED] and Step.COMMIT not in steps


def test_a_failed_release_still_commits():
    m = Migration(7, "node-1", "node-2", source_serving=True)
    assert run(m, {}, fail_at=Step.RELEASE)[-2:] == [Step.COMMIT, Step.DONE]


def test_a_failed_rollback_or_commit_ends_the_move():
    m = Migration(7, "node-1", "node-2", source_serving=True)
    assert run(m, {}, fail_at=Step.COMMIT)[-1] is Step.FAILED
