"""The CLI as an operator uses it: --json everywhere, human sizes, 80-column tables, questions before a rollback."""

import contextlib
import inspect
import io
import json
import pathlib
import re
import subprocess

import pytest

import rockstate
from rockstate.cli import human, main, parse_size
from rockstate.cluster.client.backend import CLIENT_SETTINGS

from .test_mistakes import rockstate_cli
from rockstate.testing.cluster import local_cluster

DOCS = pathlib.Path(__file__).parents[2] / "docs"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    with local_cluster(nodes=2, partitions=8, processes=False, root=str(root), checkpoints=f"file://{root}/checkpoints",
                      coordinator_settings={"retained_checkpoints": 1}) as c:
        yield c


def cli(cluster, *args):
    """``rockstate ARGS --coordinator ...`` in this process (a subprocess costs seconds of imports); stdin is no terminal."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([*args, "--coordinator", cluster.address])
            code = 0
        except SystemExit as exit:
            code = exit.code
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def checkpoint_ids(cluster) -> list[int]:
    return [r["checkpoint_id"] for r in json.loads(cli(cluster, "checkpoint", "list", "--json").stdout)]


def test_status_before_any_checkpoint(cluster):
    out = " ".join(cli(cluster, "status").stdout.split())  # rich wraps long lines at 80 columns
    assert "none completed yet" in out and "every partition has a live owner" in out
    assert "None" not in out


def test_version():
    assert rockstate.__version__ and re.fullmatch(r"\d+\.\d+\.\d+.*", rockstate.__version__)
    result = rockstate_cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"rockstate {rockstate.__version__}"


def test_sizes_are_accepted_and_printed_as_people_write_them():
    assert parse_size("4GiB") == 4 << 30 and parse_size("512MiB") == 512 << 20 and parse_size("1000") == 1000
    assert human(1536) == "1.5 KiB" and human(4 << 30) == "4.0 GiB" and human(12) == "12 B"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit:
        main(["node", "--memory-bytes", "4 GiBs"])
    assert exit.value.code == 64 and "is not a size" in err.getvalue()  # a usage error: never 1 or 2 (status verdicts)


def test_restore_asks_first_and_refuses_without_a_yes(cluster):
    with cluster.connect() as rs:
        prices = rs.value_state("prices")
        prices.put("sku-1", {"price": "9.99"})
        chk = json.loads(cli(cluster, "checkpoint", "trigger", "--json").stdout)["checkpoint_id"]
        prices.put("sku-1", {"price": "12.50"})  # after the checkpoint: a restore would lose it
        for args in (("checkpoint", "restore"), ("checkpoint", "restore", str(chk)), ("savepoint", "restore", "nightly")):
            result = cli(cluster, *args)  # stdin is not a terminal: nobody to ask
            assert result.returncode == 2 and "give --yes" in result.stderr
        assert prices.get("sku-1") == {"price": "12.50"}  # nothing was rolled back
        result = cli(cluster, "checkpoint", "restore", str(chk), "--yes")
        assert result.returncode == 0 and f"restored checkpoint {chk}" in result.stdout
        assert prices.get("sku-1") == {"price": "9.99"}


def test_a_refused_savepoint_takes_no_checkpoint(cluster):
    assert cli(cluster, "savepoint", "create", "before-upgrade").returncode == 0
    before = checkpoint_ids(cluster)
    for name, why in (("before-upgrade", "exists already"), ("bad/name", "savepoint")):
        result = cli(cluster, "savepoint", "create", name)
        assert result.returncode == 2 and why in result.stderr
    assert checkpoint_ids(cluster) == before  # no checkpoint taken, none pushed out of retention
    listed = json.loads(cli(cluster, "savepoint", "list", "--json").stdout)
    assert [s["name"] for s in listed] == ["before-upgrade"]


def test_listings_agree_with_what_exists_and_take_json(cluster):
    cli(cluster, "checkpoint", "trigger")
    cli(cluster, "checkpoint", "trigger")  # retained_checkpoints=1: the older ones are deleted
    records = json.loads(cli(cluster, "checkpoint", "list", "--json").stdout)
    kept = [r["checkpoint_id"] for r in records if r["state"] == "COMPLETED"]
    assert len(kept) == 1 and all(r["state"] == "DELETED" for r in records if r["checkpoint_id"] != kept[0])
    for r in records:
        inspected = cli(cluster, "checkpoint", "inspect", "--json", str(r["checkpoint_id"]))  # flags before the id, too
        assert (inspected.returncode == 0) == (r["state"] == "COMPLETED"), inspected.stderr
    latest = cli(cluster, "checkpoint", "inspect")  # no id: the latest completed
    assert latest.returncode == 0 and latest.stdout.startswith(f"checkpoint {kept[0]}:")
    table = cli(cluster, "checkpoint", "list").stdout
    assert "DELETED" in table and re.search(r"\d+\.\d (KiB|MiB)", table)  # sizes for people
    status = json.loads(cli(cluster, "status", "--json").stdout)
    assert status["checkpoints"]["latest"] == kept[0] and status["unavailable"] == 0


def test_tables_fit_80_columns_with_whole_headers(cluster, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    for args, headers in ((("checkpoint", "list"), ["id", "state", "trigger", "started", "seconds", "size", "uploaded", "failure"]),
                          (("status",), ["node", "address", "status", "parts", "memory", "disk", "seen"]),
                          (("savepoint", "list"), ["name", "checkpoint", "size", "files"])):
        out = cli(cluster, *args).stdout
        assert max(map(len, out.splitlines())) <= 80, out
        assert any(line.split() == headers for line in out.splitlines()), out


def test_client_settings_are_documented():
    doc = inspect.getdoc(rockstate.connect)
    configuration = (DOCS / "configuration.md").read_text()
    for name in ("retry_timeout", "timeout", "wait", "secret", "ssl", "read_from_backup"):
        assert name in inspect.signature(rockstate.connect).parameters
        assert f"{name}: {CLIENT_SETTINGS[name]}" in doc
        assert f"| `{name}` |" in configuration
