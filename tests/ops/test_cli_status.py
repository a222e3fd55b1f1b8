"""The CLI as issue 31 asks (real processes, the CLI run as a subprocess): status answers first with exit codes
scripts can use, global options anywhere, every flag from ROCKSTATE_<NAME> per command, states/get/scan that
define nothing, piped tables that never wrap, and a node that says why it cannot reach its coordinator."""

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from rockstate import LocalCluster
from rockstate.local.cluster import wait_until

COMMAND = [sys.executable, "-m", "rockstate.cli"]
OPERATIONS = pathlib.Path(__file__).parents[2] / "docs" / "operations.md"


def run(*args: str, env: dict | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
    """``rockstate ARGS`` in a subprocess whose stdout is a pipe; no ROCKSTATE_* of this process leaks in."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ROCKSTATE_") and k != "COLUMNS"}
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=timeout, env={**base, **(env or {})})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens on it once closed


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-status")
    with LocalCluster(nodes=2, partitions=8, processes=True, root=str(root), checkpoints=f"file://{root}/checkpoints") as c:
        with c.connect() as rs:
            rs.value_state("orders").put_many({f"order-{i:03d}": {"amount": i} for i in range(40)})
            rs.value_state("counts").put_many({i: i * i for i in range(10)})
            rs.map_state("q1.dedupe.seen").put(("user-1", 7), "page", 3)
            rs.list_state("history").extend("user-1", ["a", "b"])
        yield c


# -- status: the verdict first -------------------------------------------------------------------------------------


def test_healthy_status_is_a_screenful_with_exit_0(cluster):
    result = run("status", "--coordinator", cluster.address)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"cluster at {cluster.address}: HEALTHY"
    out = " ".join(result.stdout.split())
    for says in ("nodes 2 alive", "every partition has a live owner", "every backup in sync", "moves none in flight",
                 "none completed yet", f"leader {cluster.address} (a single coordinator)", "states 4"):
        assert says in out, result.stdout
    assert len(lines) <= 25, result.stdout  # one screen: no partition rows, no events unless asked
    assert "replica_copied" not in result.stdout
    print(result.stdout)


def test_details_behind_flags(cluster):
    partitions = run("status", "--partitions", "--coordinator", cluster.address)
    assert partitions.returncode == 0
    rows = [line.split() for line in partitions.stdout.splitlines()]
    assert sum(1 for r in rows if r and r[0].isdigit() and r[-1] == "ok") == 8, partitions.stdout
    events = run("status", "--events", "--type", "member_joined", "--coordinator", cluster.address)
    assert events.returncode == 0 and "events (2 of 2 of type member_joined)" in events.stdout, events.stdout
    assert "member_joined" in events.stdout and "replica_copied" not in events.stdout
    doc = json.loads(run("status", "--type", "member_joined,replica_copied", "--output", "json", "--coordinator", cluster.address).stdout)
    assert doc["health"]["verdict"] == "healthy" and doc["health"]["exit_code"] == 0
    assert {e["event"] for e in doc["events"]} <= {"member_joined", "replica_copied"} and doc["events"]


def test_output_plain_and_piped_tables_never_wrap(cluster):
    table = run("status", "--coordinator", cluster.address)  # stdout is a pipe, no COLUMNS: as wide as the rows are
    for node in cluster.status()["nodes"]:
        assert any(node["node_id"] in line and node["address"] in line and "alive" in line for line in table.stdout.splitlines())
    narrow = run("status", "--coordinator", cluster.address, env={"COLUMNS": "60"})  # COLUMNS still names a width
    assert max(map(len, narrow.stdout.splitlines())) <= 60, narrow.stdout
    plain = run("status", "--output", "plain", "--coordinator", cluster.address)
    assert "verdict\thealthy" in plain.stdout.splitlines()
    assert "node\taddress\tstatus\tparts\tmemory\tdisk\tseen" in plain.stdout.splitlines()
    states = run("states", "-o", "plain", "--coordinator", cluster.address)
    assert "q1.dedupe.seen\tmap\t\t1\t" in states.stdout and "\tq1\tdedupe" in states.stdout, states.stdout


def test_watch_shows_it_again_until_interrupted(cluster):
    proc = subprocess.Popen([*COMMAND, "status", "--watch", "0.5", "--coordinator", cluster.address], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    header, lines = f"cluster at {cluster.address}: HEALTHY", []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # line by line, as printed
    reader.start()
    try:
        wait_until(lambda: sum(header in line for line in list(lines)) >= 2, 60, "status shown twice")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        reader.join(30)
    assert proc.returncode == 0, proc.stderr.read()
    assert sum(header in line for line in lines) >= 2, lines


def test_a_dead_node_makes_it_degraded_and_a_dead_coordinator_unavailable(tmp_path):
    with LocalCluster(nodes=2, partitions=8, processes=True, heartbeat_timeout=2.0, root=str(tmp_path)) as c:
        victim = c.nodes()[0].node_id
        c.kill_node(victim)
        wait_until(lambda: any(n["status"] == "dead" for n in c.status()["nodes"]), 30, "the node to be declared dead")
        wait_until(lambda: c.status()["unavailable"] == 0, 30, "its partitions promoted")
        result = run("status", "--coordinator", c.address)
        print(result.stdout)
        assert result.returncode == 1, result.stdout + result.stderr
        out = " ".join(result.stdout.split())
        assert out.startswith(f"cluster at {c.address}: DEGRADED: 8 partitions short of in-sync backups")
        assert f"1 alive, 1 dead ({victim})" in out and "every partition has a live owner" in out
        assert _summary(result.stdout.replace(c.address, "10.0.0.1:7700")) == _summary(documented_status()), "docs/operations.md quotes it"
        doc = json.loads(run("status", "--json", "--coordinator", c.address).stdout)
        assert doc["health"]["verdict"] == "degraded" and len(doc["health"]["short_of_in_sync_backups"]) == 8
        c.kill_coordinator()
        result = run("status", "--coordinator", c.address)
        assert result.returncode == 2 and "UNAVAILABLE" in result.stdout and "rockstate: error:" in result.stderr
        assert json.loads(run("status", "-o", "json", "--coordinator", c.address).stdout)["health"]["verdict"] == "unavailable"


def documented_status() -> str:
    """The output docs/operations.md quotes for a 2-node cluster with a node killed."""
    text = OPERATIONS.read_text()
    return text[text.index("$ rockstate status --coordinator 10.0.0.1:7700     # a 2-node cluster"):].split("```")[0].split("\n", 1)[1]


def _summary(out: str) -> list[str]:
    """The verdict and summary lines, with what differs from run to run (epochs, node ids) left out."""
    lines = [line.rstrip() for line in out.splitlines()]
    return [re.sub(r"node-\d+", "node-N", re.sub(r"epoch \d+", "epoch N", line)) for line in lines[:lines.index("") if "" in lines else 9]]


def test_no_live_owner_is_unavailable(tmp_path):
    with LocalCluster(nodes=2, partitions=8, processes=True, heartbeat_timeout=2.0, root=str(tmp_path), backup_count=0) as c:
        victim = c.nodes()[0].node_id
        c.kill_node(victim)
        wait_until(lambda: c.status()["unavailable"] > 0 and any(n["status"] == "dead" for n in c.status()["nodes"]), 30, "a dead owner")
        result = run("status", "--coordinator", c.address)
        print(result.stdout)
        assert result.returncode == 2 and "partitions without a live owner" in result.stdout.splitlines()[0], result.stdout


def test_usage_errors_are_not_verdicts():
    result = run("status", "--watch", "often")
    assert result.returncode == 64 and "invalid float value" in result.stderr


# -- conventions: global options, the environment --------------------------------------------------------------------


def test_global_options_before_or_after_the_command(cluster):
    for args in (("--coordinator", cluster.address, "status"), ("status", "--coordinator", cluster.address),
                 ("-v", "--coordinator", cluster.address, "--output", "json", "states"),
                 ("--output", "json", "checkpoint", "--coordinator", cluster.address, "list")):
        result = run(*args)
        assert result.returncode == 0, (args, result.stderr)
    assert json.loads(run("--json", "--coordinator", cluster.address, "states").stdout)


def test_every_client_command_takes_its_flags_from_the_environment(cluster):
    env = {"ROCKSTATE_COORDINATOR": cluster.address}
    cases = {
        ("status",): lambda r: r.stdout.startswith(f"cluster at {cluster.address}: HEALTHY"),
        ("states",): lambda r: "orders" in r.stdout,
        ("get", "orders", "order-007"): lambda r: json.loads(r.stdout) == {"amount": 7},
        ("scan", "orders"): lambda r: "order-007" in r.stdout,
        ("checkpoint", "list"): lambda r: "id" in r.stdout.split(),
        ("savepoint", "list"): lambda r: "name" in r.stdout.split(),
    }
    for args, ok in cases.items():
        result = run(*args, env=env)
        assert result.returncode == 0 and ok(result), (args, result.stdout, result.stderr)
        wrong = run(*args, env={"ROCKSTATE_COORDINATOR": f"127.0.0.1:{closed_port()}"})  # not 127.0.0.1:7700: the variable is used
        assert wrong.returncode == 2 and "Connection refused" in wrong.stdout + wrong.stderr, (args, wrong.stderr)
    drain = run("drain", "node-99", env=env)
    assert drain.returncode == 2 and "has no node 'node-99'" in drain.stderr and "node-1" in drain.stderr
    # flags of each command, each from its variable; the command line wins
    assert json.loads(run("status", env={**env, "ROCKSTATE_OUTPUT": "json"}).stdout)["health"]["verdict"] == "healthy"
    assert "\t" in run("status", "--output", "plain", env={**env, "ROCKSTATE_OUTPUT": "json"}).stdout
    assert "partitions" in run("status", env={**env, "ROCKSTATE_PARTITIONS": "yes"}).stdout.splitlines()
    assert "partitions" not in run("status", env={**env, "ROCKSTATE_PARTITIONS": "128"}).stdout.splitlines()  # the coordinator's
    events = run("status", env={**env, "ROCKSTATE_TYPE": "member_joined"}).stdout
    assert "of type member_joined" in events
    assert len(json.loads(run("scan", "orders", "-o", "json", env={**env, "ROCKSTATE_LIMIT": "3"}).stdout)) == 3
    assert json.loads(run("get", "counts", "3", env={**env, "ROCKSTATE_KEY_TYPE": "int"}).stdout) == 9
    savepoint = run("savepoint", "create", "from-env", env={**env, "ROCKSTATE_OUTPUT": "json"})
    assert savepoint.returncode == 0 and json.loads(savepoint.stdout)["name"] == "from-env", savepoint.stderr
    trigger = run("checkpoint", "trigger", env={**env, "ROCKSTATE_JSON": "1"})
    assert trigger.returncode == 0 and json.loads(trigger.stdout)["state"] == "COMPLETED"
    restore = run("checkpoint", "restore", env={**env, "ROCKSTATE_YES": "1"})  # never confirmed by the environment
    assert restore.returncode == 2 and "give --yes" in restore.stderr


def test_the_servers_take_their_flags_from_the_environment(tmp_path):
    port = closed_port()
    started = time.monotonic()
    node = run("node", env={"ROCKSTATE_COORDINATOR": f"127.0.0.1:{port}", "ROCKSTATE_COORDINATOR_WAIT": "2",
                            "ROCKSTATE_DATA_DIR": str(tmp_path / "node"), "ROCKSTATE_PORT": "0"})
    assert node.returncode == 2 and f"127.0.0.1:{port}" in node.stderr and "--coordinator-wait 2" in node.stderr, node.stderr
    assert time.monotonic() - started < 30
    data_dir = tmp_path / "coordinator"
    proc = subprocess.Popen([*COMMAND, "coordinator"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "ROCKSTATE_DATA_DIR": str(data_dir), "ROCKSTATE_PORT": "0", "ROCKSTATE_PARTITIONS": "4"})
    try:
        address = wait_until(lambda: (data_dir / "address.json").exists() and json.loads((data_dir / "address.json").read_text()).get("address"),
                             60, "the coordinator to start in ROCKSTATE_DATA_DIR")
        doc = json.loads(run("status", "--json", env={"ROCKSTATE_COORDINATOR": address}).stdout)
        assert doc["partitions"] == 4 and doc["health"]["verdict"] == "unavailable"  # no node yet
    finally:
        proc.terminate()
        proc.wait(30)


# -- state you can find ------------------------------------------------------------------------------------------------


def test_states_get_and_scan_define_nothing(cluster):
    listed = json.loads(run("states", "--json", "--coordinator", cluster.address).stdout)
    by_name = {s["name"]: s for s in listed}
    assert set(by_name) == {"orders", "counts", "q1.dedupe.seen", "history"}
    assert by_name["orders"]["kind"] == "value" and by_name["orders"]["keys"] == 40 and by_name["orders"]["bytes"] > 0
    assert (by_name["q1.dedupe.seen"]["query"], by_name["q1.dedupe.seen"]["operator"]) == ("q1", "dedupe")
    table = run("states", "--coordinator", cluster.address).stdout
    assert any(line.split()[:2] == ["orders", "value"] for line in table.splitlines() if line.strip())

    assert json.loads(run("get", "orders", "order-012", "--coordinator", cluster.address).stdout) == {"amount": 12}
    assert json.loads(run("get", "counts", "4", "--key-type", "int", "--coordinator", cluster.address).stdout) == 16
    assert json.loads(run("get", "q1.dedupe.seen", '["user-1", 7]', "--key-type", "json", "--coordinator", cluster.address).stdout) == {"page": 3}
    assert json.loads(run("get", "history", "user-1", "--coordinator", cluster.address).stdout) == ["a", "b"]
    missing = run("get", "orders", "order-999", "--coordinator", cluster.address)
    assert missing.returncode == 1 and missing.stdout == "" and "no value for key order-999" in missing.stderr
    typo = run("get", "order", "order-012", "--coordinator", cluster.address)
    assert typo.returncode == 2 and "no state 'order'" in typo.stderr and "'orders'" in typo.stderr
    short = run("scan", "seen", "--coordinator", cluster.address)
    assert short.returncode == 2 and "'q1.dedupe.seen'" in short.stderr

    scanned = json.loads(run("scan", "orders", "--prefix", "order-01", "--limit", "0", "-o", "json", "--coordinator", cluster.address).stdout)
    assert sorted(e["key"] for e in scanned) == [f"order-{i:03d}" for i in range(10, 20)]
    assert {e["key"]: e["value"] for e in scanned}["order-013"] == {"amount": 13}
    assert len(json.loads(run("scan", "orders", "--limit", "5", "--json", "--coordinator", cluster.address).stdout)) == 5
    entries = json.loads(run("scan", "q1.dedupe.seen", "--prefix", '["user-1"]', "--key-type", "json", "--json",
                             "--coordinator", cluster.address).stdout)
    assert entries == [{"key": ["user-1", 7], "user_key": "page", "value": 3}]
    plain = run("scan", "history", "-o", "plain", "--coordinator", cluster.address).stdout.splitlines()
    assert plain == ["key\tvalue", 'user-1\t["a", "b"]']
    # nothing was defined by asking
    assert {s["name"] for s in json.loads(run("states", "--json", "--coordinator", cluster.address).stdout)} == set(by_name)


# -- the node that cannot reach its coordinator ---------------------------------------------------------------------------


def test_a_node_that_cannot_reach_its_coordinator_says_why_and_exits(tmp_path):
    port = closed_port()
    started = time.monotonic()
    result = run("node", "--coordinator", f"127.0.0.1:{port}", "--coordinator-wait", "5", "--port", "0",
                 "--data-dir", str(tmp_path / "node"))
    took = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    attempts = [line for line in result.stderr.splitlines() if f"cannot reach the coordinator at 127.0.0.1:{port}" in line]
    assert len(attempts) >= 3, result.stderr  # each failed attempt, with its reason and backoff
    assert all("Connection refused" in line and "WARNING" in line for line in attempts)
    assert "backoff" in attempts[1] and "giving up in" in attempts[0]
    assert f"node gave up reaching the coordinator at 127.0.0.1:{port}" in result.stderr.splitlines()[-1]
    assert 4 < took < 40, took
    assert not (tmp_path / "node" / "node.json").exists()  # it never joined anything


def test_flags_with_defaults_come_from_the_environment_too(monkeypatch):
    """Flags whose default is not None (the demo's) are read from ROCKSTATE_<NAME> when not given; given, they win."""
    from rockstate.cli import _resolve, build_parser

    def parse(*argv):
        parser = build_parser()
        return _resolve(parser, parser.parse_args(argv))

    monkeypatch.setenv("ROCKSTATE_NODES", "5")
    monkeypatch.setenv("ROCKSTATE_NO_FAILURE", "yes")
    demo = parse("demo")
    assert (demo.nodes, demo.no_failure, demo.events) == (5, True, 100_000)
    assert parse("demo", "--nodes", "3").nodes == 3
    monkeypatch.setenv("ROCKSTATE_COORDINATOR_WAIT", "7.5")
    assert parse("node").coordinator_wait == 7.5 and parse("node", "--coordinator-wait", "1").coordinator_wait == 1
