"""Prometheus metrics (seed §14) plus load times; served on `metrics_port` when configured.

Labels are bounded: tenants, datasets, statuses, outcomes and operation names, never offsets,
query texts or request ids (`worker_epoch_rows` names epochs, which the lifecycle evicts).
`deploy/grafana/speedlayer.json` and `deploy/prometheus/alerts.yml` are built on these names.

`TimedMetadataStore` wraps a `MetadataStore` so every etcd call lands in
`etcd_client_latency_seconds{op}` without the master's code timing anything itself.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from danube_core.metadata import MetadataStore

LEADER_STATUS = Gauge("master_leader_status", "1 if this master is the leader, 0 otherwise")
WORKERS_REGISTERED = Gauge("master_workers_registered_total", "Healthy workers per tenant", ["tenant"])
ASSIGNMENT_DURATION = Histogram(
    "master_data_assignment_duration_seconds", "Admission request to ASSIGNED",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
)
ADMISSIONS = Counter("master_admissions_total", "Admission requests by outcome", ["outcome"])
ETCD_LATENCY = Histogram(
    "etcd_client_latency_seconds", "Latency of etcd operations", ["op"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
LOAD_SECONDS = Histogram(
    "worker_epoch_load_seconds", "Time to load one epoch into worker memory",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
)
LOADED_ROWS = Gauge("worker_epoch_rows", "Rows of each epoch held in memory", ["dataset", "epoch"])
EPOCHS_HELD = Gauge("worker_epochs_ready", "Epochs READY on this worker")
TAIL_LAG = Gauge("worker_tail_lag_messages", "Messages on the topic the dataset's tail has not read yet", ["dataset"])
TAIL_AGE = Gauge("worker_tail_age_seconds", "Seconds since the dataset's tail last read its topic up to the head",
                 ["dataset"])
TAIL_ROWS = Gauge("worker_tail_rows", "Decoded tail rows held in memory", ["dataset"])
TAIL_HANDOVERS = Counter("worker_tail_handovers_total", "Epochs published beside a dataset's tail (hand-overs)",
                         ["dataset"])
TAIL_ERRORS = Counter("worker_tail_errors_total", "Tail reads that failed, by state", ["dataset", "state"])
EVICTIONS = Counter("master_epoch_evictions_total", "Epochs evicted by the lifecycle", ["reason"])
REFRESHES = Counter("master_refresh_epochs_total", "Epochs planned for new source versions", ["kind"])
REFRESH_LAG = Histogram(
    "master_refresh_detect_seconds", "Source commit time to the refresh epoch being planned",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
# The leader's view only: set by its reconciler on every pass, cleared when it is deposed
# (`forget_leader_view`), so a follower never reports a stale count.
EPOCHS = Gauge("master_epochs", "Epochs the leader holds, by admission status, per tenant and dataset",
               ["tenant", "dataset", "status"])
SHARDS = Gauge("master_epoch_shards", "Shards of sharded epochs the leader holds, by admission status, per tenant "
               "and dataset (a sharded epoch counts once in master_epochs)", ["tenant", "dataset", "status"])
WORKERS_LOST = Counter("master_workers_lost_total",
                       "Registered workers whose lease expired without a drain (seen by the leader)", ["tenant"])
GATEWAY_QUERIES = Counter("gateway_queries_total", "Queries through the gateway by outcome (OK or a status)",
                          ["tenant", "outcome"])
GATEWAY_QUERY_SECONDS = Histogram(
    "gateway_query_seconds", "Query latency at the gateway, routing to the last batch",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)
GATEWAY_RETRIES = Counter("gateway_replica_retries_total", "Queries retried on another replica", ["tenant"])
GATEWAY_SHARDS = Counter("gateway_shards_total", "Shards of sharded datasets asked by queries, or skipped because "
                         "the WHERE clause's partition values are not in them", ["tenant", "outcome"])
GATEWAY_SHARD_GATHERS = Counter(
    "gateway_shard_gathers_total", "Queries on sharded datasets that do not decompose: run whole at the gateway "
    "on the shards' rows (gathered), or refused because those shards exceed the tenant's gather_max_bytes",
    ["tenant", "outcome"])

_TIMED = {"get", "put", "delete", "delete_prefix", "get_prefix", "get_range", "put_if_absent",
          "compare_and_put", "compare_and_put_with", "grant_lease", "refresh_leases"}


def set_epoch_counts(counts: dict[tuple[str, str, str], int],
                     shard_counts: dict[tuple[str, str, str], int] | None = None) -> None:
    """`master_epochs` as `counts` ((tenant, dataset, status) -> epochs) says, and
    `master_epoch_shards` as `shard_counts` does: a dataset's series the counts no longer name are
    removed, so a deleted dataset's counts go away. Only the series whose value differs from what
    was last set are touched: at 2,000 datasets there are 10,000 series, and setting them all
    (~40 ms holding the GIL, once a second during admissions) delayed the leader's admissions,
    while an admission moves two or three of them."""
    with _EPOCH_LOCK:
        for gauge, exported, wanted in ((EPOCHS, _EPOCH_SERIES, counts), (SHARDS, _SHARD_SERIES, shard_counts or {})):
            for labels in exported.keys() - wanted.keys():
                gauge.remove(*labels)
                del exported[labels]
            for labels, count in wanted.items():
                if exported.get(labels) != count:
                    tenant, dataset, status = labels
                    gauge.labels(tenant=tenant, dataset=dataset, status=status).set(count)
                    exported[labels] = count


def forget_leader_view() -> None:
    """Drop the gauges only a leader sets (a deposed master must not keep reporting them)."""
    with _EPOCH_LOCK:
        EPOCHS.clear()
        SHARDS.clear()
        _EPOCH_SERIES.clear()
        _SHARD_SERIES.clear()
    WORKERS_REGISTERED.clear()


_EPOCH_LOCK = threading.Lock()  # the reconciler sets, the election thread clears
# The value each series of `master_epochs` (and of `master_epoch_shards`) was last set to.
_EPOCH_SERIES: dict[tuple[str, str, str], int] = {}
_SHARD_SERIES: dict[tuple[str, str, str], int] = {}


def serve_metrics(port: int | None) -> None:
    """Serve the process's default registry on 127.0.0.1:`port` (nothing when `port` is None)."""
    if port:
        start_http_server(port, addr="127.0.0.1")


class TimedMetadataStore:
    """Delegates to `store`, observing the latency of each data operation."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name not in _TIMED:
            return attr
        histogram = ETCD_LATENCY.labels(op=name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                histogram.observe(time.perf_counter() - start)

        return timed
