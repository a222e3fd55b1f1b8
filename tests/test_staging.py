"""State versioned by micro-batch: a batch's stage is applied once a later batch advances, one done attempt per operator."""

import pytest

from rockstate.config import StoreConfig
from rockstate.serde import decode_stream, decode_value, encode_key, encode_value
from rockstate.store import APPEND, DELETE, DELETE_PREFIX, PUT, PUT_MANY, StateSpec, Store
from rockstate.store import staging
from rockstate.errors import BatchAppliedError, StageIncompleteError, StateRewoundError


@pytest.fixture
def part(tmp_path):
    store = Store(str(tmp_path / "s"), StoreConfig(partitions=1))
    store.define_state(StateSpec("counts", "value"))
    store.define_state(StateSpec("other", "value"))
    store.define_state(StateSpec("m", "map"))
    store.define_state(StateSpec("l", "list"))
    yield store.partition(0)
    store.close()


def k(x):
    return encode_key(x)


def v(x):
    return encode_value(x)


def get(part, state, key):
    data = part.get_many(state, [k(key)])[0]
    return None if data is None else decode_value(data)


def run(part, batch, attempt, ops_list, operator="op", done=True, query="q"):
    """Stage ``ops_list`` (one piece each) as an attempt of the batch, marked done unless told not to."""
    for seq, ops in enumerate(ops_list):
        staging.stage(part, query, batch, operator, attempt, seq, ops)
    if done:
        staging.mark_done(part, query, batch, operator, attempt, len(ops_list))


def seal_and_advance(part, batch, query="q", operator="op"):
    staging.seal(part, query, batch, operator)
    return staging.advance(part, query, batch + 1)


def test_a_batch_is_invisible_until_a_later_batch_advances(part):
    run(part, 0, 7, [[(PUT, "counts", k("a"), v(1))]])
    assert staging.advance(part, "q", 0) is None  # batch 0 itself reads the state before it
    assert get(part, "counts", "a") is None
    assert seal_and_advance(part, 0) == 0
    assert get(part, "counts", "a") == 1
    assert staging.applied(part, "q") == 0
    assert list(part.raw_items(staging.STAGED)) == []  # the stage is gone
    assert staging.advance(part, "q", 1) == 0  # idempotent


def test_one_done_attempt_per_operator_is_the_batch_version(part):
    # a failed attempt (not done) with other writes; two done attempts (a retry and a re-run) with the same writes
    run(part, 5, 1, [[(PUT, "counts", k("a"), v("partial"))], [(PUT, "counts", k("stray"), v(1))]], done=False)
    for attempt in (2, 3):
        run(part, 5, attempt, [[(PUT, "counts", k("a"), v("chunk1"))], [(PUT, "counts", k("a"), v("final")), (PUT, "counts", k("b"), v(2))]])
    run(part, 5, 4, [[(APPEND, "l", k("x"), v(1))]], operator="other")  # a second operator of the query
    for batch in range(5):
        staging.seal(part, "q", batch, "op")
    assert seal_and_advance(part, 5) == 5
    assert get(part, "counts", "a") == "final" and get(part, "counts", "b") == 2
    assert get(part, "counts", "stray") is None  # the failed attempt applied nothing
    assert decode_stream(part.get_many("l", [k("x")])[0]) == [1]  # once, though the batch had two done attempts


def test_a_done_attempt_must_have_every_piece(part):
    staging.stage(part, "q", 0, "op", 9, 1, [(PUT, "counts", k("a"), v(1))])  # piece 0 was lost with a node
    with pytest.raises(StageIncompleteError, match="holds 1 of the attempt's 2 staged pieces"):
        staging.mark_done(part, "q", 0, "op", 9, 2)


def test_attempts_of_an_applied_batch_are_refused(part):
    run(part, 0, 1, [[(PUT, "counts", k("a"), v(1))]])
    seal_and_advance(part, 0)
    with pytest.raises(BatchAppliedError):
        staging.stage(part, "q", 0, "op", 2, 0, [(PUT, "counts", k("a"), v(99))])
    with pytest.raises(BatchAppliedError):
        staging.mark_done(part, "q", 0, "op", 2, 0)
    assert get(part, "counts", "a") == 1


def test_a_partition_behind_the_last_seal_is_refused(part):
    run(part, 0, 1, [[(PUT, "counts", k("a"), v(1))]])
    # batch 0 was never sealed here (restored from a checkpoint before its seal): batch 1 must not read it
    with pytest.raises(StateRewoundError, match="through batch None"):
        staging.advance(part, "q", 1)
    assert staging.advance(part, "q", 0) is None  # a first batch has nothing before it


def test_versions_of_a_map_clear_and_deletes(part):
    part.write([(PUT, "m", k("u") + k(i), v(i)) for i in range(3)] + [(PUT, "counts", k("gone"), v(1))])
    run(part, 0, 1, [[(DELETE_PREFIX, "m", k("u"), None), (DELETE, "counts", k("gone"), None)],
                     [(PUT_MANY, "m", [k("u") + k(9)], [v(9)])]])
    assert len(part.scan("m", k("u"))) == 3  # not yet
    seal_and_advance(part, 0)
    assert [decode_value(val) for _, val in part.scan("m", k("u"))] == [9] and get(part, "counts", "gone") is None


def test_queries_are_versioned_apart(part):
    run(part, 0, 1, [[(PUT, "counts", k("a"), v("q"))]])
    run(part, 3, 1, [[(PUT, "other", k("a"), v("r"))]], query="r")
    seal_and_advance(part, 0)
    assert get(part, "counts", "a") == "q" and get(part, "other", "a") is None
    assert staging.applied(part, "r") is None


def test_the_last_task_of_a_batch_completes_the_count_once(part):
    answers = [staging.finish_task(part, "q", 0, "op", "run-1", t, 3, [t], None) for t in (0, 2, 2, 1, 1)]
    assert [a[0] for a in answers] == [False, False, False, True, False]  # task 1 completed it; its retry did not
    assert answers[3][1] == [0, 1, 2]
    # a new run of the batch counts again; a failure is sticky for the run
    assert staging.finish_task(part, "q", 0, "op", "run-2", 0, 1, [], "lost")[0:3] == [True, [], "lost"]
    assert staging.finish_task(part, "q", 0, "op", "run-2", 0, 1, [], None)[2] == "lost"
