"""A node's identity bound to its credential: a TLS client certificate naming a node (subjectAltName URI
``rockstate:node:<id>``) speaks for that node only; a message naming another node id is refused, on a real cluster."""

from __future__ import annotations

import subprocess

import pytest

from rockstate.cluster import protocol as p
from rockstate.cluster.security import client_context
from rockstate.errors import PermissionDeniedError, RockstateError
from rockstate.local.cluster import LocalCluster
from rockstate.rpc.client import Channel

SECRET = "node identity secret"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    run = lambda *args: subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=test-ca")
    for name, san in (("server", "IP:127.0.0.1"), ("node7", "IP:127.0.0.1,URI:rockstate:node:node-7")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", f"{name}.pem",
            "-days", "1", "-extfile", f"{name}.ext")
    return d


def test_a_node_id_is_refused_when_it_is_not_the_credentials(tmp_path, certs):
    tls = {"cert": str(certs / "server.pem"), "key": str(certs / "server.key"), "ca": str(certs / "ca.pem")}
    with LocalCluster(nodes=1, partitions=2, root=str(tmp_path), processes=False, secret=SECRET, tls=tls) as cluster:
        as_node7 = Channel(cluster.address, timeout=10, secret=SECRET,
                           ssl=client_context(str(certs / "ca.pem"), str(certs / "node7.pem"), str(certs / "node7.key")))
        for message in (p.Heartbeat(node_id="node-1", epoch=0), p.Leave(node_id="node-1"),
                        p.ReplicaReport(node_id="node-1", reports=[]), p.Register(address="127.0.0.1:9")):
            with pytest.raises(PermissionDeniedError, match="certificate is node 'node-7'"):
                as_node7.call(message)
        with pytest.raises(RockstateError) as own:  # its own id passes the check (and is unknown here)
            as_node7.call(p.Heartbeat(node_id="node-7", epoch=0))
        assert not isinstance(own.value, PermissionDeniedError)
        assert as_node7.call(p.GetTable())["epoch"] >= 1
        as_node7.close()
        assert [n["node_id"] for n in cluster.status()["nodes"]] == ["node-1"]  # the real node-1 is untouched
        with cluster.connect() as rs:  # a certificate without a node id (the servers' own) binds nothing
            rs.value_state("v").put("k", 1)
            assert rs.value_state("v").get("k") == 1
