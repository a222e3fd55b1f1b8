"""Staged micro-batch writes: commit picks one attempt per task, is idempotent, and can be undone."""

import pytest

from rockstate.config import StoreConfig
from rockstate.serde import decode_stream, decode_value, encode_key, encode_value
from rockstate.store import APPEND, DELETE, DELETE_PREFIX, PUT, PUT_MANY, StateSpec, Store
from rockstate.store import staging
from rockstate.errors import RollbackError


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


def test_stage_is_invisible_until_commit(part):
    staging.stage(part, "q", 0, task=0, attempt=0, seq=0, ops=[(PUT, "counts", k("a"), v(1))])
    staging.mark_done(part, "q", 0, 0, 0)
    assert get(part, "counts", "a") is None
    assert staging.commit(part, "q", 0) is True
    assert get(part, "counts", "a") == 1
    assert staging.committed(part, "q") == 0
    assert list(part.raw_items(staging.STAGED)) == []  # the stage is gone


def test_commit_takes_the_highest_done_attempt_per_task(part):
    # task 0: attempt 0 failed midway (not done), attempt 1 done; task 1: attempts 0 and 2 done
    staging.stage(part, "q", 5, 0, 0, 0, [(PUT, "counts", k("t0"), v("attempt0"))])
    staging.stage(part, "q", 5, 0, 1, 0, [(PUT, "counts", k("t0"), v("attempt1"))])
    staging.stage(part, "q", 5, 0, 1, 1, [(PUT, "counts", k("t0b"), v("attempt1-flush2"))])
    staging.mark_done(part, "q", 5, 0, 1)
    staging.stage(part, "q", 5, 1, 0, 0, [(PUT, "counts", k("t1"), v("a0")), (PUT, "counts", k("extra"), v(1))])
    staging.stage(part, "q", 5, 1, 2, 0, [(PUT, "counts", k("t1"), v("a2"))])
    staging.mark_done(part, "q", 5, 1, 0)
    staging.mark_done(part, "q", 5, 1, 2)
    staging.stage(part, "q", 5, 2, 0, 0, [(PUT, "counts", k("never"), v("not done"))])
    staging.commit(part, "q", 5)
    assert get(part, "counts", "t0") == "attempt1"
    assert get(part, "counts", "t0b") == "attempt1-flush2"
    assert get(part, "counts", "t1") == "a2"
    assert get(part, "counts", "extra") is None  # attempt 0 of task 1 was replaced whole
    assert get(part, "counts", "never") is None


def test_commit_is_idempotent(part):
    staging.stage(part, "q", 0, 0, 0, 0, [(APPEND, "l", k("x"), v(1))])
    staging.mark_done(part, "q", 0, 0, 0)
    assert staging.commit(part, "q", 0)
    assert not staging.commit(part, "q", 0)  # a retried commit applies nothing twice
    assert decode_stream(part.get_many("l", [k("x")])[0]) == [1]


def test_rollback_restores_the_state_before_the_batches(part):
    part.write([(PUT, "counts", k("a"), v(0)), (PUT, "other", k("a"), v("untouched"))])
    for batch in range(3):
        staging.stage(part, "q", batch, 0, 0, 0, [
            (PUT_MANY, "counts", [k("a"), k(f"new{batch}")], [v(batch + 1), v(batch)]),
            (APPEND, "l", k("log"), v(batch)),
            (PUT, "m", k("u") + k(batch), v(batch)),
        ])
        staging.mark_done(part, "q", batch, 0, 0)
        staging.commit(part, "q", batch)
    # another query's writes to its own state are not touched by q's rollback
    staging.stage(part, "other-q", 0, 0, 0, 0, [(PUT, "other", k("b"), v("kept"))])
    staging.mark_done(part, "other-q", 0, 0, 0)
    staging.commit(part, "other-q", 0)
    assert get(part, "counts", "a") == 3
    assert staging.rollback(part, "q", 0) == 2
    assert get(part, "counts", "a") == 1
    assert get(part, "counts", "new0") == 0 and get(part, "counts", "new1") is None and get(part, "counts", "new2") is None
    assert decode_stream(part.get_many("l", [k("log")])[0]) == [0]
    assert get(part, "other", "a") == "untouched" and get(part, "other", "b") == "kept"
    assert staging.committed(part, "q") == 0
    # the batch can be committed again after the rollback, e.g. on replay
    staging.stage(part, "q", 1, 0, 0, 0, [(PUT, "counts", k("a"), v("replayed"))])
    staging.mark_done(part, "q", 1, 0, 0)
    assert staging.commit(part, "q", 1)
    assert get(part, "counts", "a") == "replayed"


def test_rollback_of_a_map_clear_and_a_delete(part):
    part.write([(PUT, "m", k("u") + k(i), v(i)) for i in range(3)] + [(PUT, "counts", k("gone"), v(1))])
    staging.stage(part, "q", 0, 0, 0, 0, [(DELETE_PREFIX, "m", k("u"), None), (DELETE, "counts", k("gone"), None)])
    staging.mark_done(part, "q", 0, 0, 0)
    staging.commit(part, "q", 0)
    assert list(part.scan("m", k("u"))) == [] and get(part, "counts", "gone") is None
    staging.rollback(part, "q", None)
    assert len(part.scan("m", k("u"))) == 3 and get(part, "counts", "gone") == 1
    assert staging.committed(part, "q") is None


def test_rollback_further_than_the_kept_undo_is_refused(part):
    for batch in range(staging.KEEP_UNDO + 2):
        staging.stage(part, "q", batch, 0, 0, 0, [(PUT, "counts", k("a"), v(batch))])
        staging.mark_done(part, "q", batch, 0, 0)
        staging.commit(part, "q", batch)
    with pytest.raises(RollbackError, match="undo of batches"):
        staging.rollback(part, "q", 0)
    assert get(part, "counts", "a") == staging.KEEP_UNDO + 1  # nothing changed
    staging.rollback(part, "q", staging.KEEP_UNDO)
    assert get(part, "counts", "a") == staging.KEEP_UNDO
