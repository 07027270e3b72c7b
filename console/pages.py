"""What the page handlers put together from several sources (kept out of `console.app` so that
the routes read as a list): the browser's partition and page position (a parameter it cannot
show is a `BadPageRequest`), a pipeline's
summary and detail, the gateway's query figures, and the templates' number filters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from danube_core.errors import DanubeError
from danube_core.message import StreamMessage
from speedlayer.records import Announcement, AssignmentRecord

from console.message_view import MessageRow, PayloadDecoder
from console.metrics_scrape import Scrape, histogram_quantile
from console.pipelines_view import PipelineFile, TableLog, read_batches, reasons_total, source_topics
from console.quarantine_view import DECODE_REASON, decode_errors, with_decode_errors
from console.services import ConsoleServices
from console.topics import KeyReader, PartitionRow, SubscriptionRow, TopicRow


# ---- topics ---------------------------------------------------------------------------------

class BadPageRequest(ValueError):
    """A page's path or query parameter the console cannot show; its text names the parameter,
    what was given and what is expected (answered 400)."""


def chosen_partition(topic: TopicRow, asked: str | None) -> PartitionRow:
    """The partition `?partition=` names; the first when none is named."""
    if asked is None:
        return topic.partitions[0]
    for p in topic.partitions:
        if str(p.partition) == asked:
            return p
    numbers = [p.partition for p in topic.partitions if p.partition is not None]
    expected = (f"one of {', '.join(map(str, numbers))}" if numbers
                else "no partition parameter: the topic is not partitioned")
    raise BadPageRequest(f"partition={asked!r} is not a partition of {topic.name}: expected {expected}")


def page_start(asked: str | None, partition: PartitionRow, size: int) -> int:
    """The offset a page starts at: the one asked for, else the last page up to the head."""
    if asked is not None:
        if not asked.isdigit():
            raise BadPageRequest(f"offset={asked!r}: expected an offset, a whole number from 0")
        return int(asked)
    head = partition.head
    return max(0, head + 1 - size) if head is not None else 0


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
        """The newest offset written to the partition, its WAL tail included."""
        return self.partition.head

    @property
    def behind(self) -> int | None:
        """Messages between the cursor and the head (both inclusive offsets); None without a cursor."""
        return self.subscription.lag_messages if self.subscription is not None else None


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
    holds the batches' counts, reasons and durations (`console.pipelines_view`); when those
    batches had payloads that did not decode, their errors from the quarantine table
    (`console.quarantine_view`)."""
    assert file.config is not None
    config = file.config
    options = dict(config.speedlayer.storage_options) if config.speedlayer is not None else {}
    log = read_batches(config, services.config.page_batches, options)
    reasons, unexplained = reasons_total(log.batches)
    problems = [log.problem] if log.problem else []
    decoding = [b.batch_id for b in log.batches if (b.quarantined_by_reason or {}).get(DECODE_REASON)]
    if decoding:
        errors = decode_errors(config.quarantine.path, config.name, decoding, options)
        reasons = with_decode_errors(reasons, errors)
        problems += [errors.problem] if errors.problem else []
    return PipelineDetail(pipeline_summary(services, cache, file), log, reasons, unexplained, problems)


# ---- speed layer ----------------------------------------------------------------------------

@dataclass(frozen=True)
class GatewayFigures:
    endpoint: str
    queries: dict[str, float]  # outcome -> count
    p50_s: float | None
    p99_s: float | None
    problem: str | None


@dataclass(frozen=True)
class TailFigures:
    """One worker's figures for one dataset's tail, from its `worker_tail_*` metrics (None: the
    worker does not export that one)."""

    worker: str
    lag_messages: float | None  # on the topic, not read by the tail yet
    age_s: float | None         # since the tail last read its topic up to the head
    rows: float | None          # decoded rows held
    handovers: float | None     # epochs published beside it
    errors: float | None        # failed reads, every state


def tail_figures(scrapes: dict[str, Scrape], dataset: str) -> list[TailFigures]:
    """The workers (by id, their scrapes) that follow `dataset`'s tail, with its figures."""
    def total(found: Scrape, name: str) -> float | None:
        samples = found.values(name, dataset=dataset)
        return sum(s.value for s in samples) if samples else None

    figures = []
    for worker, found in sorted(scrapes.items()):
        row = TailFigures(worker, *(total(found, name) for name in (
            "worker_tail_lag_messages", "worker_tail_age_seconds", "worker_tail_rows",
            "worker_tail_handovers_total", "worker_tail_errors_total")))
        if any(v is not None for v in (row.lag_messages, row.age_s, row.rows, row.handovers)):
            figures.append(row)
    return figures


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
