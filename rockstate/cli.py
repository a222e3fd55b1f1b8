"""The ``rockstate`` command: coordinator, node, status, demo."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time

from .config import CoordinatorConfig, NodeConfig, load, settings
from .errors import RockstateError


def _settings(args: argparse.Namespace, model) -> dict:
    return {name: getattr(args, name) for name in settings(model) if getattr(args, name, None) is not None}


def _add_fields(parser: argparse.ArgumentParser, model, skip: tuple[str, ...] = ()) -> None:
    """One --flag per config field, with its description and default as help."""
    parser.add_argument("--config", help="YAML file of settings (flags override it)")
    for name, field in settings(model).items():
        if name in skip:
            continue
        kind = {int: int, float: float}.get(field.annotation, str)
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, default=None,
                            help=f"{field.description} (default: {field.default})")


def cmd_coordinator(args: argparse.Namespace) -> None:
    from .cluster.coordinator import run_coordinator

    asyncio.run(run_coordinator(load(CoordinatorConfig, args.config, **_settings(args, CoordinatorConfig))))


def cmd_node(args: argparse.Namespace) -> None:
    from .cluster.node import run_node

    asyncio.run(run_node(load(NodeConfig, args.config, **_settings(args, NodeConfig))))


def _backend(args: argparse.Namespace):
    from .cluster.client import ClusterBackend
    from .cluster.security import client_context, load_secret

    return ClusterBackend(args.coordinator, retry_timeout=5.0, secret=load_secret(args.secret_file),
                          ssl=client_context(args.tls_ca_file, args.tls_cert_file, args.tls_key_file))


def _waiting(what: str, fn):
    """Run ``fn`` under a spinner with the elapsed time: restores and savepoints can take a while."""
    from rich.console import Console

    with Console(stderr=True).status(f"{what}..."):
        return fn()


def _records_table(records: list[dict], columns: list[str]):
    from rich.table import Table

    table = Table(*columns)
    for r in records:
        table.add_row(*("" if r.get(c) is None else f"{r[c]:.3f}" if isinstance(r.get(c), float) else str(r[c]) for c in columns))
    return table


def cmd_checkpoint(args: argparse.Namespace) -> None:
    from rich.console import Console

    backend = _backend(args)
    try:
        cp = backend.checkpointer
        if args.action == "trigger":
            r = _waiting("checkpointing", cp.checkpoint)
            print(f"checkpoint {r.id} completed in {r.duration:.3f}s: {r.size:,} bytes, {r.bytes_uploaded:,} uploaded")
        elif args.action == "list":
            Console().print(_records_table([r.to_dict() for r in cp.checkpoints()],
                                           ["checkpoint_id", "state", "trigger", "duration", "size", "uploaded_bytes", "failure"]))
        elif args.action == "inspect":
            meta = cp.inspect(args.id)
            print(json.dumps(meta, indent=1) if args.json else
                  f"checkpoint {meta['checkpoint_id']}: {meta['partitions']} partitions, states {sorted(meta['states'])}, "
                  f"{sum(m['data_size'] for m in meta['manifests']):,} bytes")
        elif args.action == "restore":
            r = _waiting("restoring", lambda: cp.restore(args.id))
            print(f"restored checkpoint {r.checkpoint_id}" + (f" (skipped {[s.checkpoint_id for s in r.skipped]})" if r.skipped else ""))
    finally:
        backend.close()


def cmd_savepoint(args: argparse.Namespace) -> None:
    from rich.console import Console

    backend = _backend(args)
    try:
        cp = backend.checkpointer
        if args.action == "create":
            info = _waiting(f"creating savepoint {args.name}", lambda: cp.savepoint(args.name, args.checkpoint))
            print(f"savepoint {info.name} of checkpoint {info.checkpoint_id}: {info.files} files, {info.size:,} bytes")
        elif args.action == "list":
            Console().print(_records_table([s.to_dict() for s in cp.savepoints()], ["name", "checkpoint_id", "size", "files"]))
        elif args.action == "restore":
            r = _waiting(f"restoring savepoint {args.name}", lambda: cp.restore(savepoint=args.name))
            print(f"restored savepoint {args.name} (checkpoint {r.checkpoint_id})")
    finally:
        backend.close()


def cmd_status(args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    backend = _backend(args)
    try:
        status = backend.status()
    finally:
        backend.close()
    if args.json:
        print(json.dumps(status, indent=1))
        return
    console = Console()
    console.print(f"cluster at {args.coordinator}: {status['partitions']} partitions, table epoch {status['epoch']}, "
                  f"{status['states']} states, {status['unassigned']} partitions unassigned")
    if status.get("checkpoints"):
        c = status["checkpoints"]
        console.print(f"checkpoints at {c['url']}: latest completed {c['latest']}")
    table = Table("node", "address", "status", "partitions", "last heartbeat (s ago)")
    for n in status["nodes"]:
        table.add_row(n["node_id"], n["address"], n["status"], str(n["partitions"]), f"{n['last_seen']:.1f}")
    console.print(table)
    if status.get("pipelines"):
        pipes = Table("pipeline", "last batch", "last checkpoint", "rows in", "rows out", "batch seconds", "updated")
        for r in status["pipelines"]:
            last = (r.get("batches") or [{}])[-1]
            pipes.add_row(r["query"], str(r.get("last_batch")), str(r.get("last_checkpoint")), str(last.get("rows_in")),
                          str(last.get("rows_out")), str(last.get("seconds")), time.strftime("%H:%M:%S", time.localtime(r.get("updated", 0))))
        console.print(pipes)
    if status["events"]:
        events = Table("recent events", "details")
        for e in status["events"][-10:]:
            events.add_row(e["event"], ", ".join(f"{k}={v}" for k, v in e.items() if k not in ("event", "time")))
        console.print(events)


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import main as demo

    logging.getLogger().setLevel(logging.WARNING)  # the demo shows its own progress
    sys.exit(demo(args))


def _client_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--coordinator", default="127.0.0.1:7700", help="the coordinator's host:port (default: 127.0.0.1:7700)")
    p.add_argument("--secret-file", help="file holding the cluster's shared secret (default: $ROCKSTATE_SECRET)")
    p.add_argument("--tls-ca-file", help="PEM CA bundle the coordinator's certificate must chain to (enables TLS)")
    p.add_argument("--tls-cert-file", help="PEM client certificate, when the cluster requires one")
    p.add_argument("--tls-key-file", help="PEM key of --tls-cert-file")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rockstate", description="Distributed RocksDB-backed keyed state for PySpark pipelines")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("coordinator", help="run the coordinator (membership, partition table, checkpoints)")
    _add_fields(p, CoordinatorConfig)
    p.set_defaults(func=cmd_coordinator)

    p = sub.add_parser("node", help="run a node that owns and serves partitions")
    _add_fields(p, NodeConfig)
    p.set_defaults(func=cmd_node)

    p = sub.add_parser("status", help="show nodes, partitions per node, the table epoch and recent events")
    _client_flags(p)
    p.add_argument("--json", action="store_true", help="print the raw status as JSON")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("checkpoint", help="trigger, list, inspect or restore the cluster's checkpoints")
    _client_flags(p)
    p.add_argument("action", choices=["trigger", "list", "inspect", "restore"])
    p.add_argument("id", nargs="?", type=int, help="checkpoint id (inspect; restore: default the latest)")
    p.add_argument("--json", action="store_true", help="inspect: print the raw _metadata")
    p.set_defaults(func=cmd_checkpoint)

    p = sub.add_parser("savepoint", help="create, list or restore savepoints (self-contained copies of a checkpoint)")
    _client_flags(p)
    p.add_argument("action", choices=["create", "list", "restore"])
    p.add_argument("name", nargs="?", help="the savepoint's name (create, restore)")
    p.add_argument("--checkpoint", type=int, default=None, help="create: from this checkpoint (default: take a new one)")
    p.set_defaults(func=cmd_savepoint)

    p = sub.add_parser("demo", help="a CDC pipeline on PySpark through a node failure and a join, verified end to end")
    from .demo import add_arguments

    add_arguments(p)
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        args.func(args)
    except RockstateError as e:
        print(f"rockstate: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
