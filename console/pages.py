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
from speedlayer.records import Announcement, AssignmentRecord

from console.message_view import MessageRow, PayloadDecoder
from console.metrics_scrape import Scrape, histogram_quantile
from console.pipelines_view import PipelineFile, TableLog, read_batches, reasons_total, source_topics
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
    """The pipeline's cursor on one partition against that partition's head."""

    subscription: SubscriptionRow | None
    partition: PartitionRow

    @property
    def head(self) -> int | None:
        """The newest offset etcd shows for the partition (uploaded, sealed, or a cursor's):
        the WAL's unuploaded tail is the topic page's to show, since it needs the WAL read."""
        return self.partition.newest_known

    @property
    def behind(self) -> int | None:
        """Messages between the cursor and the head (both inclusive offsets); None without a cursor."""
        cursor = self.subscription.cursor if self.subscription is not None else None
        head = self.head
        return max(0, head - cursor) if cursor is not None and head is not None else None


@dataclass(frozen=True)
class PipelineSummary:
    """From etcd only. `epoch`: the newest epoch of the dataset the pipeline feeds, to set its
    announced version against what the speed layer serves (`announcement_pending`)."""

    file: PipelineFile
    cursors: list[CursorRow] = field(default_factory=list)
    announcement: Announcement | None = None
    announcement_note: str | None = None
    epoch: AssignmentRecord | None = None

    @property
    def announcement_pending(self) -> bool:
        """The speed layer has no epoch yet of the last version announced (-1: unknown version)."""
        if self.announcement is None or self.announcement.version < 0:
            return False
        return self.epoch is None or self.epoch.version < self.announcement.version


@dataclass(frozen=True)
class PipelineDetail:
    """The pipeline page: the summary, the target's log tail, and the quarantine by reason over
    those batches (`unexplained`: batches that quarantined rows without recording why)."""

    summary: PipelineSummary
    log: TableLog
    reasons: dict[str, int]
    unexplained: int
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
    announcement, note, epoch = None, None, None
    feed = config.speedlayer
    if feed is not None:
        if (feed.key_root or "") != services.speedlayer_keys.root:
            note = f"announced under key root {feed.key_root!r}, not the console's"
        else:
            key = services.speedlayer_keys.announce(feed.tenant, feed.dataset)
            raw = cache.get(key)
            try:
                announcement = Announcement.from_json(raw, key) if raw is not None else None
                note = None if raw is not None else "nothing announced yet"
            except DanubeError as exc:
                note = str(exc)
            epoch = newest_epoch(services, cache, feed.tenant, feed.dataset)
    return PipelineSummary(file, cursors, announcement, note, epoch)


def newest_epoch(services: ConsoleServices, cache: KeyReader, tenant: str, dataset: str) -> AssignmentRecord | None:
    """The dataset's newest epoch (by source version, then creation) in the cache; None: none
    admitted, or none readable."""
    found = []
    for key, raw in cache.get_prefix(services.speedlayer_keys.dataset_assignments_prefix(tenant, dataset)):
        try:
            found.append(AssignmentRecord.from_json(raw, key))
        except DanubeError:
            continue  # the speed-layer page names it
    return max(found, key=lambda r: r.order) if found else None


def pipeline_detail(services: ConsoleServices, cache: KeyReader | None, file: PipelineFile) -> PipelineDetail:
    """The summary and the tail of the target's Delta log: one log tail per request, which
    holds the batches' counts, reasons and durations (`console.pipelines_view`)."""
    assert file.config is not None
    config = file.config
    options = dict(config.speedlayer.storage_options) if config.speedlayer is not None else {}
    log = read_batches(config, services.config.page_batches, options)
    reasons, unexplained = reasons_total(log.batches)
    problems = [log.problem] if log.problem else []
    return PipelineDetail(pipeline_summary(services, cache, file), log, reasons, unexplained, problems)


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
