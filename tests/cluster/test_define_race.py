"""Clients defining the same state at once: each may write as soon as its definition returns."""

import threading
import uuid

from rockstate.testing.cluster import gen_cluster


@gen_cluster(nodes=3, partitions=12)
def test_clients_defining_one_state_at_once_can_all_write_at_once(cluster):
    clients = [cluster.connect() for _ in range(8)]
    errors, start = [], threading.Barrier(len(clients))

    def define_and_write(i, rs):
        start.wait()
        try:
            rs.value_state(f"sessions-{round_}").put_many({str(uuid.UUID(int=i * 100 + k)): {"opened": "2026-11-23T12:00:00Z"}
                                                          for k in range(40)})  # every partition, every node
        except Exception as e:  # noqa: BLE001 -- asserted below
            errors.append(e)

    try:
        for round_ in range(5):
            threads = [threading.Thread(target=define_and_write, args=(i, rs)) for i, rs in enumerate(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        assert not errors, errors[:3]
    finally:
        for rs in clients:
            rs.close()
