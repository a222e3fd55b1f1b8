"""``rockstate drain``, ``undrain`` and ``remove`` on real processes (issue 31 item 6): a drain sticks -- a later
rebalance (a node joining), the coordinator's restart and the drained node's own restart give it nothing -- until
``undrain``; ``remove`` forgets a member that is gone and holds nothing, and refuses, saying what to do first, a live
node, a drained one still running, and a dead one whose partitions nothing took over."""

from rockstate import LocalCluster
from rockstate.local.cluster import wait_until

from .test_cli_status import run

KEYS = {f"order-{i:03d}": i for i in range(200)}


def node_row(status: dict, node_id: str) -> dict | None:
    return next((n for n in status["nodes"] if n["node_id"] == node_id), None)


def holds_nothing(status: dict, node_id: str) -> bool:
    """Neither a primary nor a backup of any partition."""
    return node_row(status, node_id)["partitions"] == 0 and not any(
        b["node"] == node_id for r in status["replicas"] for b in r["backups"])


def check_drained(c: LocalCluster, node_id: str) -> dict:
    status = c.wait_replicated()
    assert node_row(status, node_id)["status"] == "drained" and holds_nothing(status, node_id), status["nodes"]
    return status


def test_a_drain_sticks_until_undrain(tmp_path):
    with LocalCluster(nodes=3, partitions=8, processes=True, root=str(tmp_path)) as c:
        with c.connect() as rs:
            rs.value_state("orders").put_many(KEYS)
        victim = c.nodes()[-1].node_id
        result = run("drain", victim, "--coordinator", c.address)
        assert result.returncode == 0 and f"drained {victim}:" in result.stdout and "undrain" in result.stdout, result.stderr
        assert any(e["event"] == "member_drained" and e["node"] == victim for e in c.status()["events"])
        check_drained(c, victim)
        summary = run("status", "--coordinator", c.address)
        assert summary.returncode == 0 and f"1 drained ({victim})" in summary.stdout, summary.stdout  # healthy: it is meant

        joined = c.add_node()  # a rebalance: the new node gets a share, the drained one none
        status = check_drained(c, victim)
        assert node_row(status, joined.node_id)["partitions"] > 0

        c.kill_coordinator()
        c.restart_coordinator()
        check_drained(c, victim)
        c.stop_node(victim)  # its own leave as it stops moves nothing
        c.restart_node(victim)
        wait_until(lambda: node_row(c.status(), victim)["last_seen"] < 1.0, 30, "the drained node heard again")
        check_drained(c, victim)

        refused = run("remove", victim, "--coordinator", c.address)
        assert refused.returncode == 2 and "drained but its process still runs" in refused.stderr, refused.stderr
        result = run("undrain", victim, "--coordinator", c.address)
        assert result.returncode == 0 and f"undrained {victim}" in result.stdout, result.stderr
        status = c.wait_replicated()
        assert node_row(status, victim)["status"] == "alive" and node_row(status, victim)["partitions"] > 0
        with c.connect() as rs:
            assert rs.value_state("orders").get_many(list(KEYS)) == list(KEYS.values())


def test_remove_forgets_a_node_that_is_gone_and_refuses_what_would_lose_data(tmp_path):
    with LocalCluster(nodes=4, partitions=8, processes=True, root=str(tmp_path / "replicated")) as c:
        with c.connect() as rs:
            rs.value_state("orders").put_many(KEYS)
        alive, killed, stopped = (n.node_id for n in c.nodes()[1:])
        refused = run("remove", alive, "--coordinator", c.address)
        assert refused.returncode == 2 and f"{alive} is alive: drain it first (rockstate drain {alive})" in refused.stderr

        c.kill_node(killed)  # its primaries are promoted on their backups, its backups rebuilt elsewhere
        wait_until(lambda: node_row(c.status(), killed)["status"] == "dead", 30, "the killed node declared dead")
        status = c.wait_replicated()
        assert holds_nothing(status, killed)
        result = run("remove", killed, "--coordinator", c.address)
        assert result.returncode == 0 and f"removed {killed} (it was dead)" in result.stdout, result.stderr

        assert run("drain", stopped, "--coordinator", c.address).returncode == 0
        c.stop_node(stopped)  # its leave says it stopped: removed at once, no timeout to wait
        result = run("remove", stopped, "--coordinator", c.address, "--json")
        assert result.returncode == 0 and '"was": "drained"' in result.stdout, result.stderr

        status = c.status()
        assert {n["node_id"] for n in status["nodes"]} == {c.nodes()[0].node_id, alive}
        assert [e["node"] for e in status["events"] if e["event"] == "member_removed"] == [killed, stopped]
        summary = run("status", "--coordinator", c.address)
        assert summary.returncode == 0 and "dead" not in summary.stdout.splitlines()[0], summary.stdout
        with c.connect() as rs:
            assert rs.value_state("orders").get_many(list(KEYS)) == list(KEYS.values())

    with LocalCluster(nodes=2, partitions=4, processes=True, root=str(tmp_path / "single"), backup_count=0) as c:
        lost = c.nodes()[-1].node_id
        c.kill_node(lost)  # no backup, no checkpoint: its partitions wait on its disk
        wait_until(lambda: node_row(c.status(), lost)["status"] == "dead", 30, "the killed node declared dead")
        refused = run("remove", lost, "--coordinator", c.address)
        assert refused.returncode == 2 and f"{lost} is dead and still holds 2 partition(s)" in refused.stderr, refused.stderr
        assert "would lose them" in refused.stderr
        assert node_row(c.status(), lost) is not None
