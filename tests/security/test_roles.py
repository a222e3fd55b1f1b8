"""Roles: node, client and admin credentials; both sides of a handshake prove the secret; rotation with two at once.

A real cluster (coordinator and node servers in process) configured with three secrets; calls made as a peer
that skips the client library would (raw messages), so what is refused is refused by the server.
"""

from __future__ import annotations

import socket
import threading

import pytest

from rockstate.cluster import protocol as p
from rockstate.cluster.client.backend import connect
from rockstate.cluster.security import Security
from rockstate.config import SecurityConfig
from rockstate.errors import AuthenticationError, PermissionDeniedError, RockstateError
from rockstate.local.cluster import LocalCluster
from rockstate.rpc import auth
from rockstate.rpc.client import Channel
from rockstate.rpc.frames import MAGIC, encode, read_frame_sync
from rockstate.rpc.messages import Welcome, reply

NODE_SECRET, CLIENT_SECRET, ADMIN_SECRET = "node secret 1", "client secret 1", "admin secret 1"
CLIENT_NEXT = "client secret 2 (rotation)"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("roles")
    (root / "client").write_text(f"{CLIENT_SECRET}\n{CLIENT_NEXT}\n")  # two at once: a rotation under way
    (root / "admin").write_text(ADMIN_SECRET + "\n")
    c = LocalCluster(nodes=2, partitions=4, root=str(root), processes=False, secret=NODE_SECRET, backup_count=1)
    c.security = c.security.model_copy(update={"client_secret_file": str(root / "client"), "admin_secret_file": str(root / "admin")})
    with c:
        yield c


class Raw:
    """Any wire map, sent as a message (what a peer that skips the client's checks sends)."""

    def __init__(self, **wire):
        self.wire = wire

    def to_wire(self):
        return self.wire


def test_every_message_class_declares_the_roles_it_needs():
    from rockstate.rpc.messages import _registry

    undeclared = [op for op, cls in _registry.items() if cls.__module__.startswith("rockstate.cluster.protocol") and cls.roles is None]
    assert undeclared == []
    assert p.RestoreCluster.roles == {"admin"} and p.MoveCopy.roles == {"node"} and "client" in p.Write.roles


def test_a_client_reads_and_writes_with_either_client_secret(cluster):
    for secret in (CLIENT_SECRET, CLIENT_NEXT):
        with connect(cluster.address, secret=secret) as rs:
            rs.value_state("orders").put("k", secret)
            assert rs.value_state("orders").get("k") == secret


@pytest.mark.parametrize("target, message", [
    ("coordinator", p.RestoreCluster()),
    ("coordinator", Raw(op="leave", node_id="node-1")),
    ("coordinator", p.Undrain(node_id="node-1")),
    ("coordinator", p.RemoveMember(node_id="node-1")),
    ("coordinator", Raw(op="register", address="127.0.0.1:1", node_id="node-1")),
    ("coordinator", Raw(op="heartbeat", node_id="node-1", epoch=1)),
    ("node", p.MoveCopy(partition=0)),
    ("node", Raw(op="replica_apply", items=[])),
    ("node", Raw(op="replica_copy", partitions=[0], node="node-2")),
    ("node", p.RestorePartitions(checkpoint=1, partitions=[0])),
    ("node", p.Freeze(partition=0)),
    ("node", p.NodeStats()),
    ("node", p.SetCheckpoints(checkpoints=None)),
])
def test_a_client_credential_is_refused_on_node_to_node_and_admin_operations(cluster, target, message):
    address = cluster.address if target == "coordinator" else cluster.nodes()[0].address
    channel = Channel(address, timeout=10, secret=CLIENT_SECRET)
    with pytest.raises(PermissionDeniedError, match="credential"):
        channel.call(message)
    channel.close()
    assert [n["status"] for n in cluster.status()["nodes"]] == ["alive", "alive"]  # nothing happened


def test_the_connection_keeps_serving_after_a_refusal(cluster):
    channel = Channel(cluster.address, timeout=10, secret=CLIENT_SECRET)
    with pytest.raises(PermissionDeniedError):
        channel.call(p.RestoreCluster())
    assert channel.call(p.GetTable())["epoch"] >= 1  # the same pooled connection
    channel.close()


def test_only_an_admin_may_restore_and_only_a_node_may_register(cluster):
    admin = Channel(cluster.address, timeout=10, secret=ADMIN_SECRET)
    with pytest.raises(RockstateError) as not_configured:  # allowed: it fails further on, for want of checkpoints
        admin.call(p.RestoreCluster())
    assert not isinstance(not_configured.value, PermissionDeniedError)
    with pytest.raises(PermissionDeniedError):
        admin.call(Raw(op="register", address="127.0.0.1:1"))
    admin.close()
    node = Channel(cluster.address, timeout=10, secret=NODE_SECRET)
    with pytest.raises(PermissionDeniedError):
        node.call(p.RestoreCluster())
    node.close()


def test_credentials_of_one_secret_grant_every_role_as_before():
    creds = auth.Credentials.of([b"only"])
    assert dict(creds.accepted) == {b"only": auth.ROLES}
    split = auth.Credentials.of([b"n-XYZ"], [b"c1-XYZ", b"c2-XYZ"], [b"a-XYZ"])
    assert dict(split.accepted) == {b"n-XYZ": {"node"}, b"c1-XYZ": {"client"}, b"c2-XYZ": {"client"}, b"a-XYZ": {"admin"}}
    assert "XYZ" not in repr(split) and "XYZ" not in str(split) and "4 secrets" in repr(split)
    assert dict(auth.Credentials.of([b"n"], [b"c"]).accepted) == {b"n": {"node", "admin"}, b"c": {"client"}}
    assert Security.from_config(SecurityConfig()).secret is None


def test_a_server_that_does_not_know_the_secret_is_refused_by_the_client():
    """Without TLS the server proves itself too: an impostor (or a relay that cannot answer) is refused."""
    listener = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{listener.getsockname()[1]}"

    def impostor():
        conn, _ = listener.accept()
        with conn, conn.makefile("rb") as stream:
            assert stream.read(len(MAGIC)) == MAGIC
            conn.sendall(MAGIC)
            hello = read_frame_sync(stream)
            conn.sendall(encode(reply(hello["id"], auth.new_challenge())))
            proof = read_frame_sync(stream)  # it cannot check it, and welcomes anything
            conn.sendall(encode(reply(proof["id"], Welcome(name="impostor", proof=b"\0" * 32))))
            stream.read(1)

    thread = threading.Thread(target=impostor, daemon=True)
    thread.start()
    with pytest.raises(AuthenticationError, match="server did not prove"):
        Channel(address, timeout=5, secret=CLIENT_SECRET).call(p.GetTable())
    thread.join(5)
    listener.close()
