"""``rockstate drain NODE``, ``undrain NODE``, ``remove NODE``: who is in the cluster, changed from anywhere.

``drain`` is the coordinator's ``Leave`` with ``drain``: every partition (primaries and backups) moves
off the node, which then stays a member, ``drained``: heard, shown, never given partitions or backups
again (a later rebalance, its restart, the coordinator's restart) until ``undrain``. Its process may
keep running; SIGTERM then moves nothing. ``remove`` forgets a member for good: a dead one whose
partitions were promoted or restored elsewhere, a left one, or a drained one whose process stopped;
the coordinator refuses (``MembershipChangeError``, saying what to do first) a live node, a drained
one still running, and one that still holds partitions. The rules are ``control/membership.py``'s.
"""

from __future__ import annotations

import argparse
import time

from .common import Output, backend, output_of, print_json


def _ask(args: argparse.Namespace, msg: object) -> tuple[dict, float]:
    client = backend(args)
    started = time.monotonic()
    try:
        answer = client._coordinator.call(msg, timeout=args.timeout)
    finally:
        client.close()
    return answer or {}, time.monotonic() - started


def cmd_drain(args: argparse.Namespace) -> None:
    from ..cluster import protocol as p

    answer, seconds = _ask(args, p.Leave(node_id=args.node, drain=True))
    moved = answer.get("moved", 0)
    if output_of(args) == "json":
        return print_json({"node": args.node, "moved": moved, "seconds": round(seconds, 3)})
    Output(args).line(f"drained {args.node}: {moved} partition move(s) in {seconds:.1f} s; it holds no partition and gets "
                      f"none until `rockstate undrain {args.node}`. Its process may be stopped (or removed for good: "
                      f"stop it, then `rockstate remove {args.node}`).")


def cmd_undrain(args: argparse.Namespace) -> None:
    from ..cluster import protocol as p

    answer, seconds = _ask(args, p.Undrain(node_id=args.node))
    moved = answer.get("moved", 0)
    if output_of(args) == "json":
        return print_json({"node": args.node, "moved": moved, "seconds": round(seconds, 3)})
    Output(args).line(f"undrained {args.node}: it takes partitions again ({moved} partition move(s) in {seconds:.1f} s)")


def cmd_remove(args: argparse.Namespace) -> None:
    from ..cluster import protocol as p

    answer, _ = _ask(args, p.RemoveMember(node_id=args.node))
    if output_of(args) == "json":
        return print_json(answer)
    Output(args).line(f"removed {answer['node']} (it was {answer['was']}): it is no member any more")
