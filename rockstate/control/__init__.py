"""The cluster's control plane as pure state machines: events and times in, answers and actions out.

No I/O, no clock, no asyncio: the servers in ``cluster/`` feed them what
happened and carry out what they return, and the tests drive them by hand.

- ``ownership``: which partitions a node may serve, at which epoch, under
  its lease, and where a partition moving out of it stands (a node's view).
- ``membership``: the members the coordinator knows, their statuses and
  heartbeats (the coordinator's view).
- ``placement``: the target table of a membership, the moves that reach it,
  the failover of a dead node's partitions.
- ``move``: one partition's move between nodes, step by step, and its rollback.
- ``replica_placement``: each partition's primary and backups (zones,
  balance), and the add / promote / drop steps that reach them.
- ``in_sync``: each partition's replicas, in-sync set and epoch, as the
  coordinator decides them: catch-up, removal, promotion of a backup.
- ``write_acks``: when a replicated write is acknowledged (the primary's
  side) and which batches a backup accepts.
"""
