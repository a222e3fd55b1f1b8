"""The one retry policy: exponential backoff with full jitter until a deadline, for errors that say they are retryable.

Every place that sends a request again (the routing client, a node
registering, the coordinator's failover and checkpoint storage, the exactly-once
sink) uses a ``Retry``; only its numbers differ. An error is retried when
``retry_on`` says so (by default: a ``RockstateError`` whose ``retryable`` is
true); anything else is raised at once. When the deadline has passed, the last
error is raised, or what ``give_up`` makes of it.

Waits are drawn uniformly from ``[0, min(maximum, initial * 2**n)]`` ("full
jitter"): clients that failed together do not come back together.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, TypeVar

import tenacity

from .errors import RockstateError

T = TypeVar("T")


def is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, RockstateError) and exc.retryable


@dataclass(frozen=True)
class Retry:
    deadline: float | None = 30.0  # seconds from the first attempt; None: until it succeeds
    initial: float = 0.01  # the first wait's upper bound
    maximum: float = 0.5  # the longest wait
    retry_on: Callable[[BaseException], bool] = is_retryable

    def replace(self, **changes: Any) -> "Retry":
        return replace(self, **changes)

    def _retrying(self, cls: type, **extra: Any) -> Any:
        return cls(stop=tenacity.stop_never if self.deadline is None else tenacity.stop_after_delay(self.deadline),
                   wait=tenacity.wait_random_exponential(multiplier=self.initial, max=self.maximum),
                   retry=tenacity.retry_if_exception(self.retry_on), reraise=True, **extra)

    def call(self, fn: Callable[..., T], *args: Any, sleep: Callable[[float], None] | None = None,
             give_up: Callable[[BaseException], BaseException] | None = None, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, retried. ``sleep(seconds)`` spends each wait (``time.sleep`` by default: the
        routing client waits for a newer table instead, and may return early); ``give_up(last error)`` is raised
        (from the last error) when the deadline has passed."""
        try:
            return self._retrying(tenacity.Retrying, **({} if sleep is None else {"sleep": sleep}))(fn, *args, **kwargs)
        except Exception as exc:
            self._give_up(exc, give_up)
            raise

    async def acall(self, fn: Callable[..., Awaitable[T]], *args: Any,
                    give_up: Callable[[BaseException], BaseException] | None = None, **kwargs: Any) -> T:
        """The same for a coroutine function; waits with ``asyncio.sleep``."""
        try:
            return await self._retrying(tenacity.AsyncRetrying)(fn, *args, **kwargs)
        except Exception as exc:
            self._give_up(exc, give_up)
            raise

    def _give_up(self, exc: BaseException, give_up: Callable[[BaseException], BaseException] | None) -> None:
        # a retryable error escaping the loop means the deadline passed (others are raised at once, as they are)
        if give_up is not None and self.retry_on(exc):
            raise give_up(exc) from exc

