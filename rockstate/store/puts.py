"""A request's plain puts to many partitions staged at once: the shape of a batch ``put_many``.

A 5,000-key batch at P=1024 reaches a node as ~340 pieces of ~5 keys, each one PUT_MANY. Staged one by one
(``Partition.stage``: its request id looked up, its ops turned into entries, its sequence number), each piece
cost the primary ~35 µs, most of it Python. When every piece is one PUT_MANY of a state with neither a TTL nor
list values, ``stage_puts`` does the same work for all of them at once: one multi-get of the pieces' request
ids, and the keys, the request ids and the sequence numbers put in three C loops. What each partition ships and
records is what ``Partition.stage`` would have made; any other shape goes piece by piece.
"""

from __future__ import annotations

from itertools import chain, compress, repeat
from typing import Callable, Sequence

from rocksdict import WriteBatch

from ..ops import PUT, PUT_MANY, RAW_PUT, RAW_PUT_MANY
from . import requests
from .partition import REPLICATION, SEQ, SEQ_KEY, Partition
from .writes import each, put_pieces_bytes


def stage_puts(parts: Sequence[Partition], groups: Sequence, request: bytes | None,
               batch: WriteBatch) -> tuple[list[bool], Callable[[], None]] | None:
    """``groups`` ([pid, ops] of distinct partitions, ``parts`` theirs, their locks held) into ``batch`` when each
    is one PUT_MANY of a plain state: which apply (a request id seen before leaves its piece out), and what to do
    once ``batch`` is written. None for any other shape."""
    handles: list = []
    kinds: dict[str, tuple] = {}
    for part, (_, ops) in zip(parts, groups):
        if len(ops) != 1 or ops[0][0] != PUT_MANY:
            return None
        state = ops[0][1]
        kind = kinds.get(state)
        if kind is None:  # the same for every partition of the store (one column family a state)
            kind = kinds[state] = part.state_kind(state)
            if kind[1] or kind[2]:  # a TTL, or list values
                return None
        handles.append(kind[0])
    if request is None:
        fresh = [True] * len(parts)
    else:
        seen = parts[0].family(requests.REQUESTS).get([part.prefix + request for part in parts])
        fresh = [found is None for found in seen]
        parts, groups, handles = (list(compress(x, fresh)) for x in (parts, groups, handles))
        if not parts:  # a retry that every partition applied before
            return fresh, lambda: None
    keys = [ops[0][2] for _, ops in groups]
    one_state = handles.count(handles[0]) == len(handles)
    each(batch.put, [part.prefix + key for part, piece in zip(parts, keys) for key in piece],
         chain.from_iterable(ops[0][3] for _, ops in groups),
         repeat(handles[0]) if one_state else chain.from_iterable(map(repeat, handles, map(len, keys))))
    if request is not None:
        each(batch.put, [part.prefix + request for part in parts], repeat(requests.WRITTEN),
             repeat(parts[0].state_kind(requests.REQUESTS)[0]))
    seqs = {part: part.seq() + 1 for part in parts if part.shipper is not None}  # a replicated partition's next
    if seqs:
        each(batch.put, [part.prefix + SEQ_KEY for part in seqs], map(SEQ.pack, seqs.values()),
             repeat(parts[0].state_kind(REPLICATION)[0]))
    recorded = [] if request is None else [(PUT, requests.REQUESTS, request, requests.WRITTEN)]  # as a move replays it
    shipped = [] if request is None else [(RAW_PUT, requests.REQUESTS, request, requests.WRITTEN)]  # as a backup stores it

    def written() -> None:
        sizes = put_pieces_bytes(list(map(len, keys)), chain.from_iterable(keys), chain.from_iterable(
            ops[0][3] for _, ops in groups), request, requests.WRITTEN) if seqs else repeat(None)  # C loops, not a call a piece
        for part, (_, ops), size in zip(parts, groups, sizes):
            _, state, piece_keys, piece_values = ops[0]
            part.committed([*ops, *recorded], seqs.get(part), [(RAW_PUT_MANY, state, piece_keys, piece_values), *shipped], size)
    return fresh, written
