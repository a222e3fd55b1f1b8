"""Micro-batch versions through the routing client, across nodes and a partition move."""

from rockstate.serde import encode_value
from rockstate.runs import group_by_partition
from rockstate.states import prepare_keys
from rockstate.store import PUT_MANY
from rockstate.testing.cluster import gen_cluster


def staged_ops(backend, state, mapping):
    keys = list(mapping)
    encoded, pids = prepare_keys(keys, backend.partitions, backend.max_key_bytes)
    order, groups = group_by_partition(pids)
    idx = order.tolist()
    return {
        pid: [(PUT_MANY, state, [encoded[i] for i in idx[a:b]], [encode_value(mapping[keys[i]]) for i in idx[a:b]])]
        for pid, a, b in groups
    }


@gen_cluster(nodes=2, partitions=8)
def test_stage_seal_advance_across_nodes_and_a_move(cluster):
    with cluster.connect() as rs:
        counts = rs.value_state("counts", create=True)  # its pieces are staged raw, not written through the handle
        b = rs.backend
        for batch in range(3):
            assert set(b.advance_batches("q", batch).values()) == {None if batch == 0 else batch - 1}
            ops = staged_ops(b, "counts", {i: batch for i in range(200)})
            # attempt 1 dies after staging half; attempt 2 stages everything and is done
            half = dict(list(ops.items())[: len(ops) // 2])
            b.stage("q", batch, "op", 1, 0, {pid: [(PUT_MANY, "counts", o[0][2], [encode_value("bad")] * len(o[0][2]))] for pid, o in half.items()})
            b.stage("q", batch, "op", 2, 0, ops)
            b.stage_done("q", batch, "op", 2, dict.fromkeys(ops, 1))
            assert counts.get(0) == (None if batch == 0 else batch - 1)  # staged is invisible
            if batch == 1:
                cluster.add_node()  # stages travel with their partitions
            assert set(b.seal("q", batch, "op").values()) == {True}
        assert set(b.advance_batches("q", 3).values()) == {2}
        assert counts.get_many(range(200)) == [2] * 200
