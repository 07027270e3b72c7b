"""Errors of the speed layer, each tied to the gRPC status code a caller receives (one per-code
class of `danube_core.errors` each, shared with the broker's client errors).

The master's logic raises these; only the master's gRPC services (through
`speedlayer.master.leader_gate`) turn them into gRPC statuses (by `status_name`, a
`grpc.StatusCode` name), so the logic needs no gRPC import.
"""

from __future__ import annotations

from danube_core import errors as status
from danube_core.errors import StatusError


class SpeedLayerError(StatusError):
    """Base: a request that cannot be served; `status_name` is a `grpc.StatusCode` name."""


class InvalidRequestError(SpeedLayerError, status.InvalidRequestError, ValueError):
    """A malformed request: a missing or ill-formed field, an unknown strategy."""


class PreconditionError(SpeedLayerError, status.FailedPreconditionError):
    """The request is well-formed but cannot be served as things are: over quota, a table
    that cannot be read faithfully (deletion vectors, column mapping), a missing table."""


class TenantIsolationError(SpeedLayerError):
    """A request or a worker reached across tenants: a source outside the tenant's roots, a
    worker reporting another tenant's epoch."""

    status_name = "PERMISSION_DENIED"


class NotFoundError(SpeedLayerError, status.NotFoundError):
    """An unknown dataset, epoch or worker (of this tenant)."""


class UnknownTenantError(NotFoundError):
    """A tenant the speed layer has nothing of: no workers, datasets or configuration (a typo,
    most likely). Other tenants are not named: see `unknown_tenant`."""


def unknown_tenant(tenant: str, check: str) -> UnknownTenantError:
    """The error for `tenant`, which the speed layer does not know. It names no other tenant: a
    caller is only as trusted as the tenant it claims (a header, a token where configured), and
    other tenants' names are not its to learn (tenants are isolated, seed §7)."""
    return UnknownTenantError(f"unknown tenant {tenant!r}: the speed layer has no workers, datasets or "
                              f"configuration for it; check {check}")


class UnsupportedSourceError(SpeedLayerError):
    """A source the seed names but this build does not serve (the OLAP source)."""

    status_name = "UNIMPLEMENTED"


class NotLeaderError(SpeedLayerError, status.UnavailableError):
    """This master is a follower (or between leaders): retry at `leader_address` after
    `retry_after_ms`."""

    def __init__(self, leader_id: str | None, leader_address: str | None, retry_after_ms: int) -> None:
        self.leader_id = leader_id
        self.leader_address = leader_address
        self.retry_after_ms = retry_after_ms
        who = f"master {leader_id} at {leader_address}" if leader_id else "no master (election under way)"
        super().__init__(f"this master is not the leader; the leader is {who}; retry after {retry_after_ms} ms")


class SourceError(SpeedLayerError, status.UnavailableError):
    """A source table could not be read (I/O, a corrupt log); worth retrying."""


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


class ResultTooLargeError(SpeedLayerError, status.ResourceExhaustedError):
    """The result passed the query's row or byte limit; ask for less (LIMIT, aggregate)."""


class GatewayStateExhaustedError(SpeedLayerError, status.ResourceExhaustedError):
    """Too many statements held for a tenant (or for all) at a gateway: prepared statements,
    results awaiting their DoGet; read or close some first."""


class UnsupportedRequestError(SpeedLayerError, status.UnimplementedError):
    """A request the speed layer does not serve (UNIMPLEMENTED)."""


class ReadOnlyError(UnsupportedRequestError):
    """A write or transaction command: the speed layer serves reads only."""


class UnsupportedCommandError(UnsupportedRequestError):
    """A Flight SQL command this server does not implement (XDBC type info, Substrait, ...)."""


class ReplicaUnavailableError(SpeedLayerError, status.UnavailableError):
    """No READY replica of the dataset's epoch could be reached; worth retrying."""


# ---- a client that reached no server (raised on the client side, never sent) -----------------


def connect_failure(details: str) -> str:
    """gRPC's text for a failed connection in a few words: refused, no answer, unknown host."""
    lowered = details.lower()
    for phrase, reason in (("connection refused", "connection refused"),
                           ("before receiving settings", "no answer"), ("timed out", "no answer"),
                           ("deadline exceeded", "no answer"),
                           ("domain name not found", "unknown host"), ("resolv", "unknown host"),
                           ("no route to host", "no route to host"),
                           ("network is unreachable", "network unreachable"),
                           ("socket closed", "connection closed"), ("connection reset", "connection reset")):
        if phrase in lowered:
            return reason
    return " ".join(details.rsplit(": ", 1)[-1].split()) or "no connection"


class UnreachableError(SpeedLayerError, status.UnavailableError):
    """No connection could be made to the server(s) a client was given; `tried` maps each
    address to gRPC's reason (a closed port, nothing answering within the connect timeout, an
    unknown host). The message names every address and what to check, on one line."""

    def __init__(self, message: str, tried: dict[str, str]) -> None:
        self.tried = dict(tried)
        super().__init__(message)


MASTERS_CHECK = ("--masters: host:port of running `python -m speedlayer master` processes "
                 "(master.host and master.port in their config, default 127.0.0.1:7700)")
GATEWAY_CHECK = ("--gateway: host:port of a running `python -m speedlayer gateway` "
                 "(gateway.host and gateway.port in its config, default 127.0.0.1:7800)")


def _tried(tried: dict[str, str]) -> str:
    return ", ".join(f"{address} ({connect_failure(why)})" for address, why in tried.items())


class MastersUnreachableError(UnreachableError):
    """None of the masters given (`--masters`) accepted a connection."""

    def __init__(self, tried: dict[str, str], connect_timeout_s: float) -> None:
        super().__init__(f"no speed layer master reachable at {_tried(tried)} (connect timeout "
                         f"{connect_timeout_s:g} s); check {MASTERS_CHECK}", tried)


class GatewayUnreachableError(UnreachableError):
    """The Data Gateway given (`--gateway`) accepted no connection: no query reached the speed
    layer, so no replica is at fault."""

    def __init__(self, address: str, why: str, connect_timeout_ms: int) -> None:
        super().__init__(f"the gateway at {address} is unreachable ({connect_failure(why)}, connect "
                         f"timeout {connect_timeout_ms} ms); check {GATEWAY_CHECK}", {address: why})


class WrongServerError(SpeedLayerError):
    """The address given answered, but without the speed layer's service there (another
    server's port: etcd's, a worker's, the gateway's given as a master's, ...)."""

    status_name = "UNIMPLEMENTED"

    def __init__(self, address: str, role: str, details: str, check: str) -> None:
        self.address = address
        said = " ".join(details.split()) or "no details"
        super().__init__(f"{address} is not a speed layer {role}: it answered UNIMPLEMENTED ({said}); check {check}")
