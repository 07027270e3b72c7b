"""Connector offsets: end-exclusive positions per topic partition, as JSON-able dicts.

A position dict maps a broker topic name (a partition's own name for a partitioned topic,
e.g. `/ns/orders-part-0`) to the next offset to read, so a batch `[start, end)` reads
`end[t] - start[t]` messages of topic `t`, and the cursor that matches a position is
`end[t] - 1` (cursors are inclusive, spec §6.4). Spark stores the stream's offsets as JSON in
its checkpoint; `SourceOffset` is that JSON. The functions here are pure: lookups that need
etcd come in through the small `OffsetLookups` interface (the catalog implements it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Protocol, Sequence

from danube_core.errors import ConfigError
from danube_core.topics import TopicName
from connectors.options import EARLIEST, LATEST, Position
from connectors.subscription_lock import LockToken

Positions = dict[str, int]


class OffsetLookups(Protocol):
    """The driver-side lookups that turn a starting/ending option into positions."""

    def earliest_offsets(self, topics: Sequence[str]) -> Positions: ...

    def latest_offsets(self, topics: Sequence[str]) -> Positions: ...

    def offsets_for_timestamp(self, topics: Sequence[str], timestamp_ms: int) -> Positions: ...

    def read_cursor(self, topic: str, subscription: str) -> int | None: ...


@dataclass(frozen=True)
class SourceOffset:
    """One offset of the stream, as Spark checkpoints it and reports it in query progress.

    Besides the positions it names the `subscription` and the etcd `endpoints` (never
    credentials), so a `StreamingQueryListener` that sees only the progress JSON can tell
    which cursors the offset belongs to.
    """

    positions: Mapping[str, int]
    subscription: str | None = None
    endpoints: str | None = None
    lag: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    lock: LockToken | None = None  # the subscription lock that planned the batch ending here

    def to_json_dict(self) -> dict:
        value: dict = {"offsets": dict(sorted(self.positions.items()))}
        if self.subscription is not None:
            value["subscription"] = self.subscription
        if self.endpoints is not None:
            value["etcd"] = self.endpoints
        if self.lock is not None:
            value["lock"] = self.lock.to_json_dict()
        if self.lag:
            value["lag"] = {t: dict(v) for t, v in sorted(self.lag.items())}
        return value

    @classmethod
    def from_json_dict(cls, value: object) -> "SourceOffset":
        """Parse what `to_json_dict` wrote; ValueError naming what is wrong otherwise."""
        if not isinstance(value, dict) or not isinstance(value.get("offsets"), dict):
            raise ValueError(f"not a danube source offset (expected {{'offsets': {{topic: offset}}}}): {value!r}")
        positions = value["offsets"]
        for topic, offset in positions.items():
            if not isinstance(topic, str) or type(offset) is not int or offset < 0:
                raise ValueError(f"danube source offset {value!r}: bad position {topic!r}: {offset!r}")
        return cls(dict(positions), value.get("subscription"), value.get("etcd"), value.get("lag") or {},
                   LockToken.from_json_dict(value.get("lock")))

    @classmethod
    def from_json(cls, text: str) -> "SourceOffset":
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"danube source offset is not JSON: {text[:200]!r}") from exc
        return cls.from_json_dict(value)


def expand_spec(option: str, spec: Mapping[str, int], topics: Sequence[str]) -> Positions:
    """Per-topic values of a startingOffsets/endingOffsets JSON, for every resolved topic.

    A key may be a partition's own name or the base name of a partitioned topic (then it
    applies to each partition). As in Spark's Kafka source, every topic the query reads must
    be covered, and a key matching no topic is an error: both name the option.
    """
    result: Positions = {}
    used: set[str] = set()
    for topic in topics:
        base = TopicName.parse(topic).base_name
        kafka_zero = f"{topic}-part-0"  # Kafka's partition 0 of a topic that has no partitions
        key = (topic if topic in spec else base if base in spec
               else kafka_zero if TopicName.parse(topic).partition is None and kafka_zero in spec else None)
        if key is None:
            continue
        result[topic] = spec[key]
        used.add(key)
    missing = [t for t in topics if t not in result]
    unknown = [k for k in spec if k not in used]
    if missing or unknown:
        raise ConfigError(
            f"option {option!r} must give an offset for exactly the topics read: "
            f"missing {missing or 'none'}, not read {unknown or 'none'}"
        )
    return result


def resolve_start(
    position: Position, topics: Sequence[str], lookups: OffsetLookups, subscription: str | None
) -> Positions:
    """First offset to read per topic for `position` (the option's meaning, spec §5.3 for cursors)."""
    if not topics:
        return {}
    if position.kind == "earliest":
        return dict(lookups.earliest_offsets(topics))
    if position.kind == "latest":
        return dict(lookups.latest_offsets(topics))
    if position.kind == "timestamp":
        return dict(lookups.offsets_for_timestamp(topics, position.timestamp_ms))
    if position.kind == "cursor":
        return _from_cursors(topics, lookups, subscription)
    spec = expand_spec("startingOffsets", position.offsets or {}, topics)
    return _fill_special(spec, lookups)


def resolve_end(position: Position | None, topics: Sequence[str], lookups: OffsetLookups) -> Positions:
    """End-exclusive offset per topic for a batch read (default: latest)."""
    if not topics:
        return {}
    if position is None or position.kind == "latest":
        return dict(lookups.latest_offsets(topics))
    if position.kind == "timestamp":
        return dict(lookups.offsets_for_timestamp(topics, position.timestamp_ms))
    spec = expand_spec("endingOffsets", position.offsets or {}, topics)
    return _fill_special(spec, lookups)


def _from_cursors(topics: Sequence[str], lookups: OffsetLookups, subscription: str | None) -> Positions:
    """Resume at cursor + 1; a topic without a cursor starts at latest, as the broker does."""
    if subscription is None:
        raise ConfigError("option 'startingOffsets'='cursor' needs option 'subscription'")
    result: Positions = {}
    without: list[str] = []
    for topic in topics:
        cursor = lookups.read_cursor(topic, subscription)
        if cursor is None:
            without.append(topic)
        else:
            result[topic] = cursor + 1
    if without:
        result.update(lookups.latest_offsets(without))
    return result


def _fill_special(spec: Mapping[str, int], lookups: OffsetLookups) -> Positions:
    result = dict(spec)
    for special, lookup in ((EARLIEST, lookups.earliest_offsets), (LATEST, lookups.latest_offsets)):
        wanted = [t for t, v in spec.items() if v == special]
        if wanted:
            result.update(lookup(wanted))
    return result


def with_new_topics(positions: Mapping[str, int], topics: Iterable[str], lookups: OffsetLookups) -> Positions:
    """`positions` plus every topic it does not know yet, at that topic's earliest offset.

    Topics and partitions created after the query started are read from their beginning, as
    Spark's Kafka source reads new partitions from earliest.
    """
    result = dict(positions)
    new = [t for t in topics if t not in result]
    if new:
        result.update(lookups.earliest_offsets(new))
    return result


def cap_at(end: Mapping[str, int], target: Mapping[str, int]) -> Positions:
    """`end` bounded by `target` per topic; topics unknown to `target` are left out.

    Used by Trigger.AvailableNow: nothing beyond what existed when the run began is read.
    """
    return {t: min(o, target[t]) for t, o in end.items() if t in target}


def message_counts(start: Mapping[str, int], end: Mapping[str, int]) -> Positions:
    """Messages in `[start, end)` per topic of `end` (0 where the end is not past the start)."""
    return {t: max(0, e - start.get(t, e)) for t, e in end.items()}


def cursor_values(end: Mapping[str, int]) -> Positions:
    """The inclusive cursor that matches each end-exclusive position (topics at 0 have none)."""
    return {t: e - 1 for t, e in end.items() if e > 0}
