"""Followers answer every call with UNAVAILABLE and trailing metadata naming the leader.

Metadata keys: `retry-after-ms` (seed §9.1), `leader-id`, `leader-address` (empty while an
election is under way). Clients (workers, the admin CLI) go to `leader-address` after the hint.
`abort_with` turns any `SpeedLayerError` into its gRPC status the same way.
"""

from __future__ import annotations

import grpc

from speedlayer.errors import NotLeaderError, SpeedLayerError

RETRY_AFTER = "retry-after-ms"
LEADER_ID = "leader-id"
LEADER_ADDRESS = "leader-address"


def abort_with(context: grpc.ServicerContext, error: SpeedLayerError) -> None:
    if isinstance(error, NotLeaderError):
        context.set_trailing_metadata((
            (RETRY_AFTER, str(error.retry_after_ms)),
            (LEADER_ID, error.leader_id or ""),
            (LEADER_ADDRESS, error.leader_address or ""),
        ))
    context.abort(getattr(grpc.StatusCode, error.status_name), str(error))


def leader_hint(error: grpc.RpcError) -> tuple[str | None, int]:
    """(leader address or None, retry-after ms) from a follower's UNAVAILABLE."""
    metadata = dict(error.trailing_metadata() or ()) if hasattr(error, "trailing_metadata") else {}
    address = metadata.get(LEADER_ADDRESS) or None
    try:
        retry_ms = int(metadata.get(RETRY_AFTER, "200"))
    except ValueError:
        retry_ms = 200
    return address, retry_ms
