"""What an error from the etcd client means: unreachable (retry elsewhere), compacted, or a refusal.

pyetcd re-raises gRPC's errors as its own classes inside `except`, so the status code is found on
the exception's context chain. Shared by the store (`danube_core.metadata_etcd`) and its watches
(`danube_core.etcd_watch`), which translate these into the project's `MetadataError` family.
"""

from __future__ import annotations

import grpc
import pyetcd
from pyetcd.exceptions import (
    ConnectionFailedError,
    ConnectionTimeoutError,
    NoServerAvailableError,
    RevisionCompactedError,
    WatchTimedOut,
)

UNAVAILABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
CLIENT_ERRORS = (grpc.RpcError, pyetcd.Etcd3Exception)


def grpc_error(exc: BaseException | None) -> grpc.RpcError | None:
    """The gRPC error behind `exc`: pyetcd re-raises it as its own class inside `except`."""
    while exc is not None and not isinstance(exc, grpc.RpcError):
        exc = exc.__context__
    return exc


def grpc_code(exc: BaseException | None) -> grpc.StatusCode | None:
    rpc = grpc_error(exc)
    return rpc.code() if rpc is not None and hasattr(rpc, "code") else None


def is_unavailable(exc: BaseException) -> bool:
    """True when `exc` says etcd could not be reached (another endpoint may answer)."""
    unreachable = (ConnectionFailedError, ConnectionTimeoutError, NoServerAvailableError, WatchTimedOut)
    return isinstance(exc, unreachable) or grpc_code(exc) in UNAVAILABLE_CODES


def key_target(key: str) -> str:
    """How an error message names the key a request was about."""
    return f"key {key!r}"


def describe(exc: object) -> str:
    """A one-line cause for error messages: the gRPC status and details when there are some."""
    rpc = grpc_error(exc) if isinstance(exc, BaseException) else None
    if rpc is not None and hasattr(rpc, "details"):
        return f"{rpc.code().name}: {rpc.details()}"
    return f"{type(exc).__name__}: {exc}"


def compacted_revision(exc: BaseException) -> int | None:
    """The oldest available revision if `exc` is etcd's "required revision has been compacted"."""
    if isinstance(exc, RevisionCompactedError):
        return exc.compacted_revision
    rpc = grpc_error(exc)
    details = rpc.details() if rpc is not None and hasattr(rpc, "details") else ""
    return 0 if "compacted" in (details or "") else None
