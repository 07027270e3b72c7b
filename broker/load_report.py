"""`/cluster/load/{broker_id}` values (spec §5.5 LoadReport) built from this process's topics.

The leader of this broker places topics by assignment count, not by these reports, but a
v0.7.3 leader in a mixed cluster, Danube's tools and dashboards read them, so they are written
as the broker writes them: the same seven fields, sorted keys, compact, u64 fields as integers
and f64 fields as floats in Rust's text (`danube_core.records.dump_json`). `resources_usage`
holds CPU, Memory, DiskIO and NetworkIO in that order (`broker.resource_usage`). Rates are per
second over the last report interval, truncated to integers as the broker's u64 casts do.

Deliberate differences, same shapes: `backlog_messages` is each topic's real backlog (the
broker always writes 0), topics are listed by name (the broker's order is its map's), and a
topic's first report has rates 0 (the broker divides its totals by the time since start).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from danube_core.records import dump_json

from broker.resource_usage import ResourceSampler


@dataclass(frozen=True)
class TopicLoad:
    """Counters of one local topic at a moment; rates come from two of these."""

    topic_name: str
    messages_in: int
    bytes_in: int
    producer_count: int
    consumer_count: int
    subscription_count: int
    backlog_messages: int


class LoadReporter:
    """Turns successive `TopicLoad` snapshots into LoadReport JSON bytes."""

    def __init__(self, broker_id: int, resources: ResourceSampler | None = None) -> None:
        self._broker_id = broker_id
        self._resources = resources or ResourceSampler()
        self._previous: dict[str, TopicLoad] = {}
        self._previous_at = time.monotonic()

    def report(self, loads: list[TopicLoad]) -> bytes:
        now = time.monotonic()
        elapsed = max(now - self._previous_at, 1e-3)
        topics = [self._topic_entry(load, elapsed) for load in sorted(loads, key=lambda t: t.topic_name)]
        self._previous = {load.topic_name: load for load in loads}
        self._previous_at = now
        return dump_json({
            "broker_id": self._broker_id,
            "resources_usage": self._resources.sample(),
            "timestamp": int(time.time()),
            "topics": topics,
            "total_lag_messages": sum(t["backlog_messages"] for t in topics),
            "total_message_rate": sum(t["message_rate"] for t in topics),
            # Rust's f64 sum starts at -0.0: a broker without topics writes -0.0.
            "total_throughput_mbps": sum((t["byte_rate_mbps"] for t in topics), -0.0),
        })

    def _topic_entry(self, load: TopicLoad, elapsed: float) -> dict:
        before = self._previous.get(load.topic_name)
        messages = load.messages_in - before.messages_in if before else 0
        byte_count = load.bytes_in - before.bytes_in if before else 0
        byte_rate = max(int(byte_count / elapsed), 0)
        return {
            "backlog_messages": load.backlog_messages,
            "byte_rate": byte_rate,
            # The broker's "mbps" is byte_rate / 1e6 (megabytes, not megabits, per second).
            "byte_rate_mbps": byte_rate / 1_000_000,
            "consumer_count": load.consumer_count,
            "message_rate": max(int(messages / elapsed), 0),
            "producer_count": load.producer_count,
            "subscription_count": load.subscription_count,
            "topic_name": load.topic_name,
        }
