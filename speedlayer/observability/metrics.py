"""Prometheus metrics (seed §14) plus load times; served on `metrics_port` when configured.

`TimedMetadataStore` wraps a `MetadataStore` so every etcd call lands in
`etcd_client_latency_seconds{op}` without the master's code timing anything itself.
"""

from __future__ import annotations

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
EVICTIONS = Counter("master_epoch_evictions_total", "Epochs evicted by the lifecycle", ["reason"])
REFRESHES = Counter("master_refresh_epochs_total", "Epochs planned for new source versions", ["kind"])
REFRESH_LAG = Histogram(
    "master_refresh_detect_seconds", "Source commit time to the refresh epoch being planned",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
GATEWAY_QUERIES = Counter("gateway_queries_total", "Queries through the gateway by outcome (OK or a status)",
                          ["tenant", "outcome"])
GATEWAY_QUERY_SECONDS = Histogram(
    "gateway_query_seconds", "Query latency at the gateway, routing to the last batch",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)
GATEWAY_RETRIES = Counter("gateway_replica_retries_total", "Queries retried on another replica", ["tenant"])

_TIMED = {"get", "put", "delete", "delete_prefix", "get_prefix", "get_range", "put_if_absent",
          "compare_and_put", "grant_lease"}


def serve_metrics(port: int | None) -> None:
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
