"""``rockstate drain NODE``: move a node's partitions to the others, from anywhere (the coordinator's Leave).

The coordinator's ``Leave`` moves every partition (primaries and backups) off the node, marks it
``left`` and answers once they have moved; it is what a node sends itself on SIGTERM. Sent by
the CLI for another node, the node's process keeps running: its next heartbeat is refused (it
is no member any more) and it joins again as a new member with an empty share, so the cluster
rebalances onto it. ``drain`` therefore says to stop the node's process right after (SIGTERM then
moves nothing more). There is no ``rockstate remove NODE`` (forget a dead member): the coordinator
has no request for it yet and keeps dead members in its membership until they return.
"""

from __future__ import annotations

import argparse
import time

from ..errors import ConfigError
from .common import Output, backend, output_of, print_json


def cmd_drain(args: argparse.Namespace) -> None:
    from ..cluster import protocol as p

    client = backend(args)
    try:
        nodes = {n["node_id"]: n for n in client.status()["nodes"]}
        node = nodes.get(args.node)
        if node is None:
            raise ConfigError(f"the cluster has no node {args.node!r}; its nodes are {', '.join(sorted(nodes)) or 'none'}")
        if node["status"] != "alive":
            raise ConfigError(f"node {args.node} is {node['status']}: only a live node can be drained")
        started = time.monotonic()
        answer = client._coordinator.call(p.Leave(node_id=args.node), timeout=args.timeout)
    finally:
        client.close()
    moved = (answer or {}).get("moved", 0)
    seconds = time.monotonic() - started
    if output_of(args) == "json":
        return print_json({"node": args.node, "moved": moved, "seconds": round(seconds, 3)})
    Output(args).line(f"drained {args.node}: {moved} partition move(s) in {seconds:.1f} s; it holds no partition now. "
                      f"Stop its process now (SIGTERM): left running, it joins again and is given a share back.")

