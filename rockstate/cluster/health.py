"""The cluster's health verdict, from the coordinator's status document (``coordinator/web/status.py``).

One pure function, ``summarize``, shared by ``rockstate status`` (its exit code) and the coordinator's
``GET /healthz`` (its HTTP status), so both say the same:

- **unavailable** (exit 2, HTTP 503): a partition has no live owner, no node is alive (or suspect), no
  coordinator leads, or the coordinator cannot be asked at all (``unreachable``);
- **degraded** (exit 1, HTTP 200 with ``"verdict": "degraded"``): partitions short of in-sync backups (fewer
  backups than ``backup_count``, one catching up, or waiting for the election of a new primary), failovers
  in flight, a node in a state other than alive, leaving, left, drained or dead (a "suspect" one), nodes
  that run with settings the coordinator has changed since they registered (``restart``: their leases or
  size limits are not the coordinator's);
- **healthy** (exit 0, HTTP 200): none of these.

A dead node is shown, but does not make the cluster degraded by itself: once its partitions were
promoted and their backups rebuilt elsewhere, nothing is short (while they are, the cluster is
degraded).
"""

from __future__ import annotations

from collections import Counter

EXIT = {"healthy": 0, "degraded": 1, "unavailable": 2}
HTTP = {"healthy": 200, "degraded": 200, "unavailable": 503}  # GET /healthz: probes take 503 as "not ready"


def short_partitions(status: dict) -> list[int]:
    """Partitions with fewer in-sync backups than configured (or waiting for the election of a primary)."""
    want = status.get("backup_count", 0)
    return [r["partition"] for r in status.get("replicas") or []
            if r.get("waiting_for_election") or len(r["backups"]) < want or not all(b["in_sync"] for b in r["backups"])]


def summarize(status: dict) -> dict:
    """The verdict, its reasons and the figures the summary shows."""
    nodes = status.get("nodes", [])
    by_state = Counter(n["status"] for n in nodes)
    unavailable = status.get("unavailable", status.get("unassigned", 0))
    short = short_partitions(status)
    electing = [r["partition"] for r in status.get("replicas") or [] if r.get("waiting_for_election")]
    coordinators = status.get("coordinators") or {}
    failovers = status.get("failovers") or []
    down, weak = [], []
    if unavailable:
        down.append(f"{unavailable} partitions without a live owner")
    if not (by_state.get("alive") or by_state.get("suspect")):  # a suspect node still serves until it is dead
        down.append("no node is alive")
    if "leader" in coordinators and not coordinators.get("leader"):
        down.append("no coordinator leads" + (f" ({coordinators['error']})" if coordinators.get("error") else ""))
    if short:
        weak.append(f"{len(short)} partitions short of in-sync backups")
    if failovers:
        weak.append(f"failover of {', '.join(map(str, failovers))} in flight")
    odd = {s: c for s, c in by_state.items() if s not in ("alive", "leaving", "left", "dead", "drained")}
    if odd:
        weak.append(", ".join(f"{c} node(s) {s}" for s, c in sorted(odd.items())))
    restart = status.get("restart") or {}
    if restart:
        weak.append(f"restart {', '.join(sorted(restart))}: they run with settings the coordinator changed")
    verdict = "unavailable" if down else "degraded" if weak else "healthy"
    return {"verdict": verdict, "exit_code": EXIT[verdict], "reasons": down + weak,
            "nodes": {s: sorted(n["node_id"] for n in nodes if n["status"] == s) for s in by_state},
            "partitions": status.get("partitions"), "without_live_owner": unavailable,
            "short_of_in_sync_backups": short, "waiting_for_election": electing,
            "moves": status.get("moves") or [], "failovers": failovers,
            "leader": coordinators.get("leader"), "standbys": coordinators.get("standbys") or [],
            "checkpoints": status.get("checkpoints"), "restart": restart}


def unreachable(address: str, error: BaseException) -> dict:
    return {"verdict": "unavailable", "exit_code": EXIT["unavailable"],
            "reasons": [f"cannot ask the coordinator at {address}: {error}"]}
