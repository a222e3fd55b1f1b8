"""Shared-secret authentication and TLS on a real cluster (throwaway certificates made with openssl)."""

import pathlib
import subprocess

import pytest

from rockstate.cluster.client.backend import ClusterBackend
from rockstate.cluster.security import client_context, load_secret
from rockstate.errors import AuthenticationError, ConfigError, RockstateError
from rockstate.testing.cluster import gen_cluster, local_cluster

SECRET = "correct horse battery staple"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    run = lambda *args: subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=rockstate-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=127.0.0.1")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "node.pem", "-days", "1", "-extfile", "san.ext")
    return {"cert": str(d / "node.pem"), "key": str(d / "node.key"), "ca": str(d / "ca.pem")}


@gen_cluster(nodes=2, partitions=4, root="{tmp_path}", secret=SECRET, processes=True)
def test_secret_is_required_and_never_logged(cluster, tmp_path):
    with cluster.connect() as rs:  # knows the secret
        rs.value_state("guarded").put("k", 1)
        assert rs.value_state("guarded").get("k") == 1
    with pytest.raises(AuthenticationError):
        ClusterBackend(cluster.address, secret="wrong secret", timeout=5)
    with pytest.raises(AuthenticationError):
        ClusterBackend(cluster.address, secret=b"", timeout=5)
    node = cluster.nodes()[0]
    from rockstate.cluster import protocol as p
    from rockstate.rpc.client import Channel

    with pytest.raises(AuthenticationError):  # straight to a node, no secret: refused before any operation
        Channel(node.address, timeout=5).call(p.NodeStats())
    with cluster.connect() as rs:
        assert rs.value_state("guarded").get("k") == 1  # refusals did not disturb the cluster
    logs = "".join(f.read_text(errors="replace") for f in pathlib.Path(tmp_path, "logs").iterdir())
    assert "node-1" in logs and SECRET not in logs


def test_tls_with_a_secret(tmp_path, certs):
    with local_cluster(processes=True, nodes=2, partitions=4, root=str(tmp_path), secret=SECRET, tls=certs) as cluster:
        with cluster.connect() as rs:
            rs.value_state("encrypted").put_many({i: i for i in range(100)})
            cluster.add_node()  # node-to-node copies go over TLS too
            assert rs.value_state("encrypted").get_many(range(100)) == list(range(100))
        with pytest.raises(RockstateError):  # a plaintext client cannot talk to a TLS server
            ClusterBackend(cluster.address, secret=SECRET, timeout=3)
        with pytest.raises(AuthenticationError):  # TLS alone is not enough without the secret
            ClusterBackend(cluster.address, secret="nope", ssl=client_context(certs["ca"]), timeout=5)


def test_secret_sources(tmp_path, monkeypatch):
    path = tmp_path / "secret"
    path.write_text("from-file\n")
    monkeypatch.setenv("ROCKSTATE_SECRET", "from-env")
    assert load_secret(str(path)) == b"from-file"
    assert load_secret(None) == b"from-env"
    (tmp_path / "empty").write_text("")
    with pytest.raises(ConfigError, match="empty"):
        load_secret(str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_secret(str(tmp_path / "missing"))
