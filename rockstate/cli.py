"""The ``rockstate`` command: coordinator, node, status, checkpoint, savepoint, demo.

Every listing and inspection takes ``--json`` (the same document the status
page's API serves); sizes are accepted and printed as people write them
(4GiB); commands that roll the live cluster back ask first, unless ``--yes``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import threading
import time

from pydantic import ByteSize, TypeAdapter, ValidationError

from . import __version__
from .config import CoordinatorConfig, NodeConfig, load, settings
from .errors import ConfigError, RockstateError

_SIZE = TypeAdapter(ByteSize)


def parse_size(text: str) -> int:
    """Bytes from "4GiB", "512MB", "1.5 GiB" or a plain number of bytes."""
    try:
        return int(_SIZE.validate_python(text))
    except ValidationError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: give bytes, or a number with a unit such as 512MiB or 4GiB") from None


def human(n: float | None) -> str:
    """1536 -> "1.5 KiB"; None -> ""."""
    if n is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:g} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _settings(args: argparse.Namespace, model) -> dict:
    return {name: getattr(args, name) for name in settings(model) if getattr(args, name, None) is not None}


def _add_fields(parser: argparse.ArgumentParser, model) -> None:
    """One --flag per config field, with its description and default as help; *_bytes fields take sizes."""
    parser.add_argument("--config", help="YAML file of settings (flags override it)")
    for name, field in settings(model).items():
        kind = parse_size if name.endswith("_bytes") else {int: int, float: float}.get(field.annotation, str)
        default = human(field.default) if name.endswith("_bytes") else field.default
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, default=None,
                            help=f"{field.description} (default: {default})")


def _serve(coroutine) -> None:
    """Run a server process's main coroutine on uvloop: libuv's event loop and transports cost each
    request less than asyncio's own (a fifth of a node's CPU for a batch read, measured)."""
    import uvloop

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
    from .cluster.coordinator.server import run_coordinator

    _serve(run_coordinator(load(CoordinatorConfig, args.config, **_settings(args, CoordinatorConfig))))


def cmd_node(args: argparse.Namespace) -> None:
    from .cluster.node.server import run_node

    _serve(run_node(load(NodeConfig, args.config, **_settings(args, NodeConfig))))


def _backend(args: argparse.Namespace):
    from .cluster.client.backend import ClusterBackend
    from .cluster.security import client_context, load_secret

    return ClusterBackend(args.coordinator, retry_timeout=5.0, secret=load_secret(args.secret_file),
                          ssl=client_context(args.tls_ca_file, args.tls_cert_file, args.tls_key_file))


def _waiting(what: str, fn):
    """Run ``fn`` under a spinner with the elapsed time: restores and savepoints can take a while."""
    from rich.console import Console

    with Console(stderr=True).status(f"{what}..."):
        return fn()


def _console():
    from rich.console import Console

    return Console()


def _table(*columns: str, title: str | None = None):
    """A table that fits 80 columns: compact box, headers never cut (cells fold instead)."""
    from rich import box
    from rich.table import Table

    from rich.markup import escape

    class Escaped(Table):  # cells are data from the cluster (node ids, states...): never rich markup
        def add_row(self, *cells, **kwargs):
            super().add_row(*(escape(c) if isinstance(c, str) else c for c in cells), **kwargs)

    table = Escaped(box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False)
    for c in columns:
        table.add_column(c, no_wrap=False, overflow="fold", min_width=len(max(c.split(), key=len)))
    return table


def _print_json(data) -> None:
    print(json.dumps(data, indent=1, default=lambda o: dataclasses.asdict(o) if dataclasses.is_dataclass(o) else str(o)))


def _confirm(args: argparse.Namespace, what: str) -> None:
    """Ask before a command that rolls the live cluster back; ``--yes`` answers for scripts."""
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise ConfigError(f"{what}: this rolls the live cluster back; run it from a terminal to confirm, or give --yes")
    print(f"{what}.\nEverything written to the cluster since is lost. Type 'yes' to go on: ", end="", file=sys.stderr, flush=True)
    if sys.stdin.readline().strip().lower() != "yes":
        raise ConfigError(f"{what}: not confirmed; nothing was changed")


def _shown_state(r: dict) -> str:
    """A completed checkpoint deleted by retention is no longer there to restore: say so."""
    return "DELETED" if r["state"] == "COMPLETED" and not r.get("retained", True) else r["state"]


def _latest(cp) -> int:
    done = [r.checkpoint_id for r in cp.checkpoints() if r.state == "COMPLETED" and r.retained]
    if not done:
        raise ConfigError("the cluster has no completed checkpoint yet: take one with `rockstate checkpoint trigger`")
    return max(done)


def cmd_checkpoint(args: argparse.Namespace) -> None:
    backend = _backend(args)
    try:
        cp = backend.checkpointer
        if args.action == "trigger":
            r = _waiting("checkpointing", cp.checkpoint)
            if args.json:
                return _print_json(r.to_dict())
            print(f"checkpoint {r.id} completed in {r.duration:.3f}s: {human(r.size)}, {human(r.bytes_uploaded)} uploaded")
        elif args.action == "list":
            records = [{**r.to_dict(), "state": _shown_state(r.to_dict())} for r in cp.checkpoints()]
            if args.json:
                return _print_json(records)
            table = _table("id", "state", "trigger", "started", "seconds", "size", "uploaded", "failure")
            for r in records:
                table.add_row(str(r["checkpoint_id"]), r["state"], r["trigger"], time.strftime("%m-%d %H:%M:%S", time.localtime(r["started_at"])),
                              "" if r["duration"] is None else f"{r['duration']:.2f}", human(r["size"]), human(r["uploaded_bytes"]), r["failure"] or "")
            _console().print(table)
        elif args.action == "inspect":
            meta = cp.inspect(_latest(cp) if args.id is None else args.id)
            if args.json:
                return _print_json(meta)
            print(f"checkpoint {meta['checkpoint_id']}: {meta['partitions']} partitions, states {sorted(meta['states'])}, "
                  f"{human(sum(m['data_size'] for m in meta['manifests']))}")
        elif args.action == "restore":
            target = _latest(cp) if args.id is None else args.id
            _confirm(args, f"restore the cluster to checkpoint {target}")
            r = _waiting("restoring", lambda: cp.restore(target))
            if args.json:
                return _print_json(dataclasses.asdict(r))
            print(f"restored checkpoint {r.checkpoint_id}" + (f" (skipped {[s.checkpoint_id for s in r.skipped]})" if r.skipped else ""))
    finally:
        backend.close()


def cmd_savepoint(args: argparse.Namespace) -> None:
    backend = _backend(args)
    try:
        cp = backend.checkpointer
        if args.action == "create":
            info = _waiting(f"creating savepoint {args.name}", lambda: cp.savepoint(args.name, args.checkpoint))
            if args.json:
                return _print_json(info.to_dict())
            print(f"savepoint {info.name} of checkpoint {info.checkpoint_id}: {info.files} files, {human(info.size)}")
        elif args.action == "list":
            records = [s.to_dict() for s in cp.savepoints()]
            if args.json:
                return _print_json(records)
            table = _table("name", "checkpoint", "size", "files")
            for s in records:
                table.add_row(s["name"], str(s["checkpoint_id"]), human(s["size"]), str(s["files"]))
            _console().print(table)
        elif args.action == "restore":
            _confirm(args, f"restore the cluster to savepoint {args.name}")
            r = _waiting(f"restoring savepoint {args.name}", lambda: cp.restore(savepoint=args.name))
            if args.json:
                return _print_json(dataclasses.asdict(r))
            print(f"restored savepoint {args.name} (checkpoint {r.checkpoint_id})")
    finally:
        backend.close()


def cmd_status(args: argparse.Namespace) -> None:
    backend = _backend(args)
    try:
        status = backend.status()
    finally:
        backend.close()
    if args.json:
        return _print_json(status)
    console = _console()
    from rich.markup import escape  # what the cluster sends is data, never markup

    console.print(f"cluster at {escape(args.coordinator)}: {status['partitions']} partitions, table epoch {status['epoch']}, {status['states']} states")
    coordinators = status.get("coordinators")
    if coordinators and "zookeeper" in coordinators:  # several coordinators
        console.print(escape(f"coordinators: leader {coordinators['leader'] or 'none elected'}; "
                             f"standbys {', '.join(coordinators['standbys']) or 'none'} (ZooKeeper {coordinators['zookeeper']})"))
    unavailable = status.get("unavailable", status["unassigned"])
    console.print(f"[bold red]{unavailable} partitions without a live owner[/]" if unavailable else "every partition has a live owner")
    if status.get("checkpoints"):
        c = status["checkpoints"]
        latest = "none completed yet" if c["latest"] is None else f"latest completed: {c['latest']}"
        console.print(escape(f"checkpoints at {c['url']}: {latest}"))
    table = _table("node", "address", "status", "parts", "memory", "disk", "seen", title="nodes")
    for n in status["nodes"]:
        f = n.get("figures") or {}
        table.add_row(n["node_id"], n["address"], n["status"], str(n["partitions"]), human(f.get("rss_bytes")),
                      human((f.get("disk") or {}).get("used_bytes")), f"{n['last_seen']:.1f}s")
    console.print(table)
    if status.get("replicas"):
        _print_replicas(console, status)
    if status.get("pipelines"):
        pipes = _table("pipeline", "batch", "rows in", "rows out", "seconds", "updated", title="pipelines")
        for r in status["pipelines"]:
            last = (r.get("batches") or [{}])[-1]
            pipes.add_row(r["query"], str(r.get("last_batch")), str(last.get("rows_in")), str(last.get("rows_out")),
                          str(last.get("seconds")), time.strftime("%H:%M:%S", time.localtime(r.get("updated", 0))))
        console.print(pipes)
    if status["events"]:
        events = _table("event", "details", title="recent events")
        for e in status["events"][-10:]:
            events.add_row(e["event"], ", ".join(f"{k}={v}" for k, v in e.items() if k not in ("event", "time", "seq")))
        console.print(events)


def _print_replicas(console, status: dict) -> None:
    """Each partition's primary and backups; a backup not in sync is marked (catching up)."""
    short = [r for r in status["replicas"] if r["waiting_for_election"] or len(r["backups"]) < status["backup_count"]
             or not all(b["in_sync"] for b in r["backups"])]
    console.print(f"replicas: {status['backup_count']} backup(s) per partition, {status.get('replication', 'sync')}; "
                  + (f"[bold yellow]{len(short)} partitions short of in-sync backups[/]" if short else "every backup in sync"))
    table = _table("partition", "primary", "backups", "epoch", title="replicas")
    for r in status["replicas"]:
        backups = ", ".join(b["node"] + ("" if b["in_sync"] else " (catching up)") for b in r["backups"]) or "-"
        table.add_row(str(r["partition"]), r["primary"] or "(electing)", backups, str(r["epoch"]))
    console.print(table)


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import main as demo

    logging.getLogger().setLevel(logging.WARNING)  # the demo shows its own progress
    sys.exit(demo(args))


def _client_parser() -> argparse.ArgumentParser:
    """The flags of every command that talks to a running cluster."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--coordinator", default="127.0.0.1:7700", help="the coordinator's host:port, or several as host:port,host:port... (default: 127.0.0.1:7700)")
    p.add_argument("--secret-file", help="file holding the cluster's shared secret (default: $ROCKSTATE_SECRET)")
    p.add_argument("--tls-ca-file", help="PEM CA bundle the coordinator's certificate must chain to (enables TLS)")
    p.add_argument("--tls-cert-file", help="PEM client certificate, when the cluster requires one")
    p.add_argument("--tls-key-file", help="PEM key of --tls-cert-file")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def _actions(sub, name: str, summary: str, client: argparse.ArgumentParser, actions: dict, func) -> None:
    """``rockstate NAME ACTION [args]``: each action its own parser, so flags and arguments mix in any order."""
    p = sub.add_parser(name, help=summary, description=summary)
    acts = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, (action_help, arguments) in actions.items():
        a = acts.add_parser(action, help=action_help, description=action_help, parents=[client])
        for args, kwargs in arguments:
            a.add_argument(*args, **kwargs)
        a.set_defaults(func=func)


YES = (("--yes", "-y"), {"action": "store_true", "help": "do not ask for confirmation"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rockstate", description="Distributed RocksDB-backed keyed state for PySpark pipelines")
    parser.add_argument("--version", action="version", version=f"rockstate {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    client = _client_parser()

    p = sub.add_parser("coordinator", help="run the coordinator (membership, partition table, checkpoints, status page)")
    _add_fields(p, CoordinatorConfig)
    p.set_defaults(func=cmd_coordinator)

    p = sub.add_parser("node", help="run a node that owns and serves partitions")
    _add_fields(p, NodeConfig)
    p.set_defaults(func=cmd_node)

    p = sub.add_parser("status", help="show nodes, partitions per node, the table epoch and recent events", parents=[client])
    p.set_defaults(func=cmd_status)

    checkpoint_id = (("id",), {"nargs": "?", "type": int, "help": "checkpoint id (default: the latest completed)"})
    _actions(sub, "checkpoint", "trigger, list, inspect or restore the cluster's checkpoints", client, {
        "trigger": ("take a checkpoint now", []),
        "list": ("the checkpoint history (DELETED: removed by retention)", []),
        "inspect": ("a checkpoint's metadata", [checkpoint_id]),
        "restore": ("roll the live cluster back to a checkpoint (asks first)", [checkpoint_id, YES]),
    }, cmd_checkpoint)
    name = (("name",), {"help": "the savepoint's name"})
    _actions(sub, "savepoint", "create, list or restore savepoints (self-contained copies of a checkpoint)", client, {
        "create": ("copy a checkpoint to a named savepoint", [name, (("--checkpoint",), {"type": int, "default": None,
                   "help": "from this checkpoint (default: take a new one)"})]),
        "list": ("the savepoints", []),
        "restore": ("roll the live cluster back to a savepoint (asks first)", [name, YES]),
    }, cmd_savepoint)

    p = sub.add_parser("demo", help="a CDC pipeline on PySpark through a node failure and a join, verified end to end")
    from .demo import add_arguments

    add_arguments(p)
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in filter(None, os.environ.get("ROCKSTATE_DEBUG", "").split(",")):  # debug logging of these modules only
        logging.getLogger(name.strip()).setLevel(logging.DEBUG)
    try:
        args.func(args)
    except RockstateError as e:
        print(f"rockstate: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
