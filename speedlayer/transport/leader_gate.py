"""Followers answer every call with UNAVAILABLE and trailing metadata naming the leader.

Metadata keys: `retry-after-ms` (seed §9.1), `leader-id`, `leader-address` (empty while an
election is under way). Clients (workers, the admin CLI) go to `leader-address` after the hint.
`abort_with` turns any `SpeedLayerError` into its gRPC status the same way, and every refusal a
master sends carries `answered-by: speedlayer-master`, so that a client tells a master's own
UNAVAILABLE (a follower, etcd down) from gRPC's when no connection was made (`answered`).
"""

from __future__ import annotations

import grpc

from speedlayer.errors import NotLeaderError, SpeedLayerError

RETRY_AFTER = "retry-after-ms"
LEADER_ID = "leader-id"
LEADER_ADDRESS = "leader-address"
ANSWERED_BY = "answered-by"
MASTER = "speedlayer-master"


def abort_with(context: grpc.ServicerContext, error: SpeedLayerError) -> None:
    abort(context, getattr(grpc.StatusCode, error.status_name), str(error),
          ((RETRY_AFTER, str(error.retry_after_ms)), (LEADER_ID, error.leader_id or ""),
           (LEADER_ADDRESS, error.leader_address or "")) if isinstance(error, NotLeaderError) else ())


def abort(context: grpc.ServicerContext, code: grpc.StatusCode, details: str,
          metadata: tuple[tuple[str, str], ...] = ()) -> None:
    """`context.abort` with the master's mark (and `metadata`) in the trailers."""
    context.set_trailing_metadata(((ANSWERED_BY, MASTER), *metadata))
    context.abort(code, details)


def answered(error: grpc.RpcError) -> bool:
    """Whether a master sent `error` (False: gRPC's own, no master was reached)."""
    metadata = dict(error.trailing_metadata() or ()) if hasattr(error, "trailing_metadata") else {}
    return ANSWERED_BY in metadata or LEADER_ADDRESS in metadata


def leader_hint(error: grpc.RpcError) -> tuple[str | None, int]:
    """(leader address or None, retry-after ms) from a follower's UNAVAILABLE."""
    metadata = dict(error.trailing_metadata() or ()) if hasattr(error, "trailing_metadata") else {}
    address = metadata.get(LEADER_ADDRESS) or None
    try:
        retry_ms = int(metadata.get(RETRY_AFTER, "200"))
    except ValueError:
        retry_ms = 200
    return address, retry_ms
