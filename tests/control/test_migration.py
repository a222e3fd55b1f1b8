"""One partition's move as the coordinator runs it, driven by hand: step outcomes and times in."""

from rockstate.control.migration import Handover, HandoverStep, Migration, Step


def run(m: Migration | Handover, results: dict, fail_at=None, t=10.0) -> list:
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


def test_a_handover_adds_catches_up_drains_confirms_releases_then_promotes():
    h = Handover(7, "node-1", "node-2", adds=("node-2",))
    S = HandoverStep
    assert run(h, {S.ADD: 4096, S.DRAIN: 41, S.CONFIRM: 41}) == [
        S.ADD, S.CATCH_UP, S.DRAIN, S.CONFIRM, S.RELEASE, S.PROMOTE, S.DONE]
    # started at 10, in sync at 12, drained (writes wait) at 13, promoted at 16
    assert h.report() == {"bytes": 4096, "delta_ops": 0, "seconds": 6.0, "catch_up_seconds": 2.0, "drained_batch": 41,
                          "write_blocked_seconds": 3.0}


def test_a_handover_to_an_in_sync_backup_adds_nothing():
    S = HandoverStep
    assert run(Handover(7, "node-1", "node-2"), {S.DRAIN: 5, S.CONFIRM: 5})[:2] == [S.CATCH_UP, S.DRAIN]


def test_a_target_behind_the_drained_source_is_not_promoted():
    S = HandoverStep
    h = Handover(7, "node-1", "node-2")
    assert run(h, {S.DRAIN: 41, S.CONFIRM: 40}) == [S.CATCH_UP, S.DRAIN, S.CONFIRM, S.UNFREEZE, S.FAILED]
    h = Handover(7, "node-1", "node-2")
    assert run(h, {S.DRAIN: 41, S.CONFIRM: None}) == [S.CATCH_UP, S.DRAIN, S.CONFIRM, S.UNFREEZE, S.FAILED]


def test_a_handover_failing_before_the_drain_changes_nothing_after_it_unfreezes_and_past_the_release_goes_on():
    S = HandoverStep
    assert run(Handover(7, "node-1", "node-2", adds=("node-2",)), {}, fail_at=S.CATCH_UP) == [S.ADD, S.CATCH_UP, S.FAILED]
    assert run(Handover(7, "node-1", "node-2"), {}, fail_at=S.DRAIN) == [S.CATCH_UP, S.DRAIN, S.UNFREEZE, S.FAILED]
    assert run(Handover(7, "node-1", "node-2"), {S.DRAIN: 3, S.CONFIRM: 3}, fail_at=S.RELEASE)[-3:] == [
        S.RELEASE, S.PROMOTE, S.DONE]


def test_a_catch_up_that_takes_too_long_fails_the_handover():
    h = Handover(7, "node-1", "node-2", catch_up_timeout=30.0)
    h.start(100.0)
    assert h.waited(120.0) is HandoverStep.CATCH_UP
    assert h.waited(131.0) is HandoverStep.FAILED
