"""`/cluster/load/{broker_id}` values (spec §5.5 LoadReport) built from this process's topics.

The leader of this broker places topics by assignment count, not by these reports, but
Danube's tools and dashboards read them, so they are published in Danube's shape: sorted
keys, compact, floats as JSON numbers. Rates are per second over the last report interval.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from danube_core.records import dump_json


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


def _cpu_percent() -> float:
    try:
        return round(os.getloadavg()[0] / (os.cpu_count() or 1) * 100.0, 2)
    except OSError:
        return 0.0


def _memory_percent() -> float:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            fields = {line.split(":")[0]: int(line.split()[1]) for line in handle if line.strip()}
        total, available = fields["MemTotal"], fields["MemAvailable"]
        return round((total - available) / total * 100.0, 2)
    except (OSError, KeyError, ValueError, ZeroDivisionError):
        return 0.0


class LoadReporter:
    """Turns successive `TopicLoad` snapshots into LoadReport JSON bytes."""

    def __init__(self, broker_id: int) -> None:
        self._broker_id = broker_id
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
            "resources_usage": [
                {"resource": "CPU", "usage": _cpu_percent()},
                {"resource": "Memory", "usage": _memory_percent()},
            ],
            "timestamp": int(time.time()),
            "topics": topics,
            "total_lag_messages": sum(t["backlog_messages"] for t in topics),
            "total_message_rate": sum(t["message_rate"] for t in topics),
            "total_throughput_mbps": round(sum(t["byte_rate_mbps"] for t in topics), 6),
        })

    def _topic_entry(self, load: TopicLoad, elapsed: float) -> dict:
        before = self._previous.get(load.topic_name)
        messages = load.messages_in - before.messages_in if before else 0
        byte_count = load.bytes_in - before.bytes_in if before else 0
        byte_rate = max(int(byte_count / elapsed), 0)
        return {
            "backlog_messages": load.backlog_messages,
            "byte_rate": byte_rate,
            "byte_rate_mbps": round(byte_rate * 8 / 1_000_000, 6),
            "consumer_count": load.consumer_count,
            "message_rate": max(int(messages / elapsed), 0),
            "producer_count": load.producer_count,
            "subscription_count": load.subscription_count,
            "topic_name": load.topic_name,
        }
