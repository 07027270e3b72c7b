"""The project's exception hierarchy.

Every error carries a `retriable` flag (as aiokafka's errors do) so callers can decide
between retrying with backoff and failing the query, without matching on message text.
Third-party errors (etcd, fsspec/botocore, gRPC) are translated into these classes at the
boundary and chained with ``raise ... from``.
"""

from __future__ import annotations

import importlib
import re
import sys


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


class TopicDeletedError(DanubeError):
    """A topic a reader follows was deleted (its namespace-index entry is gone). Not retriable as
    such: the reader stops there until the topic is created anew (a dataset's tail says so in
    its state while its epoch keeps answering)."""


class ConfigError(DanubeError, ValueError):
    """A configuration value or option is invalid; names the option, the value and what is accepted."""


class WalUnreachableError(ConfigError):
    """A WAL directory the driver planned from does not exist where a task runs: a `file://`
    WAL root that is not a volume shared with every executor. A setting to fix, not lost data."""


class CheckpointMismatchError(DanubeError):
    """A pipeline's Spark checkpoint does not match the Delta tables it writes (deleted, replaced
    or restored from an old copy). Running on would skip or repeat rows, so the pipeline stops;
    the message names the table, the txnAppId, the checkpoint location and what to do."""


class SubscriptionBusyError(MetadataError):
    """Another live query holds the subscription's lock. Retriable: a dead holder's lock goes
    away when its etcd lease expires."""

    retriable = True


class StatusError(DanubeError):
    """Base of the errors a server answers with a gRPC status code: `status_name` is a
    `grpc.StatusCode` name, so the logic raising them needs no gRPC import. The broker's client
    errors (`broker.client_errors`) and the speed layer's (`speedlayer.errors`) derive from it and
    from the per-code classes below; each server's gRPC layer turns them into statuses."""

    status_name = "INTERNAL"


class InvalidRequestError(StatusError):
    """A malformed request: a missing or ill-formed field, an invalid name."""

    status_name = "INVALID_ARGUMENT"


class NotFoundError(StatusError):
    """A request names something the server does not have."""

    status_name = "NOT_FOUND"


class FailedPreconditionError(StatusError):
    """A well-formed request that cannot be served as things are."""

    status_name = "FAILED_PRECONDITION"


class ResourceExhaustedError(StatusError):
    """A limit is reached: a policy, a quota, a result size."""

    status_name = "RESOURCE_EXHAUSTED"


class UnimplementedError(StatusError):
    """A request the server understands but does not serve (a write to a read-only service)."""

    status_name = "UNIMPLEMENTED"


class UnavailableError(StatusError):
    """Not served here or not now; worth retrying (elsewhere, after a look-up)."""

    status_name = "UNAVAILABLE"
    retriable = True


# `module.Class: message` as Python prints an exception, e.g. in the traceback text Spark
# carries across the JVM in a StreamingQueryException.
_PRINTED_ERROR = re.compile(r"\b((?:danube_core|connectors|pipelines|broker)(?:\.\w+)+): ")


def error_type_in(text: str) -> type[DanubeError] | None:
    """The danube error class an error text (a Spark exception's message) reports, or None.

    Errors raised in Spark's Python workers reach the driver as text only; this recovers their
    class so callers decide by type (`issubclass`, `retriable`), not by matching message
    wording. The outermost (last printed) danube error wins.
    """
    for dotted in reversed(_PRINTED_ERROR.findall(text)):
        module_name, _, name = dotted.rpartition(".")
        module = sys.modules.get(module_name)
        if module is None:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
        cls = getattr(module, name, None)
        if isinstance(cls, type) and issubclass(cls, DanubeError):
            return cls
    return None
