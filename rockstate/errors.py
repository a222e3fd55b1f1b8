"""Every error a rockstate user can get, under one root.

Each class has a stable wire ``code`` so a node's error is raised on the
client as the same type (see ``to_wire`` / ``from_wire``). ``retryable`` says
whether the same request may succeed if sent again later.
"""

from __future__ import annotations

from typing import Any


_BY_CODE: dict[str, type["RockstateError"]] = {}  # wire code -> class, filled as the classes are defined


class RockstateError(Exception):
    """Root of every rockstate error."""

    code = "ERROR"
    retryable = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:  # a subclass without its own code is not what a peer's code names
            taken = _BY_CODE.setdefault(cls.code, cls)
            if taken is not cls:
                raise TypeError(f"error code {cls.code!r} of {cls.__qualname__} is taken by {taken.__qualname__}")

    def __init__(self, message: str = "", **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.data = data

    def to_wire(self) -> dict:
        return {"code": self.code, "message": self.message, "data": self.data}


# -- bad input ---------------------------------------------------------------


class InvalidInputError(RockstateError):
    """The request itself is wrong; sending it again will not help."""

    code = "INVALID_INPUT"


class InvalidKeyError(InvalidInputError, TypeError):
    """A key is of a type rockstate cannot store or hash."""

    code = "INVALID_KEY"


class InvalidValueError(InvalidInputError, TypeError):
    """A value is of a type rockstate cannot encode."""

    code = "INVALID_VALUE"


class SizeLimitError(InvalidInputError, ValueError):
    """A key or value is larger than the configured limit."""

    code = "SIZE_LIMIT"


class InvalidNameError(InvalidInputError, ValueError):
    """A state or cluster name is empty, too long or holds forbidden characters."""

    code = "INVALID_NAME"


class UnsafePathError(InvalidInputError, ValueError):
    """A file name or path from outside (storage, a copy, a message) is not one safe path component or stays not inside its folder."""

    code = "UNSAFE_PATH"


class UnknownStateError(InvalidInputError, KeyError):
    """A request names a state that does not exist."""

    code = "UNKNOWN_STATE"

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.message


class StateKindError(InvalidInputError):
    """One state name used as two kinds (value, map, list) or with two TTLs."""

    code = "STATE_KIND"


class PartitionRangeError(InvalidInputError, ValueError):
    """A partition id outside 0..P-1."""

    code = "PARTITION_RANGE"


class ConfigError(InvalidInputError, ValueError):
    """A configuration value is missing or invalid."""

    code = "CONFIG"


# -- the store ---------------------------------------------------------------


class StoreError(RockstateError):
    """The local store cannot do what was asked."""

    code = "STORE"


class StoreLockedError(StoreError):
    """The store's path is already open, in this process or another one."""

    code = "STORE_LOCKED"


class StoreClosedError(StoreError):
    """The store (or client) has been closed."""

    code = "STORE_CLOSED"


class PartitionCountError(StoreError, ConfigError):
    """A store or cluster reopened with another partition count than it was created with."""

    code = "PARTITION_COUNT"


# -- the cluster -------------------------------------------------------------


class ClusterError(RockstateError):
    code = "CLUSTER"


class UnknownNodeError(ClusterError):
    """The coordinator does not know this node id (a node that gets it registers again)."""

    code = "UNKNOWN_NODE"


class MembershipChangeError(ClusterError):
    """A drain, undrain or removal the member's state does not allow (it says what to do first)."""

    code = "MEMBERSHIP_CHANGE"


class NotOwnerError(ClusterError):
    """The node does not own the partition (or the request's table epoch is stale)."""

    code = "NOT_OWNER"
    retryable = True


class PartitionUnavailableError(ClusterError):
    """The partition is moving or being restored; try again shortly."""

    code = "UNAVAILABLE"
    retryable = True


class ClusterTimeoutError(ClusterError, TimeoutError):
    """No answer within the deadline; the operation may or may not have happened."""

    code = "TIMEOUT"
    retryable = True


class ConnectionLostError(ClusterError, ConnectionError):
    """The connection to a peer failed or closed."""

    code = "CONNECTION"
    retryable = True


class ProtocolError(ClusterError):
    """A malformed frame or message."""

    code = "PROTOCOL"


class PermissionDeniedError(ClusterError):
    """The connection's credential (its role: client, node or admin) does not allow this operation; the connection stays open."""

    code = "PERMISSION_DENIED"


class ProtocolVersionError(ProtocolError):
    """The peer speaks another protocol version."""

    code = "PROTOCOL_VERSION"


class AuthenticationError(ClusterError):
    """The peer could not prove it knows the cluster secret."""

    code = "AUTH"


class UnknownOperationError(ProtocolError):
    """The peer's role has no handler for this operation."""

    code = "UNKNOWN_OP"


class FrameTruncatedError(ProtocolError, ConnectionLostError):
    """The connection closed in the middle of a frame: a bad frame and a lost connection both."""

    code = "FRAME_TRUNCATED"
    retryable = True


class NotRockstateError(ProtocolError):
    """The address answered, but not as a rockstate server (an HTTP or metrics port, another service)."""

    code = "NOT_ROCKSTATE"


class DataDirInUseError(StoreLockedError):
    """A coordinator or node was started on a data directory another live process is using."""

    code = "DATA_DIR_IN_USE"


class NodeIdInUseError(ClusterError):
    """A node registered with the id of another node that is alive at another address."""

    code = "NODE_ID_IN_USE"


class StaleEpochError(ClusterError):
    """A replication batch from a primary of an older epoch: another replica was promoted since."""

    code = "STALE_EPOCH"


class ReplicaBehindError(ClusterError):
    """A replication batch arrived past a gap: the backup must catch up from the primary first."""

    code = "REPLICA_BEHIND"


class IngestUploadError(ClusterError):
    """An uploaded SST file is missing or does not match its size and checksum; upload it again."""

    code = "INGEST_UPLOAD"
    retryable = True


class CoordinatorUnreachableError(ClusterError):
    """A node gave up reaching its coordinator (``rockstate node --coordinator-wait``)."""

    code = "COORDINATOR_UNREACHABLE"


class UnsupportedSparkError(RockstateError, ImportError):
    """The installed PySpark is outside the range rockstate's Spark operator supports (``spark/version.py``)."""

    code = "UNSUPPORTED_SPARK"


class ZooKeeperError(ClusterError):
    """ZooKeeper, the control plane's store, failed an operation."""

    code = "ZOOKEEPER"


class ZooKeeperUnavailableError(ZooKeeperError):
    """ZooKeeper did not answer in time; a write may or may not have happened (read the document again)."""

    code = "ZOOKEEPER_UNAVAILABLE"
    retryable = True


class StaleVersionError(ZooKeeperError):
    """A control-plane document changed since it was read: another coordinator wrote it."""

    code = "STALE_VERSION"


class NotLeaderError(ZooKeeperError):
    """This coordinator does not lead (it stands by, or its ZooKeeper session ended); ``data['leader']`` names who does."""

    code = "NOT_LEADER"


# -- pipelines ---------------------------------------------------------------


class UnsupportedClientError(ConfigError):
    """``client=`` is something Spark executors cannot use to reach the state (e.g. an embedded store)."""

    code = "UNSUPPORTED_CLIENT"


class UnsupportedShapeError(ConfigError):
    """The operator runs where its state cannot be kept exactly once and no weaker guarantee is offered."""

    code = "UNSUPPORTED_SHAPE"


class StateRewoundError(RockstateError):
    """A query's state is behind Spark's last committed batch (restored from an older checkpoint)."""

    code = "STATE_REWOUND"


class StateAheadError(RockstateError):
    """Spark is running a micro-batch whose state version was already applied (its checkpoint was rewound)."""

    code = "STATE_AHEAD"


class BatchAppliedError(RockstateError):
    """A task attempt staged writes for a micro-batch already applied: a late attempt of a committed batch."""

    code = "BATCH_APPLIED"


class StateSchemaError(InvalidInputError):
    """A state's schema changed in a way its stored values cannot follow (only adding a nullable field can)."""

    code = "STATE_SCHEMA"


class TimerModeError(InvalidInputError):
    """Timers or a watermark used by a processor whose operator runs with another ``time_mode``."""

    code = "TIMER_MODE"


class StageIncompleteError(RockstateError):
    """A task attempt's staged pieces are not all on a partition (it was restored or moved); the task must run again."""

    code = "STAGE_INCOMPLETE"


# -- checkpoints -------------------------------------------------------------


class CheckpointError(RockstateError):
    code = "CHECKPOINT"


class CheckpointNotFoundError(CheckpointError):
    code = "CHECKPOINT_NOT_FOUND"


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file is missing or fails its checksum."""

    code = "CHECKPOINT_CORRUPT"


class CheckpointAuthenticationError(CorruptCheckpointError):
    """A checkpoint's ``_metadata`` lacks a valid HMAC from the cluster's key (planted or altered in the storage): it is
    refused, and a restore falls back to the previous checkpoint as for a corrupt one."""

    code = "CHECKPOINT_UNAUTHENTICATED"


class CheckpointInProgressError(CheckpointError):
    code = "CHECKPOINT_IN_PROGRESS"
    retryable = True


class CheckpointStorageError(CheckpointError):
    """The checkpoint storage failed (network, permissions, disk); the operation may be retried."""

    code = "CHECKPOINT_STORAGE"
    retryable = True


class CheckpointAbortedError(CheckpointError):
    """A checkpoint was aborted (timeout, a partition failed) and its partial files removed."""

    code = "CHECKPOINT_ABORTED"
    retryable = True


class CheckpointPathError(CheckpointError, ValueError):
    """A path outside the checkpoint storage's folder (deleting it would delete more than the checkpoints)."""

    code = "CHECKPOINT_PATH"


class CheckpointsNotConfiguredError(CheckpointError, ConfigError):
    """A checkpoint operation on a store opened without checkpoint storage."""

    code = "CHECKPOINTS_NOT_CONFIGURED"


class SavepointExistsError(CheckpointError, InvalidInputError):
    """A savepoint of that name exists already; savepoints are never overwritten."""

    code = "SAVEPOINT_EXISTS"


def from_wire(payload: dict) -> RockstateError:
    """Rebuild the error a peer sent; an unknown code becomes the root type."""
    cls = _BY_CODE.get(payload.get("code", ""), RockstateError)
    err = cls.__new__(cls)
    RockstateError.__init__(err, payload.get("message", ""), **(payload.get("data") or {}))
    return err


__all__ = [name for name, obj in globals().items() if isinstance(obj, type) and issubclass(obj, RockstateError)]
__all__ += ["from_wire"]
