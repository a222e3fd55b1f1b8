"""A linearizability checker for a map of registers, over recorded client histories.

Histories are recorded by ``rockstate.testing.recording`` (re-exported here).

``check_history`` decides whether the history is linearizable for a
map of independent registers with read, write and compare-and-set. A map of
independent registers is linearizable exactly when each key's sub-history is
(linearizability is local: Herlihy & Wing; porcupine's P-compositionality), so
each key is checked alone, by the Wing & Gong search with Lowe's memoization,
as porcupine does: walk the calls and returns in time order; linearize a
pending call whenever the register allows its result and the (set of
linearized operations, register value) pair is new; meeting the return of an
operation not yet linearized means backtracking. An ``info`` operation returns
at infinity, so it may be linearized anywhere after its call or, in effect,
never.

Documented loss. When a node dies, its partitions come back from the latest
completed checkpoint, and writes to them after it are lost (README,
"Guarantees"). ``Restore`` describes one such failover. A key of a restored
partition whose history is not linearizable is checked again with the
failover in the model: ``checkpoint`` (the register's value is saved at some
instant of the checkpoint's window, or ``contents`` gives the saved value),
``die`` (the owner stops serving at some instant of the kill) and ``restore``
(the saved value comes back before ``restored``); no operation on the key
takes effect between ``die`` and ``restore``. If that explains the history,
the key's lost writes (acknowledged before the death, put after the
checkpoint by the witness linearization) are reported in
``Report.documented_loss``; otherwise the key is a violation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from .recording import CAS, READ, UNKNOWN, WRITE, Event, History, Operation, frozen

__all__ = ["CAS", "READ", "UNKNOWN", "WRITE", "Event", "History", "Operation", "Restore", "Violation",
           "DocumentedLoss", "Report", "check_operations", "check_history"]

_CHECKPOINT, _DIE, _RESTORE = "checkpoint", "die", "restore"  # the failover's own steps (see Restore)
MAX_STEPS = 5_000_000


# -- the model -----------------------------------------------------------------------
# State: (value, saved, alive). Plain registers use only ``value``; ``saved`` and
# ``alive`` model a failover (see Restore). A step returns the next state, or None
# when the operation cannot happen in this state with the result it had.


def _step(state: tuple, op: Operation) -> tuple | None:
    value, saved, alive = state
    kind = op.kind
    if kind == _CHECKPOINT:
        return (value, value, True) if alive else None
    if kind == _DIE:
        return (value, saved, False) if alive else None
    if kind == _RESTORE:
        known, contents = op.value
        return None if alive else (contents if known else saved, saved, True)
    if not alive:
        return None
    if kind == READ:
        return state if op.output is UNKNOWN or op.output == value else None
    if kind == WRITE:
        return (op.value, saved, True)
    if kind == CAS:
        expected, new = op.value
        applies = value == expected
        if op.output is not UNKNOWN and op.output != applies:
            return None
        return (new, saved, True) if applies else state
    raise ValueError(f"unknown operation kind {kind!r}")


@dataclass
class Outcome:
    linearizable: bool | None  # None: gave up after max_steps
    order: list[Operation]  # the witness, or the longest prefix found
    stuck: Operation | None = None  # the operation that could not be linearized after that prefix
    value: Any = None  # the register's value after that prefix
    depth: int = 0


def _search(ops: list[Operation], initial: tuple, max_steps: int) -> Outcome:
    """Wing & Gong / Lowe: depth-first search of linearizations, memoized on (linearized set, state)."""
    n = len(ops)
    entries = sorted([(op.call, 0, i) for i, op in enumerate(ops)] + [(op.ret, 1, i) for i, op in enumerate(ops)])
    head, end = 2 * n, 2 * n + 1
    nxt, prv = list(range(1, 2 * n + 1)) + [0, 0], [head] + list(range(0, 2 * n - 1)) + [0, 0]
    nxt[head], prv[end] = (0 if n else end), (2 * n - 1 if n else head)
    if n:
        nxt[2 * n - 1] = end
    is_call = [kind == 0 for _, kind, _ in entries]
    op_of = [i for _, _, i in entries]
    match = [0] * (2 * n)
    call_at = {}
    for e, (_, kind, i) in enumerate(entries):
        if kind == 0:
            call_at[i] = e
        else:
            match[call_at[i]] = e

    def lift(e: int) -> None:
        for x in (e, match[e]):
            nxt[prv[x]] = nxt[x]
            prv[nxt[x]] = prv[x]

    def unlift(e: int) -> None:
        for x in (match[e], e):
            prv[nxt[x]] = x
            nxt[prv[x]] = x

    state, linearized = initial, 0
    cache = {(0, initial)}
    stack: list[tuple[int, tuple]] = []
    best = Outcome(False, [], None, initial[0], -1)
    e = nxt[head]
    for _ in range(max_steps):
        if e == end:
            return Outcome(True, [ops[op_of[c]] for c, _ in stack])
        i = op_of[e]
        if is_call[e]:
            after = _step(state, ops[i])
            if after is not None:
                bits = linearized | (1 << i)
                if (bits, after) not in cache:
                    cache.add((bits, after))
                    stack.append((e, state))
                    state, linearized = after, bits
                    lift(e)
                    e = nxt[head]
                    continue
            e = nxt[e]
            continue
        if ops[i].ret == math.inf:  # every acknowledged operation is linearized; the rest need not be
            return Outcome(True, [ops[op_of[c]] for c, _ in stack])
        if len(stack) > best.depth:
            best = Outcome(False, [ops[op_of[c]] for c, _ in stack[-10:]], ops[i], state[0], len(stack))
        if not stack:
            return best
        c, state = stack.pop()
        linearized &= ~(1 << op_of[c])
        unlift(c)
        e = nxt[c]
    best.linearizable = None
    return best


# -- reports -------------------------------------------------------------------------


@dataclass(frozen=True)
class Restore:
    """A dead node's partition restored from a checkpoint: the loss the README documents.

    ``died``: (start, end) of killing the owner (it served until an instant in
    it); ``restored``: a time by which the restored copy had replaced it (when
    the ``partition_restored`` event was seen, say); ``checkpoint``: (start,
    end) of taking the checkpoint the partition came back from (its barrier
    for the partition lies in it), or ``contents``: that checkpoint's value of
    each key of the partition (a key not in it was absent). Times come from
    the history's clock.
    """

    partition: int
    died: tuple[float, float]
    restored: float
    checkpoint: tuple[float, float] | None = None
    contents: Mapping | None = None
    checkpoint_id: int | None = None

    def __post_init__(self) -> None:
        if (self.checkpoint is None) == (self.contents is None):
            raise ValueError("a Restore needs either the checkpoint's window or its contents")

    def operations(self, key: Any, first_id: int, index: int = 0) -> list[Operation]:
        """The failover's steps on ``key``, as operations the model knows (``index``: this restore's, in their list)."""
        steps = []
        if self.checkpoint is not None:
            steps.append(Operation(first_id, "failover", _CHECKPOINT, key, index, None, *self.checkpoint))
        restored = (True, frozen(self.contents.get(key))) if self.contents is not None else (False, None)
        steps.append(Operation(first_id + len(steps), "failover", _DIE, key, index, None, *self.died))
        steps.append(Operation(first_id + len(steps), "failover", _RESTORE, key, restored, None, self.died[0], self.restored))
        return steps


@dataclass
class Violation:
    """A key whose history is not linearizable (and not explained by a documented loss)."""

    key: Any
    operation: Operation | None  # the first operation no linearization could place
    linearized: list[Operation]  # the last operations of the longest linearizable prefix found
    value: Any  # the register's value after that prefix
    depth: int
    undecided: bool = False  # the search gave up after max_steps

    def __str__(self) -> str:
        if self.undecided:
            return f"key {self.key!r}: undecided after the step budget (deepest prefix {self.depth} operations)"
        before = "\n    ".join(map(str, self.linearized)) or "(nothing)"
        return (f"key {self.key!r}: after {self.depth} linearized operations, ending with\n    {before}\n"
                f"  the value is {self.value!r}, and no order can place\n    {self.operation}")


@dataclass
class DocumentedLoss:
    """A key of a restored partition whose history is linearizable once the failover is in the model."""

    key: Any
    restore: Restore
    lost: list[Operation]  # writes acknowledged before the death that the witness puts after the checkpoint

    def __str__(self) -> str:
        return (f"key {self.key!r} (partition {self.restore.partition}, checkpoint {self.restore.checkpoint_id}): "
                f"{len(self.lost)} acknowledged write(s) lost: " + ", ".join(map(str, self.lost[:5])))


@dataclass
class Report:
    keys: int = 0
    operations: int = 0
    violations: list[Violation] = field(default_factory=list)
    documented_loss: list[DocumentedLoss] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No violation (documented losses are allowed)."""
        return not self.violations

    def __str__(self) -> str:
        lines = [f"{self.operations} operations on {self.keys} keys: {len(self.violations)} violation(s), "
                 f"{len(self.documented_loss)} key(s) with the documented loss"]
        lines += [f"VIOLATION {v}" for v in self.violations] + [f"documented loss: {d}" for d in self.documented_loss]
        return "\n".join(lines)


def check_operations(ops: Iterable[Operation], initial: Any = None, restores: Iterable[Restore] = (),
                     max_steps: int = MAX_STEPS) -> Outcome:
    """Whether one key's operations are linearizable for a register starting at ``initial``."""
    ops = list(ops)
    key = ops[0].key if ops else None
    for index, r in enumerate(restores):
        ops.extend(r.operations(key, len(ops), index))
    ops = [op if op.id == i else _renumbered(op, i) for i, op in enumerate(ops)]  # ids index the bit set
    return _search(ops, (frozen(initial), frozen(initial), True), max_steps)


def _renumbered(op: Operation, i: int) -> Operation:
    return Operation(i, op.process, op.kind, op.key, op.value, op.output, op.call, op.ret, op.status)


def check_history(history: History | Iterable[Operation], *, initial: Any = None, restores: Iterable[Restore] = (),
                  partition_of: Callable[[Any], int] | None = None, max_steps: int = MAX_STEPS) -> Report:
    """Check a history of reads, writes and compare-and-sets on independent registers, key by key.

    ``restores`` (with ``partition_of``, key -> partition) are failovers: a key
    of a restored partition whose history is not linearizable as it is is
    checked again with its failovers in the model; what they explain goes to
    ``documented_loss``, the rest to ``violations``.
    """
    ops = history.operations() if isinstance(history, History) else list(history)
    restores = list(restores)
    if restores and partition_of is None:
        raise ValueError("restores need partition_of to know which keys they touched")
    by_key: dict[Any, list[Operation]] = {}
    for op in ops:
        by_key.setdefault(op.key, []).append(op)
    report = Report(keys=len(by_key), operations=len(ops))
    for key, key_ops in by_key.items():
        local = [_renumbered(op, i) for i, op in enumerate(key_ops)]
        plain = check_operations(local, initial, max_steps=max_steps)
        if plain.linearizable:
            continue
        failovers = [r for r in restores if partition_of(key) == r.partition] if restores else []
        if failovers and plain.linearizable is False:
            explained = check_operations(local, initial, failovers, max_steps)
            if explained.linearizable:
                report.documented_loss.extend(_losses(key, explained.order, failovers, key_ops))
                continue
        report.violations.append(Violation(key, plain.stuck, plain.order, plain.value, plain.depth,
                                           undecided=plain.linearizable is None))
    return report


def _losses(key: Any, order: list[Operation], failovers: list[Restore], originals: list[Operation]) -> list[DocumentedLoss]:
    """Per failover, the acknowledged writes the witness linearizes after its checkpoint and before the death."""
    out = []
    windows: dict[int, list[Operation]] = {}
    for at, op in enumerate(order):
        if op.kind == _CHECKPOINT:
            windows[op.value] = []
        elif op.kind == _DIE:
            restore = failovers[op.value]
            window = windows.pop(op.value, None)
            if window is None:  # contents only: the writes after the last one of the value that came back
                window = _since_value(order[:at], frozen((restore.contents or {}).get(key)))
            # one still in flight when the owner died may as well have come after the restore: not counted
            lost = [originals[o.id] for o in window if o.status == "ok" and o.ret <= restore.died[1]
                    and (o.kind == WRITE or (o.kind == CAS and o.output is True))]
            out.append(DocumentedLoss(key, restore, lost))
        elif op.kind in (READ, WRITE, CAS):
            for window in windows.values():
                window.append(op)
    return out


def _since_value(prefix: list[Operation], value: Any) -> list[Operation]:
    for i in range(len(prefix) - 1, -1, -1):
        op = prefix[i]
        if (op.kind == WRITE and op.value == value) or (op.kind == CAS and op.output is not False and op.value[1] == value):
            return prefix[i + 1:]
    return prefix
