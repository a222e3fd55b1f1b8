"""Replicated partitions, both roles.

On each node (``partitions.NodeReplication`` composes them): ``primary.py`` (the primary's logs, acknowledgements
and waiting writes), ``sender.py`` (its sender to each backup node), ``backup.py`` (a backup applying its primary's
batches), ``copies.py`` (a new backup's copy), ``outcomes.py`` (their answers and reports, as enums).
On the coordinator: ``in_sync.py`` (the in-sync sets, carried out) and ``handover.py`` (a replicated partition's move).
Nothing here imports ``node/`` or ``coordinator/``.
"""
