"""The one retry policy: what it retries, how long it waits, when it gives up (sync and async)."""

import asyncio
import time

import pytest

from rockstate.errors import (ClusterTimeoutError, ConnectionLostError, InvalidKeyError, NotOwnerError,
                              PartitionUnavailableError)
from rockstate.retry import Retry


class Flaky:
    """Fails with ``errors`` in turn, then returns ``result``; records when each attempt started."""

    def __init__(self, errors, result="ok"):
        self.errors = list(errors)
        self.result = result
        self.times: list[float] = []

    def __call__(self, *args, **kwargs):
        self.times.append(time.monotonic())
        self.args = args, kwargs
        if self.errors:
            raise self.errors.pop(0)
        return self.result

    async def coro(self, *args, **kwargs):
        return self(*args, **kwargs)


def test_retries_retryable_errors_until_success_and_passes_arguments():
    fn = Flaky([NotOwnerError("moved"), ConnectionLostError("reset"), PartitionUnavailableError("moving")], result=42)
    assert Retry(deadline=5).call(fn, "order-7f3a", limit=3) == 42
    assert len(fn.times) == 4
    assert fn.args == (("order-7f3a",), {"limit": 3})


def test_non_retryable_errors_are_raised_at_once():
    for error in (InvalidKeyError("a set is not a key"), ValueError("not ours")):
        fn = Flaky([error, error])
        with pytest.raises(type(error)):
            Retry(deadline=5).call(fn)
        assert len(fn.times) == 1


def test_gives_up_after_the_deadline_with_the_last_error():
    fn = Flaky([ConnectionLostError(f"reset {i}") for i in range(10_000)])
    start = time.monotonic()
    with pytest.raises(ConnectionLostError) as info:
        Retry(deadline=0.3, initial=0.01, maximum=0.05).call(fn)
    elapsed = time.monotonic() - start
    assert 0.3 <= elapsed < 0.3 + 0.05 + 0.5  # the deadline, at most one more wait, and a margin for a busy machine
    assert len(fn.times) >= 5
    assert str(info.value) == f"reset {len(fn.times) - 1}"


def test_give_up_turns_the_last_error_into_another_one():
    fn = Flaky([NotOwnerError("partition 3 moved")] * 10_000)
    with pytest.raises(ClusterTimeoutError, match="gave up: partition 3 moved") as info:
        Retry(deadline=0.1).call(fn, give_up=lambda e: ClusterTimeoutError(f"gave up: {e}"))
    assert isinstance(info.value.__cause__, NotOwnerError)
    # a non-retryable error is not turned into a timeout
    with pytest.raises(InvalidKeyError):
        Retry(deadline=0.1).call(Flaky([InvalidKeyError("bad")]), give_up=lambda e: ClusterTimeoutError(str(e)))


def test_waits_grow_with_jitter_and_stay_under_the_maximum():
    fn = Flaky([PartitionUnavailableError("moving")] * 12)
    Retry(deadline=30, initial=0.002, maximum=0.04).call(fn)
    waits = [b - a for a, b in zip(fn.times, fn.times[1:])]
    assert len(waits) == 12
    assert all(w < 0.04 + 0.05 for w in waits)  # the bound, plus scheduling slack
    assert len({round(w, 6) for w in waits}) > 6  # drawn at random, not a fixed schedule
    assert sum(waits[:3]) < sum(waits[-3:])  # the window widens: 0.002, 0.004, 0.008 ... 0.04


def test_each_wait_is_spent_by_the_given_sleep_which_may_return_early():
    calls, slept = [], []
    fn = Flaky([NotOwnerError("moved")] * 6)
    Retry(deadline=5, initial=0.5, maximum=10).call(lambda: calls.append("attempt") or fn(),
                                                  sleep=lambda seconds: (slept.append(seconds), calls.append("sleep")))
    assert calls == ["attempt", "sleep"] * 6 + ["attempt"]
    assert all(0 <= s <= 10 for s in slept) and len(set(slept)) > 1  # the drawn waits, handed over
    assert fn.times[-1] - fn.times[0] < 1.0  # nothing slept beyond what ``sleep`` chose: these waits drew ~0.5-10 s


def test_no_deadline_retries_until_success():
    fn = Flaky([ConnectionLostError("coordinator restarting")] * 20)
    assert Retry(deadline=None, initial=0.001, maximum=0.002).call(fn) == "ok"
    assert len(fn.times) == 21


def test_a_custom_predicate_chooses_what_is_retried():
    fn = Flaky([OSError("disk busy"), OSError("disk busy")])
    assert Retry(deadline=5, retry_on=lambda e: isinstance(e, OSError)).call(fn) == "ok"
    assert Retry().replace(deadline=1).deadline == 1


def test_async_retries_waits_without_blocking_the_loop_and_gives_up():
    async def main():
        fn = Flaky([NotOwnerError("moved")] * 5, result="done")
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        assert await Retry(deadline=5, initial=0.02, maximum=0.02).acall(fn.coro) == "done"
        task.cancel()
        assert len(fn.times) == 6
        assert ticks >= 5  # the loop kept running while the policy waited

        with pytest.raises(ClusterTimeoutError):
            await Retry(deadline=0.1).acall(Flaky([ConnectionLostError("x")] * 10_000).coro,
                                            give_up=lambda e: ClusterTimeoutError(str(e)))
        with pytest.raises(InvalidKeyError):
            await Retry(deadline=5).acall(Flaky([InvalidKeyError("bad")]).coro)

    asyncio.run(main())
