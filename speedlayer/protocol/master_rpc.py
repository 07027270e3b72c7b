"""The gRPC protocol between the masters and their callers (workers, `ManagementClient`).

Both ends have to agree on it, so it lives here rather than in either end:

- message limits: a LoadPlan of many thousand files is larger than gRPC's 4 MiB default;
- keepalive (seed §9.2): a worker's channel pings every 15 s to detect a half-open connection,
  and the master's server must permit those pings or it closes the stream;
- the leader gate (seed §9.1): a follower answers UNAVAILABLE with trailing metadata naming the
  leader (`leader-address`, empty while an election is under way) and when to retry
  (`retry-after-ms`); every refusal a master sends carries `answered-by: speedlayer-master`, so
  a caller tells a master's own UNAVAILABLE (a follower, etcd down) from gRPC's when no
  connection was made (`answered`);
- the workers' reconnect backoff cap: a new leader counts no registered worker as lost for a
  takeover window that must outlast one reconnect wait.

The master's half of the leader gate (aborting a call with this metadata) is
`speedlayer.master.leader_gate`.
"""

from __future__ import annotations

import grpc

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MESSAGE_SIZE_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
KEEPALIVE_OPTIONS = [("grpc.keepalive_time_ms", 15_000), ("grpc.keepalive_timeout_ms", 5_000),
                     ("grpc.keepalive_permit_without_calls", 1)]
# The master's server: the limits, its own pings, and the clients' pings permitted.
MASTER_SERVER_OPTIONS = MESSAGE_SIZE_OPTIONS + KEEPALIVE_OPTIONS + [
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
]
# A worker's channel to a master: one long-lived EventStream, kept alive by pings.
WORKER_CHANNEL_OPTIONS = MESSAGE_SIZE_OPTIONS + KEEPALIVE_OPTIONS

DEFAULT_CONNECT_TIMEOUT_S = 2.0
MAX_RECONNECT_BACKOFF_S = 2.0  # a worker's longest wait before reconnecting; the takeover window allows for it

RETRY_AFTER = "retry-after-ms"
LEADER_ID = "leader-id"
LEADER_ADDRESS = "leader-address"
ANSWERED_BY = "answered-by"
MASTER = "speedlayer-master"
DEFAULT_RETRY_AFTER_MS = 200


def connect_options(connect_timeout_s: float) -> list[tuple[str, int]]:
    """gRPC channel options bounding one connection attempt by `connect_timeout_s` (gRPC's own
    minimum is 20 s: a host that accepts nothing would hold a call for that long)."""
    millis = max(1, int(connect_timeout_s * 1000))
    return [("grpc.min_reconnect_backoff_ms", millis), ("grpc.initial_reconnect_backoff_ms", millis)]


def _trailers(error: grpc.RpcError) -> dict:
    return dict(error.trailing_metadata() or ()) if hasattr(error, "trailing_metadata") else {}


def answered(error: grpc.RpcError) -> bool:
    """Whether a master sent `error` (False: gRPC's own, no master was reached)."""
    metadata = _trailers(error)
    return ANSWERED_BY in metadata or LEADER_ADDRESS in metadata


def leader_hint(error: grpc.RpcError) -> tuple[str | None, int]:
    """(leader address or None, retry-after ms) from a follower's UNAVAILABLE."""
    metadata = _trailers(error)
    address = metadata.get(LEADER_ADDRESS) or None
    try:
        retry_ms = int(metadata.get(RETRY_AFTER, str(DEFAULT_RETRY_AFTER_MS)))
    except ValueError:
        retry_ms = DEFAULT_RETRY_AFTER_MS
    return address, retry_ms
