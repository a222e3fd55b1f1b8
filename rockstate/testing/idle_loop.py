"""How late an idle event loop on this machine wakes: what the machine alone costs a loop, beside a cluster's.

On a loaded shared machine every process's loop stalls at once now and then (the CPU or the disk is taken away
from all of them): a bare process doing nothing but sampling saw the same 0.5 s stall at the same moment as a
scale test's nodes. A test that bounds a cluster's loop lag compares it with this one's, measured meanwhile, in
a process of its own (in the test's process the workload's threads would hold the GIL against it).
"""

from __future__ import annotations

import subprocess
import sys
from types import TracebackType

from ..cluster.loop_lag import INTERVAL

_PROBE = f"""
import asyncio, sys, threading

async def main():
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    threading.Thread(target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(done.set_result, None)), daemon=True).start()
    worst = 0.0
    while not done.done():
        due = loop.time() + {INTERVAL}
        await asyncio.sleep({INTERVAL})
        worst = max(worst, loop.time() - due)
    print(worst, flush=True)

asyncio.run(main())
"""


class IdleLoop:
    """``with IdleLoop() as idle: ...``; then ``idle.worst``: the idle loop's worst lag (seconds) meanwhile."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> "IdleLoop":
        self._process = subprocess.Popen([sys.executable, "-c", _PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        assert self._process is not None
        out, _ = self._process.communicate(timeout=30)  # stdin closed: it answers and exits
        self.worst = float(out)  # no answer (it died): a ValueError, never a bound of its own
