"""``rockstate status``: the verdict first, in a screenful; details behind flags.

The verdict (``cluster/health.py``'s ``summarize``, which the coordinator's ``GET /healthz`` answers too),
from the coordinator's status document (``cluster/coordinator/web/status.py``):

- **unavailable** (exit 2): a partition has no live owner, no node is alive, no coordinator leads,
  or the coordinator cannot be asked at all;
- **degraded** (exit 1): partitions short of in-sync backups (fewer backups than ``backup_count``,
  one catching up, or waiting for the election of a new primary), failovers in flight, a node in a
  state other than alive, leaving, left or dead (a "suspect" one);
- **healthy** (exit 0): none of these.

A dead node is shown, but does not make the cluster degraded by itself: once its partitions were
promoted and their backups rebuilt elsewhere, nothing is short (while they are, the cluster is
degraded). Usage errors exit with 64, never 1 or 2.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

from ..cluster.health import short_partitions, summarize, unreachable
from ..errors import ConfigError, RockstateError
from .common import Output, backend, coordinator_of, human, output_of, print_json

STYLE = {"healthy": "bold green", "degraded": "bold yellow", "unavailable": "bold red"}
NODE_ORDER = ("alive", "suspect", "leaving", "drained", "dead", "left")
EVENTS_SHOWN = 20


def _nodes_line(summary: dict) -> str:
    nodes = summary["nodes"]
    states = sorted(nodes, key=lambda s: (NODE_ORDER.index(s) if s in NODE_ORDER else len(NODE_ORDER), s))
    parts = [f"{len(nodes[s])} {s}" + ("" if s == "alive" else f" ({', '.join(nodes[s])})") for s in states]
    return ", ".join(parts) or "none"


def render(out: Output, address: str, status: dict, summary: dict) -> None:
    """The summary: a verdict line, one line per figure, the node table; then where the details are."""
    verdict = summary["verdict"]
    why = f": {'; '.join(summary['reasons'])}" if summary["reasons"] else ""
    out.line(f"cluster at {address}: {verdict.upper()}{why}", STYLE[verdict])
    rows: list[tuple[str, str]] = [("nodes", _nodes_line(summary))]
    unavailable = summary["without_live_owner"]
    rows.append(("partitions", f"{summary['partitions']} partitions, table epoch {status.get('epoch')}; "
                 + (f"{unavailable} partitions without a live owner" if unavailable else "every partition has a live owner")))
    backups = status.get("backup_count", 0)
    short = summary["short_of_in_sync_backups"]
    if backups:
        alive = len(summary["nodes"].get("alive", []))
        rows.append(("replicas", f"{backups} backup(s) per partition, {status.get('replication', 'sync')}; "
                     + (f"{len(short)} partitions short of in-sync backups" if short else "every backup in sync")
                     + (f" ({alive} live node(s) hold at most {max(alive - 1, 0)} backup(s))" if short and alive <= backups else "")
                     + (f"; {len(summary['waiting_for_election'])} waiting for a new primary" if summary["waiting_for_election"] else "")))
    else:
        rows.append(("replicas", "no backups (backup_count 0): a dead node's partitions wait for it or the checkpoint"))
    moves = summary["moves"]
    rows.append(("moves", f"{len(moves)} in flight (" + ", ".join(f"{m['partition']}: {m['source']} -> {m['target']}" for m in moves[:5])
                 + (", ..." if len(moves) > 5 else "") + ")" if moves else "none in flight"))
    if summary["failovers"]:
        rows.append(("failovers", "in flight: " + ", ".join(map(str, summary["failovers"]))))
    c = summary["checkpoints"]
    if c:
        latest = "none completed yet" if c.get("latest") is None else f"latest completed: {c['latest']}"
        recent = c.get("recent") or []
        last = recent[-1] if recent else None
        tail = f"; last: {last['checkpoint_id']} {last['state']}" if last and last.get("checkpoint_id") != c.get("latest") else ""
        rows.append(("checkpoints", f"{c['url']}: {latest}{tail}"))
    else:
        rows.append(("checkpoints", "off (the coordinator has no --checkpoints)"))
    standbys = summary["standbys"]
    coordinators = status.get("coordinators") or {}
    if "zookeeper" in coordinators:
        rows.append(("leader", f"{summary['leader'] or 'none elected'}; standbys {', '.join(standbys) or 'none'} (ZooKeeper {coordinators['zookeeper']})"))
    else:
        rows.append(("leader", f"{summary['leader'] or address} (a single coordinator)"))
    rows.append(("states", str(status.get("states", 0))))
    restart = summary.get("restart") or {}
    if restart:
        rows.append(("restart", "; ".join(f"{node} ({', '.join(names)})" for node, names in sorted(restart.items()))
                     + ": settings a node takes when it registers, changed on the coordinator since"))
    if out.mode == "plain":
        out.line(f"verdict\t{verdict}")
        for name, text in rows:
            out.line(f"{name}\t{text}")
    else:
        width = max(len(n) for n, _ in rows)
        for name, text in rows:
            out.line(f"  {name:<{width}}  {text}")
    node_rows = []
    for n in status.get("nodes", []):
        f = n.get("figures") or {}
        node_rows.append((n["node_id"], n["address"], n["status"], n["partitions"], human(f.get("rss_bytes")),
                          human((f.get("disk") or {}).get("used_bytes")), f"{n['last_seen']:.1f}s"))
    out.table(("node", "address", "status", "parts", "memory", "disk", "seen"), node_rows)


def render_partitions(out: Output, status: dict) -> None:
    """Each partition's owner, replicas and whether it is short; a moving one says where to."""
    moving = {m["partition"]: m for m in status.get("moves") or []}
    replicas = {r["partition"]: r for r in status.get("replicas") or []}
    short = set(short_partitions(status))
    live = {n["node_id"] for n in status.get("nodes", []) if n["status"] in ("alive", "suspect", "leaving")}
    rows = []
    for pid, owner in enumerate(status.get("owners") or []):
        r = replicas.get(pid)
        backups = ", ".join(b["node"] + ("" if b["in_sync"] else " (catching up)") for b in r["backups"]) if r else ""
        notes = []
        if owner not in live:
            notes.append("no live owner")
        if pid in short:
            notes.append("electing" if r and r.get("waiting_for_election") else "short of in-sync backups")
        if pid in moving:
            notes.append(f"moving to {moving[pid]['target']}")
        rows.append((pid, owner or "-", (r["primary"] or "(electing)") if r else owner or "-", backups or "-",
                     r["epoch"] if r else "", "; ".join(notes) or "ok"))
    out.table(("partition", "owner", "primary", "backups", "epoch", "state"), rows, title="partitions")


def render_events(out: Output, events: list[dict], types: list[str] | None, last: int) -> None:
    chosen = [e for e in events if not types or e["event"] in types]
    shown = chosen[-last:] if last else chosen
    title = f"events ({len(shown)} of {len(chosen)}" + (f" of type {', '.join(types)}" if types else "") + ")"
    out.table(("seq", "time", "event", "details"), [
        (e.get("seq", ""), time.strftime("%m-%d %H:%M:%S", time.localtime(e["time"])) if "time" in e else "", e["event"],
         ", ".join(f"{k}={v}" for k, v in e.items() if k not in ("event", "time", "seq"))) for e in shown], title=title)


def _types(values: list[str] | None) -> list[str] | None:
    """``--type a --type b,c`` -> [a, b, c]."""
    return [t.strip() for v in values for t in v.split(",") if t.strip()] if values else None


def check(args: argparse.Namespace) -> tuple[dict | None, dict, list[dict] | None]:
    """One look: the status document (None: the coordinator could not be asked), its summary, the events asked for."""
    address = coordinator_of(args)
    events = None
    try:
        client = backend(args)
        try:
            status = client.status()
            if args.events:
                try:
                    events = client.events(0)  # the coordinator's whole kept log, not only the last 100
                except RockstateError:
                    events = status.get("events", [])
        finally:
            client.close()
    except ConfigError:
        raise  # a bad address or TLS file: an error of the command, not a verdict on the cluster
    except RockstateError as e:
        return None, unreachable(address, e), None
    return status, summarize(status), events


def show(args: argparse.Namespace, out: Output, status: dict | None, summary: dict, events: list[dict] | None) -> None:
    address = coordinator_of(args)
    if out.mode == "json":
        doc = {"health": summary} if status is None else {**status, "health": summary}
        if events is not None:
            types = _types(args.type)
            doc["events"] = [e for e in events if not types or e["event"] in types]
        return print_json(doc, file=out.file)
    if status is None:
        out.line(f"cluster at {address}: UNAVAILABLE: {summary['reasons'][0]}", STYLE["unavailable"])
        print(f"rockstate: error: {summary['reasons'][0]}", file=sys.stderr)
        return
    render(out, address, status, summary)
    if args.partitions:
        render_partitions(out, status)
    if events is not None:
        render_events(out, events, _types(args.type), args.last)
    if not (args.partitions or events is not None):
        out.line("details: --partitions (each partition's owner and replicas), --events [--type TYPE] (recent events)", "dim")


def cmd_status(args: argparse.Namespace) -> None:
    out = Output(args)
    if args.watch is None:
        status, summary, events = check(args)
        show(args, out, status, summary, events)
        if summary["exit_code"]:
            sys.exit(summary["exit_code"])
        return
    code = 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(code))
    try:
        while True:
            status, summary, events = check(args)
            code = summary["exit_code"]
            if out.file.isatty() and output_of(args) != "json":
                out.console.clear()
            if out.mode != "json":
                out.line(time.strftime("%H:%M:%S") + f"  (every {args.watch:g} s; Ctrl-C stops)", "dim")
            show(args, out, status, summary, events)
            out.file.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        pass
    sys.exit(code)
