"""The project's exception hierarchy.

Every error carries a `retriable` flag (as aiokafka's errors do) so callers can decide
between retrying with backoff and failing the query, without matching on message text.
Third-party errors (etcd, fsspec/botocore, gRPC) are translated into these classes at the
boundary and chained with ``raise ... from``.
"""

from __future__ import annotations


class DanubeError(Exception):
    """Base class of every danube-spark error."""

    retriable: bool = False


class CorruptFrameError(DanubeError):
    """A WAL frame or cloud object frame failed its CRC check or could not be decoded.

    The fields stay available as attributes so readers can report or skip precisely.
    """

    def __init__(self, source: str, offset: int | None, byte_pos: int, reason: str) -> None:
        self.source = source
        self.offset = offset
        self.byte_pos = byte_pos
        self.reason = reason
        where = f"offset {offset}" if offset is not None else "unknown offset"
        super().__init__(f"corrupt frame in {source} at byte {byte_pos} ({where}): {reason}")

    def __reduce__(self):  # keep the fields when pickled to/from Spark executors
        return (type(self), (self.source, self.offset, self.byte_pos, self.reason))


class PayloadDecodeError(DanubeError):
    """A bincode payload (message or checkpoint) is malformed; the message names the field/byte."""


class CheckpointError(DanubeError):
    """A `wal.ckpt` / `uploader.ckpt` file cannot be read or written; names the file."""


class InvalidTopicNameError(DanubeError, ValueError):
    """A topic name is not of the form `/{namespace}/{topic}`."""


class MetadataError(DanubeError):
    """An etcd key holds an unexpected value, or a metadata operation failed; names the key."""


class MetadataUnavailableError(MetadataError):
    """The metadata store (etcd) cannot be reached; names the endpoint. Worth retrying."""

    retriable = True


class MetadataCompactedError(MetadataError):
    """A read or watch asked for a revision etcd has compacted away; re-read the current state.

    `compacted_revision` is the oldest revision still available.
    """

    def __init__(self, message: str, compacted_revision: int) -> None:
        super().__init__(message)
        self.compacted_revision = compacted_revision


class SubscriptionLockLostError(MetadataError):
    """A query no longer holds its subscription's lock (its etcd lease was revoked or expired,
    and another query may own the subscription now). The query stops; its cursors are not
    moved, so nothing another owner committed is overwritten. Not retriable: a restart is."""


class StaleCacheError(MetadataUnavailableError):
    """A local metadata cache did not reach a revision before a deadline (watch behind or down)."""


class ObjectStoreError(DanubeError):
    """A cloud object operation failed (network, throttling, permissions). Worth retrying."""

    retriable = True


class ObjectMissingError(ObjectStoreError):
    """An object named by a descriptor does not exist; retrying will not help."""

    retriable = False


class DataLossError(DanubeError):
    """Requested offsets are gone (retention, overwritten descriptors, missing objects).

    The message names the topic, the offset range and the object involved.
    """


class ConfigError(DanubeError, ValueError):
    """A configuration value or option is invalid; names the option, the value and what is accepted."""


class WalUnreachableError(ConfigError):
    """A WAL directory the driver planned from does not exist where a task runs: a `file://`
    WAL root that is not a volume shared with every executor. A setting to fix, not lost data."""


class CheckpointMismatchError(DanubeError):
    """A pipeline's Spark checkpoint does not match the Delta tables it writes (deleted, replaced
    or restored from an old copy). Running on would skip or repeat rows, so the pipeline stops;
    the message names the table, the txnAppId, the checkpoint location and what to do."""
