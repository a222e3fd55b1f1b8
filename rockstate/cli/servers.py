"""``rockstate coordinator`` and ``rockstate node``: the server processes; ``rockstate demo``.

A node first makes sure it can reach its coordinator: each failed attempt is logged at WARNING with
the reason and the backoff before it (the project's one retry policy, ``retry.py``), and after
``--coordinator-wait`` seconds (default 60; 0: never) the node gives up and exits with status 2, naming
the address and the last error. An error that no retry can fix (a wrong secret, TLS, something that is
no rockstate coordinator) ends it at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from typing import Any

from ..config import CoordinatorConfig, NodeConfig, load, settings
from ..errors import ConfigError, CoordinatorUnreachableError, RockstateError
from ..retry import Retry, is_retryable
from .common import human, parse_size

log = logging.getLogger("rockstate.node")

COORDINATOR_WAIT = 60.0  # seconds a node tries to reach its coordinator before it exits


def config_settings(args: argparse.Namespace, model) -> dict:
    return {name: getattr(args, name) for name in settings(model) if getattr(args, name, None) is not None}


def add_fields(parser: argparse.ArgumentParser, model) -> None:
    """One --flag per config field, with its description and default as help; *_bytes fields take sizes.
    Defaults are left out of the namespace, so a global option given before the command (``--coordinator``,
    ``--secret-file``...) is not overwritten, and the environment and ``--config`` still apply (``config.load``)."""
    parser.add_argument("--config", default=argparse.SUPPRESS, help="YAML file of settings (flags override it)")
    for name, field in settings(model).items():
        kind: Any = parse_size if name.endswith("_bytes") else {int: int, float: float}.get(field.annotation, str)  # type: ignore[arg-type]
        default = human(field.default) if name.endswith("_bytes") else field.default
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, default=argparse.SUPPRESS,
                            help=f"{field.description} (default: {default}; env ROCKSTATE_{name.upper()})")


# The garbage collector's thresholds in a server process: a young-generation collection every 50,000 container
# allocations, not Python's 700. A node's request allocates thousands (its ops, keys, replies), so at 700 the
# collector ran hundreds of times a second, each pass walking what the requests had built so far: 0.7 of a node's
# 2.6 CPU seconds for 200,000 keys put at P=1024 on 3 nodes, 0.13-0.22 of 2.0-2.3 with these
# (``rockstate_node_gc_seconds_total``).
GC_THRESHOLDS = (50_000, 20, 100)


def serve(coroutine) -> None:
    """Run a server process's main coroutine on uvloop: libuv's event loop and transports cost each
    request less than asyncio's own (a fifth of a node's CPU for a batch read, measured)."""
    import gc

    import uvloop

    gc.set_threshold(*GC_THRESHOLDS)

    parent = os.environ.get("ROCKSTATE_PARENT_PID")
    if parent:
        threading.Thread(target=_exit_with, args=(int(parent),), name="exit-with-parent", daemon=True).start()
    uvloop.run(coroutine)


def _exit_with(parent: int) -> None:
    """A LocalCluster's process (it sets ROCKSTATE_PARENT_PID) ends, as if killed, once the process that started it is
    gone: a test or demo killed by a timeout must not leave its servers running."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def cmd_coordinator(args: argparse.Namespace) -> None:
    from ..cluster.coordinator.server import run_coordinator

    serve(run_coordinator(load(CoordinatorConfig, getattr(args, "config", None), **config_settings(args, CoordinatorConfig))))


def cmd_node(args: argparse.Namespace) -> None:
    from ..cluster.node.server import run_node

    config = load(NodeConfig, getattr(args, "config", None), **config_settings(args, NodeConfig))
    wait = COORDINATOR_WAIT if args.coordinator_wait is None else args.coordinator_wait

    async def main() -> None:
        await reach_coordinator(config, wait)
        await run_node(config)

    serve(main())


async def reach_coordinator(config: NodeConfig, wait: float) -> None:
    """Ask the coordinator for its table until it answers; log every failed attempt (why, the backoff before
    it); after ``wait`` seconds raise ``CoordinatorUnreachableError``. An error no retry can fix is raised at once."""
    from ..cluster import protocol as p
    from ..cluster.leader_channel import AsyncCoordinatorChannel
    from ..cluster.security import Security
    from ..rpc.async_client import AsyncChannel

    security = Security.from_config(config.security)
    channel = AsyncCoordinatorChannel(config.coordinator, lambda address: AsyncChannel(
        address, name="node", timeout=5.0, ssl=security.client_ssl, secret=security.secret))
    retry = Retry(deadline=wait or None, initial=0.5, maximum=5.0, retry_on=lambda e: is_retryable(e) or isinstance(e, OSError))
    started = time.monotonic()
    attempts: dict[str, Any] = {"n": 0, "failed_at": None}

    async def once() -> None:
        attempts["n"] += 1
        backoff = 0.0 if attempts["failed_at"] is None else time.monotonic() - attempts["failed_at"]
        try:
            await channel.call(p.GetTable(), timeout=5.0)
        except Exception as e:  # noqa: BLE001 -- logged, then retried or raised as the policy says
            attempts["failed_at"] = time.monotonic()
            left = max(0.0, wait - (attempts["failed_at"] - started))
            if retry.retry_on(e):
                log.warning("cannot reach the coordinator at %s (attempt %d%s): %s; retrying with backoff, %s", config.coordinator,
                            attempts["n"], f", after a {backoff:.2f} s backoff" if attempts["n"] > 1 else "", _reason(e),
                            f"giving up in {left:.1f} s (--coordinator-wait {wait:g})" if wait else "until it answers (--coordinator-wait 0)")
            raise

    try:
        await retry.acall(once, give_up=lambda e: CoordinatorUnreachableError(
            f"node gave up reaching the coordinator at {config.coordinator} after {time.monotonic() - started:.0f} s "
            f"and {attempts['n']} attempts (--coordinator-wait {wait:g}); last error: {_reason(e)}. "
            "Check --coordinator (host:port of the coordinator's cluster port, not its --http-port) and that it runs"))
    except CoordinatorUnreachableError:
        raise
    except OSError as e:
        raise CoordinatorUnreachableError(f"cannot reach the coordinator at {config.coordinator}: {_reason(e)}") from None
    except RockstateError as e:
        if isinstance(e, ConfigError):
            raise
        raise CoordinatorUnreachableError(f"cannot use the coordinator at {config.coordinator}: {_reason(e)}") from None
    finally:
        await channel.close()
    if attempts["n"] > 1:
        log.info("reached the coordinator at %s after %d attempts (%.1f s)", config.coordinator, attempts["n"], time.monotonic() - started)


def _reason(e: BaseException) -> str:
    return str(e) or type(e).__name__


def cmd_demo(args: argparse.Namespace) -> None:
    from ..demo import main as demo

    logging.getLogger().setLevel(logging.WARNING)  # the demo shows its own progress
    sys.exit(demo(args))
