"""A primary's batches as stored: applied on another copy they leave the same bytes (TTL headers, appends,
prefix deletions, request ids), and the sequence number is in the same WriteBatch as the writes."""

from __future__ import annotations

from rockstate.config import StoreConfig
from rockstate.ops import APPEND, DELETE_MANY, DELETE_PREFIX, PUT, PUT_MANY
from rockstate.store import StateSpec, Store
from rockstate.store.partition import REPLICATION


def test_a_backup_applying_the_shipped_batches_holds_the_same_bytes(tmp_path):
    primary_store = Store(str(tmp_path / "primary"), StoreConfig(partitions=1))
    backup_store = Store(str(tmp_path / "backup"), StoreConfig(partitions=1))
    for store in (primary_store, backup_store):
        for spec in (StateSpec("sessions", "value", ttl=3600), StateSpec("events", "list"), StateSpec("users", "map")):
            store.define_state(spec)
    primary, backup = primary_store.partition(0), backup_store.partition(0)
    shipped = []
    primary.shipper = lambda pid, seq, stored, size: shipped.append((seq, stored))
    primary.write([(PUT_MANY, "sessions", [b"s-1", b"s-2"], [b"2026-11-23T10:00", b"2026-11-23T11:00"])], request=b"r" * 16)
    primary.write([(APPEND, "events", b"device-7", b"\x01"), (APPEND, "events", b"device-7", b"\x02")])
    primary.write([(PUT_MANY, "events", [b"device-9"], [b"\x05"]), (APPEND, "events", b"device-9", b"\x06")])
    primary.write([(PUT, "users", b"u:1:name", b"Ada"), (PUT, "users", b"u:1:mail", b"ada@example.com"),
                   (PUT, "users", b"u:2:name", b"Bob")])
    primary.write([(DELETE_PREFIX, "users", b"u:1:", None), (DELETE_MANY, "sessions", [b"s-2"], None)])
    assert primary.compare_and_set("users", b"u:2:name", b"Bob", b"Robert", request=b"c" * 16)
    assert [seq for seq, _ in shipped] == [1, 2, 3, 4, 5, 6] and primary.seq() == 6
    for seq, stored in shipped:
        backup.apply_replicated(seq, stored)
    assert backup.seq() == 6
    for state in ("sessions", "events", "users", "_requests", REPLICATION):
        assert list(backup.raw_items(state)) == list(primary.raw_items(state)), state
    assert backup.get_many("events", [b"device-7", b"device-9"]) == [b"\x01\x02", b"\x05\x06"]
    primary_store.close()
    backup_store.close()
    reopened = Store(str(tmp_path / "backup"), StoreConfig(partitions=1))
    assert reopened.partition(0).seq() == 6  # the position survives a restart: it is in the same WriteBatch
    reopened.close()


def test_a_shipped_batch_is_weighed_by_its_keys_and_values(tmp_path):
    """The sender caps each ReplicaApply by this weight. An append ships its item, not the list (the whole list
    per append made a backup behind on a long list unable to catch up: each message held few batches)."""
    from rockstate.store.writes import stored_bytes

    store = Store(str(tmp_path / "primary"), StoreConfig(partitions=1))
    store.define_state(StateSpec("journal", "list"))
    store.define_state(StateSpec("orders", "value"))
    part = store.partition(0)
    shipped = []
    part.shipper = lambda pid, seq, stored, size: shipped.append(stored)
    entry = b'{"n": 1, "at": "2026-11-23T15:00:00Z"}'
    for _ in range(500):
        part.write([(APPEND, "journal", b"writer-0", entry)])
    part.write([(PUT_MANY, "orders", [f"order-{i:06d}".encode() for i in range(100)], [b"x" * 200] * 100)])
    # its item (the sequence number is not shipped), with Python's own per op (~180 bytes) and per key or value (~48)
    assert len(entry) < stored_bytes(shipped[-2]) < len(entry) + 500
    assert 100 * (212 + 2 * 48) < stored_bytes(shipped[-1]) < 100 * (212 + 2 * 48) + 1000
    store.close()
