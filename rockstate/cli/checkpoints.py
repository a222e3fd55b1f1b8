"""``rockstate checkpoint`` and ``rockstate savepoint``: trigger, list, inspect, create, restore (which asks first)."""

from __future__ import annotations

import argparse
import dataclasses
import time

from ..errors import ConfigError
from .common import Output, backend, confirm, human, output_of, print_json, waiting


def _shown_state(r: dict) -> str:
    """A completed checkpoint deleted by retention is no longer there to restore: say so."""
    return "DELETED" if r["state"] == "COMPLETED" and not r.get("retained", True) else r["state"]


def _latest(cp) -> int:
    done = [r.checkpoint_id for r in cp.checkpoints() if r.state == "COMPLETED" and r.retained]
    if not done:
        raise ConfigError("the cluster has no completed checkpoint yet: take one with `rockstate checkpoint trigger`")
    return max(done)


def cmd_checkpoint(args: argparse.Namespace) -> None:
    client = backend(args)
    try:
        cp = client.checkpointer
        if args.action == "trigger":
            r = waiting("checkpointing", cp.checkpoint)
            if output_of(args) == "json":
                return print_json(r.to_dict())
            print(f"checkpoint {r.id} completed in {r.duration:.3f}s: {human(r.size)}, {human(r.bytes_uploaded)} uploaded")
        elif args.action == "list":
            records = [{**r.to_dict(), "state": _shown_state(r.to_dict())} for r in cp.checkpoints()]
            if output_of(args) == "json":
                return print_json(records)
            Output(args).table(("id", "state", "trigger", "started", "seconds", "size", "uploaded", "failure"), [
                (r["checkpoint_id"], r["state"], r["trigger"], time.strftime("%m-%d %H:%M:%S", time.localtime(r["started_at"])),
                 "" if r["duration"] is None else f"{r['duration']:.2f}", human(r["size"]), human(r["uploaded_bytes"]), r["failure"] or "")
                for r in records])
        elif args.action == "inspect":
            meta = cp.inspect(_latest(cp) if args.id is None else args.id)
            if output_of(args) == "json":
                return print_json(meta)
            print(f"checkpoint {meta['checkpoint_id']}: {meta['partitions']} partitions, states {sorted(meta['states'])}, "
                  f"{human(sum(m['data_size'] for m in meta['manifests']))}")
        elif args.action == "restore":
            target = _latest(cp) if args.id is None else args.id
            confirm(args, f"restore the cluster to checkpoint {target}")
            r = waiting("restoring", lambda: cp.restore(target))
            if output_of(args) == "json":
                return print_json(dataclasses.asdict(r))
            print(f"restored checkpoint {r.checkpoint_id}" + (f" (skipped {[s.checkpoint_id for s in r.skipped]})" if r.skipped else ""))
    finally:
        client.close()


def cmd_savepoint(args: argparse.Namespace) -> None:
    client = backend(args)
    try:
        cp = client.checkpointer
        if args.action == "create":
            info = waiting(f"creating savepoint {args.name}", lambda: cp.savepoint(args.name, args.checkpoint))
            if output_of(args) == "json":
                return print_json(info.to_dict())
            print(f"savepoint {info.name} of checkpoint {info.checkpoint_id}: {info.files} files, {human(info.size)}")
        elif args.action == "list":
            records = [s.to_dict() for s in cp.savepoints()]
            if output_of(args) == "json":
                return print_json(records)
            Output(args).table(("name", "checkpoint", "size", "files"),
                               [(s["name"], s["checkpoint_id"], human(s["size"]), s["files"]) for s in records])
        elif args.action == "restore":
            confirm(args, f"restore the cluster to savepoint {args.name}")
            r = waiting(f"restoring savepoint {args.name}", lambda: cp.restore(savepoint=args.name))
            if output_of(args) == "json":
                return print_json(dataclasses.asdict(r))
            print(f"restored savepoint {args.name} (checkpoint {r.checkpoint_id})")
    finally:
        client.close()
