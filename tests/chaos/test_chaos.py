"""The chaos run, small (``make chaos`` runs bigger ones), and its parts: the seeded schedule and the storage faults."""

import subprocess
import sys

import pytest

from rockstate.checkpoint.storage import CheckpointStorage
from rockstate.errors import CheckpointStorageError, CorruptCheckpointError
from rockstate.testing.chaos import KINDS, draw_schedule
from rockstate.testing.faults import FaultPlan, read_log


@pytest.mark.timeout(900)  # the run's own timeout: a loaded machine takes several times its ~2 minutes
def test_the_pipeline_gives_the_exact_answer_through_kills_membership_changes_and_storage_faults(capsys):
    # each process's first storage operation fails, then twice the default error rate: a checkpoint is one RocksDB
    # checkpoint per node, ~250 storage operations in this run, ~2.5 errors expected, none in about one run of 12;
    # with the default backup: the killed node's partitions are promoted, and the pipeline checkpoints every 2 batches
    result = subprocess.run([sys.executable, "-m", "rockstate.testing.chaos", "--seed", "15", "--error-rate", "0.01", "--fail-first", "1"],
                            capture_output=True, text=True, timeout=900)
    out = result.stdout
    with capsys.disabled():  # what was injected and verified belongs in the test log
        print("\n" + out[out.find("chaos seed 15") if "chaos seed 15" in out else 0:])
    assert result.returncode == 0, out[-4000:] + result.stderr[-4000:]
    for injected in ("SIGKILL coordinator", "SIGKILL node", "restarted node", "added node", "removed node", "storage error in"):
        assert injected in out
    assert "primary_promoted" in out, "the killed node stayed down long enough for its backups to be promoted"
    assert out.count(": yes") == 4 and ": NO" not in out
    assert out.rstrip().endswith("chaos: OK")


@pytest.mark.parametrize("seed", range(20))
def test_schedule_is_drawn_from_the_seed_and_keeps_two_nodes_running(seed):
    schedule = draw_schedule(seed, files=20, rounds=2)
    assert schedule == draw_schedule(seed, files=20, rounds=2)
    assert sorted(a.kind for a in schedule) == sorted(KINDS * 2)
    assert all(0 <= a.after_batch <= 18 for a in schedule), "every action lands before the last batch"
    assert [a.after_batch for a in schedule] == sorted(a.after_batch for a in schedule)
    running, killed = 3, 0
    for a in schedule:
        running += {"kill_node": -1, "remove_node": -1, "restart_node": 1, "add_node": 1}.get(a.kind, 0)
        killed += {"kill_node": 1, "restart_node": -1}.get(a.kind, 0)
        assert running >= 2 and killed >= 0


def test_injected_storage_errors_say_retry_never_corrupt(tmp_path):
    """A failing store must not look like a missing file: that would make a restore skip a good checkpoint."""
    log = str(tmp_path / "faults.jsonl")
    storage = CheckpointStorage(f"faulty::file://{tmp_path}/chk")
    storage.fs.plan = FaultPlan()
    storage.write_bytes("a/one", b"x" * 1000)
    (tmp_path / "local").write_bytes(b"y" * 5000)
    size, checksum = storage.upload(str(tmp_path / "local"), "a/two")
    storage.fs.plan = FaultPlan(seed=1, error_rate=1.0, latency_rate=1.0, latency=0.001, log=log)
    for attempt in (lambda: storage.read_bytes("a/one"), lambda: storage.write_bytes("a/three", b"z"),
                    lambda: storage.download("a/two", str(tmp_path / "back"), size, checksum),
                    lambda: storage.upload(str(tmp_path / "local"), "a/four")):
        with pytest.raises(CheckpointStorageError) as caught:
            attempt()
        assert caught.value.retryable and not isinstance(caught.value, CorruptCheckpointError)
    assert storage.list("a") == ["a/one", "a/two"], "listings slow down but do not fail"
    kinds = {(f["kind"], f["op"].split("(")[0]) for f in read_log(log)}
    assert {("error", "cat"), ("error", "open"), ("latency", "list")} <= kinds
    storage.fs.plan = FaultPlan()
    assert storage.read_bytes("a/one") == b"x" * 1000, "nothing written before the faults is lost"


def test_fault_settings_are_checked():
    with pytest.raises(ValueError, match="error_rate must be within"):
        FaultPlan(error_rate=2)
    with pytest.raises(ValueError, match="latency must be >= 0"):
        FaultPlan(latency=-1)
    with pytest.raises(ValueError, match="fail_first must be >= 0"):
        FaultPlan(fail_first=-1)


def test_fail_first_fails_a_process_s_first_operations_whatever_the_rate(tmp_path):
    storage = CheckpointStorage(f"faulty::file://{tmp_path}/chk")
    storage.fs.plan = FaultPlan(fail_first=2, log=str(tmp_path / "faults.jsonl"))
    for _ in range(2):
        with pytest.raises(CheckpointStorageError) as caught:
            storage.write_bytes("a/one", b"x")
        assert caught.value.retryable
    storage.write_bytes("a/one", b"x")  # then none: the error rate is 0
    assert storage.read_bytes("a/one") == b"x"
    assert [f["kind"] for f in read_log(str(tmp_path / "faults.jsonl"))] == ["error", "error"]
