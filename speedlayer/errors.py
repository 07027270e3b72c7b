"""Errors of the speed layer, each tied to the gRPC status code a caller receives.

The master's logic raises these; only `speedlayer.transport` turns them into gRPC statuses (by
`status_name`, a `grpc.StatusCode` name), so the logic needs no gRPC import.
"""

from __future__ import annotations

from danube_core.errors import DanubeError


class SpeedLayerError(DanubeError):
    """Base: a request that cannot be served; `status_name` is a `grpc.StatusCode` name."""

    status_name = "INTERNAL"


class InvalidRequestError(SpeedLayerError, ValueError):
    """A malformed request: a missing or ill-formed field, an unknown strategy."""

    status_name = "INVALID_ARGUMENT"


class PreconditionError(SpeedLayerError):
    """The request is well-formed but cannot be served as things are: over quota, a table
    that cannot be read faithfully (deletion vectors, column mapping), a missing table."""

    status_name = "FAILED_PRECONDITION"


class TenantIsolationError(SpeedLayerError):
    """A request or a worker reached across tenants: a source outside the tenant's roots, a
    worker reporting another tenant's epoch."""

    status_name = "PERMISSION_DENIED"


class NotFoundError(SpeedLayerError):
    """An unknown dataset, epoch or worker (of this tenant)."""

    status_name = "NOT_FOUND"


class UnsupportedSourceError(SpeedLayerError):
    """A source the seed names but this build does not serve (the OLAP source)."""

    status_name = "UNIMPLEMENTED"


class NotLeaderError(SpeedLayerError):
    """This master is a follower (or between leaders): retry at `leader_address` after
    `retry_after_ms`."""

    status_name = "UNAVAILABLE"
    retriable = True

    def __init__(self, leader_id: str | None, leader_address: str | None, retry_after_ms: int) -> None:
        self.leader_id = leader_id
        self.leader_address = leader_address
        self.retry_after_ms = retry_after_ms
        who = f"master {leader_id} at {leader_address}" if leader_id else "no master (election under way)"
        super().__init__(f"this master is not the leader; the leader is {who}; retry after {retry_after_ms} ms")


class SourceError(SpeedLayerError):
    """A source table could not be read (I/O, a corrupt log); worth retrying."""

    status_name = "UNAVAILABLE"
    retriable = True


# ---- the query path (workers' Flight service, the Data Gateway, the query client) ----------


class InvalidQueryError(InvalidRequestError):
    """SQL that DuckDB refuses (syntax, an unknown column) or that is not one SELECT; the
    message names the dataset and epoch it was bound to."""


class UnauthenticatedError(SpeedLayerError):
    """No tenant header, or a tenant whose configured token was not presented."""

    status_name = "UNAUTHENTICATED"


class QueryTimeoutError(SpeedLayerError):
    """The query's deadline passed; it was interrupted."""

    status_name = "DEADLINE_EXCEEDED"


class QueryCancelledError(SpeedLayerError):
    """The caller went away (cancelled its call); the query was interrupted."""

    status_name = "CANCELLED"


class ResultTooLargeError(SpeedLayerError):
    """The result passed the query's row or byte limit; ask for less (LIMIT, aggregate)."""

    status_name = "RESOURCE_EXHAUSTED"


class ReplicaUnavailableError(SpeedLayerError):
    """No READY replica of the dataset's epoch could be reached; worth retrying."""

    status_name = "UNAVAILABLE"
    retriable = True
