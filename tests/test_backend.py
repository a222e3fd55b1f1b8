"""Both backends have everything the ``Backend`` protocol declares, which is all that ``Rockstate`` uses."""

import inspect

import pytest

import rockstate
from rockstate.errors import RockstateError
from rockstate.states import Backend, Checkpointer
from rockstate.testing.cluster import local_cluster


def declared(protocol) -> set[str]:
    return {n for n in vars(protocol) if not n.startswith("_")} | set(protocol.__annotations__)


def test_rockstate_uses_only_what_the_protocol_declares():
    source = inspect.getsource(rockstate.api)
    assert "getattr" not in source and "hasattr" not in source
    assert {"checkpointer", "stats", "subscribe", "close", "partitions"} <= declared(Backend)


def test_an_embedded_store_and_a_cluster_client_have_every_member(tmp_path):
    with rockstate.open(str(tmp_path / "orders"), partitions=4, checkpoints=f"file://{tmp_path}/chk") as rs:
        assert declared(Backend) - set(dir(rs.backend)) == set()
        assert declared(Checkpointer) - set(dir(rs.backend.checkpointer)) == set()
        with pytest.raises(RockstateError, match="events come from a cluster"):
            rs.subscribe(print)
    with local_cluster(nodes=1, partitions=2, root=str(tmp_path / "cluster"), processes=False) as cluster:
        with cluster.connect() as rs:
            assert declared(Backend) - set(dir(rs.backend)) == set()
            assert declared(Checkpointer) - set(dir(rs.backend.checkpointer)) == set()
            assert rs.restored is None
