"""The chaos run: the demo's CDC pipeline under a seeded schedule of process deaths, membership changes and storage faults.

``python -m rockstate.testing.chaos --seed 7`` (``make chaos`` runs several
seeds at a larger size, on a directory and on S3 through moto's server;
``tests/chaos`` a small one inside ``make test``).

While the exactly-once pipeline materializes the CDC stream, a chaos thread
carries out a schedule drawn from the seed — per round, in a random order:
SIGKILL of a state node and later its restart, a node added, a node removed
gracefully, and the coordinator SIGKILLed and restarted after a pause — each
a random delay after a random micro-batch. With backups (the default, one
per partition) a node's death promotes them and the pipeline checkpoints
every ``--checkpoint-every`` batches; with ``--backup-count 0`` it
checkpoints every batch and a death restores and re-runs the batch. With
``--ha`` there are three coordinators on ZooKeeper, and the one killed is the
leader (a standby takes over; the killed one comes back as a standby).
Meanwhile every checkpoint storage operation of every process may fail or
slow down (``faults.FaultyFileSystem``: ``faulty::file://...``,
``faulty::s3://...``).

It then checks the output against a fault-free reference, the same
processor over the same files on an embedded store: every micro-batch's
change rows are equal (none lost, none repeated) and the materialized table
equals the ground truth computed from the events. It prints what it
injected and what it verified; the exit code is 0 only if all of it holds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace

import pandas as pd
from rich.console import Console
from rich.table import Table

from ..demo.run import Demo, _equal
from ..demo.events import chunk
from .faults import ENV, read_log
from .moto import ENV as ENV_S3, moto_server, new_bucket

KINDS = ("kill_node", "restart_node", "add_node", "remove_node", "kill_coordinator")
WAIT = 300.0  # longest wait for the pipeline to reach an action's batch


@dataclass(frozen=True)
class Action:
    kind: str
    after_batch: int  # carried out once this micro-batch has finished...
    delay: float  # ...plus this many seconds, so it lands anywhere in the next batch
    pause: float = 0.0  # kill_coordinator: seconds before the restart


def draw_schedule(seed: int, files: int, rounds: int = 1, nodes: int = 3) -> list[Action]:
    """``rounds`` of the five kinds, in a random order where a restart follows its kill and at least two nodes always run."""
    rng = random.Random(seed)
    actions: list[Action] = []
    span = max(1, files - 2)  # actions land before the last batch, so the pipeline meets all of them
    for r in range(rounds):
        while True:
            order = rng.sample(KINDS, len(KINDS))
            if order.index("kill_node") < order.index("restart_node") and _keeps_two(order, nodes):
                break
        lo, hi = r * span // rounds, (r + 1) * span // rounds
        batches = sorted(rng.randint(lo, max(lo, hi - 1)) for _ in order)
        actions += [Action(kind, b, round(rng.uniform(0, 2.0), 2), round(rng.uniform(0.5, 3.0), 2) if kind == "kill_coordinator" else 0.0)
                    for kind, b in zip(order, batches)]
    return actions


def _keeps_two(order: list[str], running: int) -> bool:
    change = {"kill_node": -1, "remove_node": -1, "restart_node": 1, "add_node": 1}
    for kind in order:
        running += change.get(kind, 0)
        if running < 2:
            return False
    return True


def reference_changes(events: pd.DataFrame, files: int) -> list[pd.DataFrame]:
    """Each micro-batch's change rows without any fault: the same processor on an embedded store."""
    from .. import open as open_store
    from ..demo.pipeline import LatestBySeq

    with tempfile.TemporaryDirectory(prefix="rockstate-reference-") as path, open_store(path, partitions=4) as store:
        processor = LatestBySeq()
        processor.init(SimpleNamespace(value_state=lambda name: _Columns(store.value_state(name, create=True))))
        return [processor.handle_batch(chunk(events, files, i).reset_index(drop=True)) for i in range(files)]


class _Columns:
    """The column-wise value state a processor sees in Spark, over an embedded store's."""

    def __init__(self, state) -> None:
        self.state = state

    def get_many(self, keys, default=None) -> list:
        return self.state.get_many(list(keys), default)

    def put_many(self, keys, values) -> None:
        self.state.put_many(zip(list(keys), list(values)))


class ChaosRun(Demo):
    def __init__(self, args: argparse.Namespace, root: str, console: Console) -> None:
        args.storage = f"faulty::{args.storage_url or f'file://{root}/checkpoints'}"
        args.no_failure = True
        super().__init__(args, root, console)
        self.schedule = draw_schedule(args.seed, args.files, args.rounds, args.nodes)
        self.rng = random.Random(args.seed)
        self.fault_log = os.path.join(root, "storage-faults.jsonl")
        self.done_batches = -1
        self.progressed = threading.Condition()
        self.injected: list[str] = []
        self.killed: list[str] = []
        self.error: BaseException | None = None
        self.checks: list[tuple[str, bool]] = []

    def run(self) -> int:
        a = self.args
        backups = "coordinator's default" if a.backup_count is None else a.backup_count
        self.console.print(f"chaos seed {a.seed}: {len(self.schedule)} actions over {a.files} micro-batches; backups per partition: "
                           f"{backups}; checkpoints in {a.storage}, where "
                           + (f"each process's first {a.fail_first} content operation(s) fail, then " if a.fail_first else "")
                           + f"{a.error_rate:.1%} of operations fail, {a.latency_rate:.0%} wait up to {a.latency * 1000:.0f} ms")
        for action in self.schedule:
            self.console.print(f"  after batch {action.after_batch} + {action.delay:.2f}s: {action.kind}"
                               + (f" (down {action.pause:.2f}s)" if action.pause else ""))
        os.environ[ENV] = json.dumps({"seed": a.seed, "error_rate": a.error_rate, "latency_rate": a.latency_rate,
                                      "latency": a.latency, "log": self.fault_log, "fail_first": a.fail_first})
        try:
            return super().run()
        finally:
            del os.environ[ENV]

    # -- the chaos thread ------------------------------------------------------------

    def on_batch(self, batch_id: int, cluster, progress) -> None:
        with self.progressed:
            self.done_batches = max(self.done_batches, batch_id)
            self.progressed.notify_all()

    def stream(self, spark, cluster, events, progress) -> None:
        thread = threading.Thread(target=self._carry_out, args=(cluster, progress), name="chaos", daemon=True)
        thread.start()
        try:
            super().stream(spark, cluster, events, progress)
        except BaseException:
            self._print_timeline(cluster, progress)
            raise
        finally:
            thread.join(WAIT)
        if self.error is not None:
            raise self.error
        cluster.wait_balanced(120)  # and the cluster ends whole: every partition owned by a live node

    def _carry_out(self, cluster, progress) -> None:
        try:
            for action in self.schedule:
                with self.progressed:
                    if not self.progressed.wait_for(lambda: self.done_batches >= action.after_batch, WAIT):
                        raise TimeoutError(f"the pipeline did not finish batch {action.after_batch} within {WAIT:g}s")
                time.sleep(action.delay)  # the injection's timing, drawn from the seed
                what = self._act(action, cluster)
                line = f"{time.strftime('%H:%M:%S')} after batch {action.after_batch}: {what}"
                self.injected.append(line)
                progress.console.print(f"  [magenta]{line}[/]")
        except BaseException as exc:  # reported by stream(), in the main thread
            self.error = exc

    def _act(self, action: Action, cluster) -> str:
        running = sorted(n.node_id for n in cluster.nodes())
        if action.kind == "kill_node":
            victim = self.rng.choice(running)
            pid = cluster.node(victim).pid
            cluster.kill_node(victim)
            self.killed.append(victim)
            return f"SIGKILL node {victim} (pid {pid})"
        if action.kind == "restart_node":
            back = self.killed.pop(0)
            info = cluster.restart_node(back)
            return f"restarted node {back} (pid {info.pid}) with its data directory"
        if action.kind == "add_node":
            info = cluster.add_node(wait=False)
            return f"added node {info.node_id} (pid {info.pid})"
        if action.kind == "remove_node":
            leaving = self.rng.choice(running)
            started = time.monotonic()
            cluster.stop_node(leaving)
            return f"removed node {leaving} gracefully (left in {time.monotonic() - started:.1f}s)"
        index = cluster.kill_leader() if self.args.ha else (cluster.kill_coordinator(), 0)[1]
        time.sleep(action.pause)  # the coordinator stays down this long
        cluster.restart_coordinator(index)
        return f"SIGKILL {'the leading ' if self.args.ha else ''}coordinator, restarted after {action.pause:.2f}s"

    # -- what happened, and the verdict ------------------------------------------------

    def _print_timeline(self, cluster, progress) -> None:
        """A failed run names what the control plane did: the events beside the injected actions."""
        try:
            with cluster.connect() as rs:
                events = rs.backend.events()
        except Exception as exc:  # the run's own error matters more
            progress.console.print(f"(no cluster events: {exc})")
            return
        for e in events:
            if e["event"] not in ("checkpoint_completed", "checkpoint_aborted", "checkpoint_started"):
                when = time.strftime("%H:%M:%S", time.localtime(e["time"]))
                progress.console.print(f"  event {when} {e['event']} "
                                       + " ".join(f"{k}={v}" for k, v in e.items() if k not in ("event", "time", "seq")))

    def collect(self, cluster) -> None:
        with cluster.connect() as rs:  # the coordinator keeps the last 1000 events, across its restarts
            self.events = Counter(e["event"] for e in rs.backend.events())

    def verify(self, events, table, truth) -> bool:
        from ..demo.pipeline import OUTPUT_SCHEMA

        import pyarrow.dataset as ds

        columns = [c.split()[0] for c in OUTPUT_SCHEMA.split(",")]
        out = ds.dataset(self.output_dir, format="parquet", partitioning="hive").to_table().to_pandas()
        reference = reference_changes(events, self.args.files)
        wrong = []
        for i, expected in enumerate(reference):
            got = out[out.batch_id == i][columns].sort_values("id").reset_index(drop=True)
            if not _equal(got, expected[columns].sort_values("id").reset_index(drop=True)):
                wrong.append(f"batch {i}: {len(got)} rows, the reference {len(expected)}")
        faults = read_log(self.fault_log)
        errors = sum(f["kind"] == "error" for f in faults)
        self.checks = [
            (f"every scheduled action carried out ({len(self.injected)} of {len(self.schedule)})", len(self.injected) == len(self.schedule)),
            (f"storage errors were injected ({errors}) and survived", errors > 0),
            (f"each micro-batch's changes equal the fault-free reference ({sum(map(len, reference)):,} rows"
             + (f"; differ: {wrong[:5]}" if wrong else "") + ")", not wrong and out.batch_id.nunique() == len(reference)),
            (f"the materialized table equals the ground truth ({len(table):,} vs {len(truth):,} rows)", _equal(table, truth)),
        ]
        self.faults = Counter(f"{f['kind']} in {f['op'].split('(')[0]}" for f in faults)
        return all(ok for _, ok in self.checks)

    def summary(self, ok: bool) -> None:
        injected = Table("injected", title=f"chaos seed {self.args.seed}")
        for line in self.injected:
            injected.add_row(line)
        for what, n in sorted(self.faults.items()):
            injected.add_row(f"storage {what}: {n}")
        self.console.print(injected)
        seen = ", ".join(f"{name} {self.events[name]}" for name in (
            "member_dead", "primary_promoted", "promotion_failed", "partition_restored", "failover_retry", "migration_finished",
            "coordinator_resumed", "coordinator_elected", "checkpoint_completed", "checkpoint_aborted") if self.events.get(name))
        self.console.print(f"cluster events: {seen}")
        for what, passed in self.checks:
            self.console.print(f"verified: {what}: " + ("[green]yes[/]" if passed else "[bold red]NO[/]"))
        self.console.print("chaos: " + ("[bold green]OK[/]" if ok else "[bold red]FAILED[/]"))


@contextlib.contextmanager
def _s3(directory: str):
    """moto's S3 server, with the environment every process of the run finds it through."""
    with moto_server(os.path.join(directory, "moto.log")) as endpoint:
        saved = {name: os.environ.get(name) for name in [*ENV_S3, "AWS_ENDPOINT_URL"]}
        os.environ.update({**ENV_S3, "AWS_ENDPOINT_URL": endpoint})
        try:
            yield endpoint
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rockstate.testing.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, nargs="+", default=[7], help="one run per seed (default 7)")
    parser.add_argument("--events", type=int, default=8000, help="CDC events per run (default 8000)")
    parser.add_argument("--files", type=int, default=8, help="micro-batches per run (default 8)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the five actions per run (default 1)")
    parser.add_argument("--nodes", type=int, default=3, help="state nodes to start with (default 3)")
    parser.add_argument("--backup-count", type=int, default=None, help="backups per partition (default: the coordinator's, 1)")
    parser.add_argument("--checkpoint-every", type=int, default=2,
                        help="with backups, a checkpoint after every this many micro-batches (default 2; without backups: every one)")
    parser.add_argument("--error-rate", type=float, default=0.005, help="share of storage operations that fail (default 0.005)")
    parser.add_argument("--fail-first", type=int, default=0,
                        help="storage operations each process fails first, whatever --error-rate: a short run meets one for certain (default 0)")
    parser.add_argument("--latency-rate", type=float, default=0.1, help="share of storage operations slowed down (default 0.1)")
    parser.add_argument("--latency", type=float, default=0.05, help="longest injected storage latency, seconds (default 0.05)")
    parser.add_argument("--storage", choices=["file", "s3"], default="file", help="checkpoints in a directory, or in S3 (moto's server)")
    parser.add_argument("--ha", action="store_true", help="three coordinators on ZooKeeper: the leader is the one killed")
    args = parser.parse_args(argv)
    console = Console(width=160)
    failed = []
    with contextlib.ExitStack() as stack:
        s3 = stack.enter_context(_s3(stack.enter_context(tempfile.TemporaryDirectory()))) if args.storage == "s3" else None
        for seed in args.seed:
            run_args = argparse.Namespace(**{**vars(args), "seed": seed, "storage_url": s3 and f"s3://{new_bucket(s3)}/chaos"})
            with tempfile.TemporaryDirectory(prefix=f"rockstate-chaos-{seed}-") as root:
                if ChaosRun(run_args, root, console).run() != 0:
                    failed.append(seed)
    if len(args.seed) > 1:
        console.print(f"chaos: {len(args.seed) - len(failed)} of {len(args.seed)} seeds OK" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.ERROR)  # retries are counted in the summary, not logged one by one
    sys.exit(main())
