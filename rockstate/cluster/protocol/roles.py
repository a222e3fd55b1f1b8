"""Which credential each operation needs (docs/security.md, "Roles").

``node``: what coordinators and nodes say to each other (registration, heartbeats, tables, checkpoints' barriers,
moves, replication, copies). ``client``: data, state definitions, reading the cluster's state, checkpoints and
savepoints the pipelines take. ``admin``: what rolls the cluster back or changes who is in it (restore, a node
made to leave). Reads of the cluster's state are open to every role. The server checks the caller's roles before
it dispatches (``rpc.server``); a refusal is a ``PermissionDeniedError`` and the connection keeps serving.

Every message class of ``cluster.protocol`` gets its ``roles`` here; ``tests/security/test_roles.py`` checks that
none is left without.
"""

from __future__ import annotations

from ...rpc.auth import ADMIN, CLIENT, NODE
from ...rpc.messages import Message
from . import coordinator as c
from . import data as d
from . import node as n

ANY = frozenset({NODE, CLIENT, ADMIN})
NODES = frozenset({NODE})
CLIENTS = frozenset({CLIENT, ADMIN, NODE})  # what a client may do an administrator and a node may do too
ADMINS = frozenset({ADMIN})

ROLES: dict[type[Message], frozenset[str]] = {
    # the coordinator: reading the cluster's state, defining states, pipelines' checkpoints
    c.GetTable: ANY, c.ClusterStats: ANY, c.Count: ANY, c.Status: ANY, c.Events: ANY, c.ListCheckpoints: ANY,
    c.InspectCheckpoint: ANY, c.ListSavepoints: ANY,
    c.DefineState: CLIENTS, c.PipelineProgress: CLIENTS, c.TriggerCheckpoint: CLIENTS, c.CreateSavepoint: CLIENTS,
    # the coordinator: nodes only
    c.Register: NODES, c.Heartbeat: NODES, c.ReplicaReport: NODES,
    # the coordinator: a node leaves by itself; an administrator may make one leave (drain it), undrain or remove it
    c.Leave: NODES | ADMINS, c.Undrain: ADMINS, c.RemoveMember: ADMINS,
    # the coordinator: administrators only
    c.RestoreCluster: ADMINS,
    # a node: data
    d.Write: CLIENTS, d.WriteRuns: CLIENTS, d.Read: CLIENTS, d.CompareAndSet: CLIENTS, d.Scan: CLIENTS, d.ScanMany: CLIENTS,
    d.Stage: CLIENTS, d.StageDone: CLIENTS, d.AdvanceBatches: CLIENTS, d.FinishTask: CLIENTS, d.Seal: CLIENTS,
    n.IngestChunk: CLIENTS, n.IngestSst: CLIENTS, n.IngestAbort: CLIENTS,
    # a node: from the coordinator and other nodes only
    n.NodeStats: NODES, n.NodeFigures: NODES, n.NodeIdentity: NODES, n.NodeCount: NODES, n.NodeDefineState: NODES,
    n.ApplyTable: NODES, n.SetCheckpoints: NODES, n.SnapshotPartitions: NODES, n.FinishCheckpoint: NODES, n.RestorePartitions: NODES,
    n.Freeze: NODES, n.Drain: NODES, n.Release: NODES, n.Thaw: NODES, n.Pull: NODES, n.PullDelta: NODES,
    n.PullDiscard: NODES, n.MoveCopy: NODES, n.MoveDelta: NODES, n.MoveDiscard: NODES, n.ReplicaApply: NODES,
    n.ReplicaCopy: NODES, n.ReplicaCopyGroup: NODES, n.ReplicaInline: NODES, n.ReplicaCatchUp: NODES,
    n.ReplicaPositions: NODES,
}

for _cls, _roles in ROLES.items():
    _cls.roles = _roles
