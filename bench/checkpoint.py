"""Checkpoints of an embedded store to file:// storage: write pause, incremental upload, restore speed.

1. Write pause per partition: checkpoints taken while a writer thread keeps
   writing batches to every partition; the pause is the time each partition's
   writes are held for its sync phase (the RocksDB hard-link checkpoint).
   Goal: p99 <= 10 ms.
2. Incremental checkpoint: after a full checkpoint of the state, 5% of the
   keys get new values; the next checkpoint should upload about what changed.
   Goal: uploaded / changed <= 1.2.
3. Restore: a new, empty store restores the checkpoint from the storage
   (download + checksum + open), against a plain copy of the same files
   (shutil.copytree) in the same run. Goal: restore >= 70% of the copy's speed.

Each runs once per key kind (ints, 36-character UUID strings, (tenant id,
int) tuples), on a state of BENCH_CHECKPOINT_MB (default 64 per kind, so this
runs in a few minutes; the issue asks about 1 GB: BENCH_CHECKPOINT_MB=1000).
Values are 1 KB of random bytes (incompressible), P = BENCH_PARTITIONS (16).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))

import rockstate  # noqa: E402
from common import KEY_KINDS, key_of, make_keys, print_table  # noqa: E402
from rockstate.serde import encode_keys  # noqa: E402
from rockstate.checkpoint.restore import load_manifests, load_metadata  # noqa: E402
from rockstate.checkpoint.storage import CheckpointStorage  # noqa: E402

MB = 1 << 20
STATE_MB = int(os.environ.get("BENCH_CHECKPOINT_MB", 64))
PARTITIONS = int(os.environ.get("BENCH_PARTITIONS", 16))
VALUE_BYTES = 1000
KEYS = STATE_MB * MB // VALUE_BYTES
BATCH = 2000
CHURN = 0.05
PAUSE_CHECKPOINTS = int(os.environ.get("BENCH_PAUSE_CHECKPOINTS", 8))
REPEAT = 3
WRITE_RATE = 5000  # keys per second written during the pause measurement (~5 MB/s)


def values(n: int) -> list[bytes]:
    blob = os.urandom(n * VALUE_BYTES)
    return [blob[i * VALUE_BYTES : (i + 1) * VALUE_BYTES] for i in range(n)]


def load(state, kind: str, start: int, stop: int) -> None:
    for s in range(start, stop, BATCH):
        state.put_many(make_keys(kind, min(BATCH, stop - s), s), values(min(BATCH, stop - s)))


def settle(rs) -> None:
    """Compact the store's RocksDB so the state is in its steady shape (no pending L0 merges)."""
    rs.backend.store.db.families["bench"].compact_range(None, None)


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def pauses(storage, ids: list[int]) -> list[float]:
    out = []
    for chk in ids:
        out += [m.sync_seconds for m in load_manifests(storage, load_metadata(storage, chk)).values()]
    return out


def fsync_latency(directory: str, n: int = 50) -> list[float]:
    """ms per fsync of a fresh 4 KB file: what a RocksDB checkpoint waits for a few times (MANIFEST, CURRENT, folder)."""
    out = []
    for i in range(n):
        path = os.path.join(directory, f"fsync-probe-{i}")
        fd = os.open(path, os.O_CREAT | os.O_WRONLY)
        os.write(fd, b"x" * 4096)
        t = time.perf_counter()
        os.fsync(fd)
        out.append((time.perf_counter() - t) * 1000)
        os.close(fd)
        os.unlink(path)
    return out


def main() -> None:
    for kind in KEY_KINDS:
        run(kind)


def run(kind: str) -> None:
    root = tempfile.mkdtemp(prefix="rockstate-bench-ckpt-")
    url = f"file://{root}/storage"
    try:
        rs = rockstate.open(f"{root}/db", partitions=PARTITIONS, checkpoints=url, retained_checkpoints=100, memory_bytes=512 * MB)
        state = rs.value_state("bench")
        t = time.perf_counter()
        load(state, kind, 0, KEYS)
        settle(rs)
        load_s = time.perf_counter() - t
        full = rs.checkpoint()
        storage = CheckpointStorage(url)

        # 1. write pause under a steady write load
        stop, written = threading.Event(), [0]

        def writer() -> None:
            key, interval = KEYS, BATCH / WRITE_RATE
            nxt = time.perf_counter()
            while not stop.is_set():
                state.put_many(make_keys(kind, BATCH, key), values(BATCH))
                key += BATCH
                written[0] += BATCH
                nxt += interval
                stop.wait(max(0.0, nxt - time.perf_counter()))

        thread = threading.Thread(target=writer)
        thread.start()
        ids = []
        try:
            for _ in range(PAUSE_CHECKPOINTS):
                target = written[0] + BATCH
                while written[0] < target:  # at least one batch between two checkpoints
                    stop.wait(0.01)
                ids.append(rs.checkpoint().id)
        finally:
            stop.set()
            thread.join()
        pause_ms = [p * 1000 for p in pauses(storage, ids)]
        fsync_ms = fsync_latency(root)

        # 2. incremental checkpoint after 5% churn
        settle(rs)
        base = rs.checkpoint()
        churn_keys = [key_of(kind, i) for i in range(0, KEYS, int(1 / CHURN))]
        for s in range(0, len(churn_keys), BATCH):
            keys = churn_keys[s : s + BATCH]
            state.put_many(keys, values(len(keys)))
        changed = len(churn_keys) * VALUE_BYTES + sum(map(len, encode_keys(churn_keys)))  # values + encoded keys
        incr = rs.checkpoint()
        rs.close()

        # 3. restore (download + verify + open) vs a plain copy of the same files
        meta = load_metadata(storage, incr.id)
        files = {f.path for m in load_manifests(storage, meta).values() for f in m.files}
        restore_bytes = sum(f.size for m in load_manifests(storage, meta).values() for f in m.files)
        copies, opens, fetches, restores = [], [], [], []
        for rep in range(REPEAT):  # alternate the two, medians of each
            t = time.perf_counter()
            shutil.copytree(storage.full(""), f"{root}/plain-copy-{rep}", ignore=_only(files, storage.full("")))
            copies.append(time.perf_counter() - t)
            t = time.perf_counter()
            fresh = rockstate.open(f"{root}/restored-{rep}", partitions=PARTITIONS, checkpoints=url, memory_bytes=512 * MB)
            opens.append(time.perf_counter() - t)
            restored = fresh.restored
            assert restored.checkpoint_id == incr.id and restored.bytes_downloaded == restore_bytes
            assert fresh.value_state("bench").get(key_of(kind, KEYS - 1)) is not None
            fetches.append(restored.fetch_seconds)
            restores.append(restored.seconds)
            fresh.close()
            shutil.rmtree(f"{root}/restored-{rep}")
            shutil.rmtree(f"{root}/plain-copy-{rep}")
        copy_s, open_s = statistics.median(copies), statistics.median(opens)
        fetch_s, restore_s = statistics.median(fetches), statistics.median(restores)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    p50, p99 = statistics.median(pause_ms), percentile(pause_ms, 99)
    print(
        f"\n== {kind} keys\nstate: {KEYS:,} keys x {VALUE_BYTES} B = {STATE_MB} MB in {PARTITIONS} partitions (loaded in {load_s:.1f} s); "
        f"full checkpoint: {full.size / MB:.0f} MB uploaded in {full.duration:.2f} s"
    )
    print_table(
        f"{kind} keys: write pause per partition: {len(pause_ms)} sync phases over {len(ids)} checkpoints, writer at ~{WRITE_RATE * VALUE_BYTES / MB:.0f} MB/s",
        ["measure", "value", "goal", "ratio to goal"],
        [
            ["pause p50 (ms)", p50, "", ""],
            ["pause p99 (ms)", p99, "<= 10", p99 / 10],
            ["pause max (ms)", max(pause_ms), "", ""],
            ["this disk: fsync p50 (ms)", statistics.median(fsync_ms), "", ""],
            ["this disk: fsync p99 (ms)", percentile(fsync_ms, 99), "", ""],
        ],
    )
    print_table(
        f"{kind} keys: incremental checkpoint after {CHURN:.0%} churn ({len(churn_keys):,} keys rewritten)",
        ["measure", "MB", "ratio", "goal"],
        [
            ["state (checkpoint size)", incr.size / MB, "", ""],
            ["bytes changed", changed / MB, 1.0, ""],
            ["bytes uploaded", incr.bytes_uploaded / MB, incr.bytes_uploaded / changed, "<= 1.2"],
            ["(previous checkpoint, no churn)", base.bytes_uploaded / MB, "", ""],
        ],
    )
    mb = restore_bytes / MB
    print_table(
        f"{kind} keys: restore of {mb:.0f} MB from file:// into an empty store vs a plain copy of the same files (median of {REPEAT})",
        ["method", "seconds", "MB/s", "ratio", "goal"],
        [
            ["shutil.copytree (same files)", copy_s, mb / copy_s, 1.0, ""],
            ["restore: fetch + verify checksums", fetch_s, mb / fetch_s, copy_s / fetch_s, ">= 0.7"],
            [f"  + open {PARTITIONS} RocksDB instances", restore_s, mb / restore_s, copy_s / restore_s, ""],
            ["rockstate.open() with auto-restore", open_s, mb / open_s, copy_s / open_s, ""],
        ],
    )


def _only(keep: set[str], base: str):
    """copytree ``ignore``: copy only the files of one checkpoint."""

    def ignore(directory: str, names: list[str]) -> list[str]:
        rel = os.path.relpath(directory, base)
        rel = "" if rel == "." else rel + "/"
        out = []
        for n in names:
            path = rel + n
            if os.path.isdir(os.path.join(directory, n)):
                if not any(k.startswith(path + "/") for k in keep):
                    out.append(n)
            elif path not in keep:
                out.append(n)
        return out

    return ignore


if __name__ == "__main__":
    main()
