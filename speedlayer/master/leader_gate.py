"""The master's half of the leader gate: refusals with the trailing metadata callers read.

Followers answer every leader-only call UNAVAILABLE naming the leader (`retry-after-ms`,
`leader-id`, `leader-address`); `abort_with` turns any `SpeedLayerError` into its gRPC status
the same way, and every refusal carries `answered-by: speedlayer-master`. The keys and the
callers' half (`answered`, `leader_hint`) are `speedlayer.protocol.master_rpc`.
"""

from __future__ import annotations

import grpc

from speedlayer.errors import NotLeaderError, SpeedLayerError
from speedlayer.protocol.master_rpc import ANSWERED_BY, LEADER_ADDRESS, LEADER_ID, MASTER, RETRY_AFTER


def abort_with(context: grpc.ServicerContext, error: SpeedLayerError) -> None:
    abort(context, getattr(grpc.StatusCode, error.status_name), str(error),
          ((RETRY_AFTER, str(error.retry_after_ms)), (LEADER_ID, error.leader_id or ""),
           (LEADER_ADDRESS, error.leader_address or "")) if isinstance(error, NotLeaderError) else ())


def abort(context: grpc.ServicerContext, code: grpc.StatusCode, details: str,
          metadata: tuple[tuple[str, str], ...] = ()) -> None:
    """`context.abort` with the master's mark (and `metadata`) in the trailers."""
    context.set_trailing_metadata(((ANSWERED_BY, MASTER), *metadata))
    context.abort(code, details)
