"""What the page handlers put together from several sources (kept out of `console.app` so that
the routes read as a list): WAL tails by partition, the browser's page position, a pipeline's
summary and detail, the gateway's query figures, and the templates' number filters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from danube_core import keys
from danube_core.errors import DanubeError
from danube_core.message import StreamMessage
from danube_core.records import BrokerState
from danube_core.topics import TopicName
from speedlayer.records import Announcement

from console.message_view import MessageRow, PayloadDecoder
from console.metrics_scrape import Scrape, histogram_quantile, scrape
from console.pipelines_view import (
    PipelineFile, TableLog, metrics_endpoint, quarantine_reasons, read_batches, source_topics,
)
from console.services import ConsoleServices
from console.topics import KeyReader, PartitionRow, SubscriptionRow, TopicRow
from console.wal_tail import WalTail, read_wal_tail, topic_wal_dir

__all__ = ["topic_wal_dir"]


# ---- topics ---------------------------------------------------------------------------------

def owner_wal_url(services: ConsoleServices, cache: KeyReader, partition: PartitionRow) -> str | None:
    """The owner's advertised WAL root: its registration's, else its state key's (a dead owner)."""
    if partition.owner is None:
        return None
    for row in services.brokers.brokers(cache):
        if row.broker_id == partition.owner and row.registration is not None and row.registration.wal_url:
            return row.registration.wal_url
    raw = cache.get(keys.broker_state_key(partition.owner))
    try:
        return BrokerState.from_json(raw, keys.broker_state_key(partition.owner)).wal_url if raw else None
    except DanubeError:
        return None


def wal_tails(services: ConsoleServices, cache: KeyReader, topic: TopicRow) -> dict[str, WalTail]:
    return {p.topic: read_wal_tail(owner_wal_url(services, cache, p), TopicName.parse(p.topic))
            for p in topic.partitions}


def newest_offset(partition: PartitionRow, tail: WalTail | None) -> int | None:
    """The newest offset written: the WAL's when it has one, else what etcd shows."""
    seen = [o for o in (partition.newest_known, tail.last_offset if tail is not None else None) if o is not None]
    return max(seen) if seen else None


def chosen_partition(topic: TopicRow, asked: str | None) -> PartitionRow:
    for p in topic.partitions:
        if asked is not None and str(p.partition) == asked:
            return p
    return topic.partitions[0]


def page_start(asked: str | None, partition: PartitionRow, size: int) -> int:
    """The offset a page starts at: the one asked for, else the last page etcd knows of."""
    if asked is not None and asked.isdigit():
        return int(asked)
    newest = partition.newest_known
    return max(0, newest + 1 - size) if newest is not None else 0


def decoded_rows(cache: KeyReader, topic: str, messages: list[StreamMessage]) -> list[MessageRow]:
    decoder = PayloadDecoder(cache, topic)
    return [decoder.row(m) for m in messages]


# ---- pipelines ------------------------------------------------------------------------------

@dataclass(frozen=True)
class CursorRow:
    subscription: SubscriptionRow | None
    partition: PartitionRow


@dataclass(frozen=True)
class PipelineSummary:
    file: PipelineFile
    cursors: list[CursorRow] = field(default_factory=list)
    announcement: Announcement | None = None
    announcement_note: str | None = None


@dataclass(frozen=True)
class PipelineDetail:
    summary: PipelineSummary
    log: TableLog
    reasons: dict[str, int]
    metrics: Scrape | None
    durations: dict[str, Any]
    problems: list[str]


def pipeline_summary(services: ConsoleServices, cache: KeyReader | None, file: PipelineFile) -> PipelineSummary:
    """From etcd only: the pipeline's cursors against its topics' heads, and its announcement."""
    config = file.config
    if config is None or cache is None:
        return PipelineSummary(file)
    namespaces = {} if config.source.topics else {
        ns: [t.name for t in services.topics.topics(cache, ns)] for ns in services.topics.namespaces(cache)}
    cursors = []
    for name in source_topics(config, namespaces):
        topic = services.topics.topic(cache, name)
        for partition in topic.partitions if topic is not None else ():
            sub = next((s for s in partition.subscriptions if s.name == config.source.subscription), None)
            cursors.append(CursorRow(sub, partition))
    announcement, note = None, None
    if config.speedlayer is not None:
        if (config.speedlayer.key_root or "") != services.speedlayer_keys.root:
            note = f"announced under key root {config.speedlayer.key_root!r}, not the console's"
        else:
            key = services.speedlayer_keys.announce(config.speedlayer.tenant, config.speedlayer.dataset)
            raw = cache.get(key)
            announcement = Announcement.from_json(raw, key) if raw is not None else None
            note = None if raw is not None else "nothing announced yet"
    return PipelineSummary(file, cursors, announcement, note)


def pipeline_detail(services: ConsoleServices, cache: KeyReader | None, file: PipelineFile) -> PipelineDetail:
    """The summary, the tail of the target's Delta log (one per request) and the quarantine by
    reason for those batches; batch durations from the pipeline's metrics endpoint, if any."""
    assert file.config is not None
    config = file.config
    options = dict(config.speedlayer.storage_options) if config.speedlayer is not None else {}
    log = read_batches(config, services.config.page_batches, options)
    reasons, problem = quarantine_reasons(config, [b.batch_id for b in log.batches], options)
    endpoint = metrics_endpoint(config, services.config.pipeline_metrics)
    metrics = scrape(endpoint, services.config.metrics_timeout_ms / 1000) if endpoint else None
    durations = batch_durations(metrics) if metrics is not None and metrics.problem is None else {}
    problems = [p for p in (log.problem, problem, metrics.problem if metrics else None) if p]
    return PipelineDetail(pipeline_summary(services, cache, file), log, reasons, metrics, durations, problems)


def batch_durations(metrics: Scrape) -> dict[str, Any]:
    """Mean and p90 of the first batch-duration histogram the endpoint exports (its name is the
    pipeline release's business: any `*batch*seconds` histogram), in seconds."""
    names = sorted({s.name[: -len("_count")] for s in metrics.samples
                    if s.name.endswith("_count") and "batch" in s.name and "second" in s.name})
    if not names:
        return {}
    name = names[0]
    count, total = metrics.total(f"{name}_count"), metrics.total(f"{name}_sum")
    return {"name": name, "mean": (total / count) if count and total is not None else None,
            "p90": histogram_quantile(metrics, name, 0.9), "batches": count}


# ---- speed layer ----------------------------------------------------------------------------

@dataclass(frozen=True)
class GatewayFigures:
    endpoint: str
    queries: dict[str, float]  # outcome -> count
    p50_s: float | None
    p99_s: float | None
    problem: str | None


def gateway_figures(found: Scrape) -> GatewayFigures:
    outcomes: dict[str, float] = {}
    for sample in found.values("gateway_queries_total"):
        outcome = sample.labels.get("outcome", "?")
        outcomes[outcome] = outcomes.get(outcome, 0.0) + sample.value
    return GatewayFigures(found.endpoint, outcomes, histogram_quantile(found, "gateway_query_seconds", 0.5),
                          histogram_quantile(found, "gateway_query_seconds", 0.99), found.problem)


# ---- template filters -----------------------------------------------------------------------

def human_bytes(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "—"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def or_dash(value: Any) -> Any:
    return "—" if value is None else value


def unix_time(value: Any, unit: str = "s") -> str:
    if not isinstance(value, (int, float)) or value <= 0:
        return "—"
    seconds = value / 1000 if unit == "ms" else value
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


FILTERS = {"bytes": human_bytes, "dash": or_dash, "unixtime": unix_time}
