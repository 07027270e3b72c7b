"""Every etcd JSON value (spec §5): compact, sorted keys, exact u64 integers.

The broker serialises through `serde_json::Value` (a BTreeMap), so keys come out sorted and
compact with non-ASCII unescaped; `dump_json` (from `json_text`, which also prints floats as
Rust does) reproduces that byte for byte. Reading follows serde's rules: unknown fields are
ignored, missing `Option` fields are None, any other missing field is an error (MetadataError
naming the key and the field). Random u64 ids are often > 2^53: Python's json keeps them
exact, and floats/bools are refused where an integer is due.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from danube_core.errors import MetadataError
from danube_core.json_text import dump_json, load_json  # re-exported: records' callers use them
from danube_core.keys import padded_offset

NULL_JSON = b"null"
DEFAULT_MAX_MESSAGE_SIZE = 10485760
_U64_MAX = (1 << 64) - 1
_U32_MAX = (1 << 32) - 1

Converter = Callable[[Any, str, str], Any]


def bad_value(key: str, name: str, expected: str, value: Any) -> MetadataError:
    return MetadataError(f"etcd key {key!r}: field {name!r} must be {expected}, got {value!r}")


def _uint(limit: int, label: str) -> Converter:
    def convert(value: Any, key: str, name: str) -> int:
        if type(value) is not int or not 0 <= value <= limit:
            raise bad_value(key, name, f"an integer {label}", value)
        return value
    return convert


u64 = _uint(_U64_MAX, "in 0..2^64-1")
u32 = _uint(_U32_MAX, "in 0..2^32-1")


def string(value: Any, key: str, name: str) -> str:
    if not isinstance(value, str):
        raise bad_value(key, name, "a string", value)
    return value


def boolean(value: Any, key: str, name: str) -> bool:
    if not isinstance(value, bool):
        raise bad_value(key, name, "true or false", value)
    return value


def f64(value: Any, key: str, name: str) -> float:
    """An f64: serde accepts a JSON integer too, and writes it back as a float (`5` -> `5.0`)."""
    if type(value) not in (int, float):
        raise bad_value(key, name, "a number", value)
    return float(value)


def one_of(*choices: str) -> Converter:
    def convert(value: Any, key: str, name: str) -> str:
        if value not in choices:
            raise bad_value(key, name, "one of " + ", ".join(map(repr, choices)), value)
        return value
    return convert


def optional(inner: Converter) -> Converter:
    """Option<T>: JSON null or a missing field is None."""
    def convert(value: Any, key: str, name: str) -> Any:
        return None if value is None else inner(value, key, name)
    convert.optional = True  # type: ignore[attr-defined]
    return convert


def list_of(inner: Converter) -> Converter:
    def convert(value: Any, key: str, name: str) -> list:
        if not isinstance(value, list):
            raise bad_value(key, name, "an array", value)
        return [inner(item, key, f"{name}[{i}]") for i, item in enumerate(value)]
    return convert


def nested(record: "type[JsonRecord]") -> Converter:
    """A field whose value is itself a record (read by the record's `from_value`)."""
    def convert(value: Any, key: str, name: str) -> Any:
        return record.from_value(value, key)
    return convert


def _offset_pair(value: Any, key: str, name: str) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2:
        raise bad_value(key, name, "an [offset, byte_pos] pair", value)
    return u64(value[0], key, name + "[0]"), u64(value[1], key, name + "[1]")


def expect_object(value: Any, key: str, what: str) -> dict:
    if not isinstance(value, dict):
        raise MetadataError(f"etcd key {key!r} must hold a {what} JSON object, got {value!r}")
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, JsonRecord):
        return value.to_value()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class JsonRecord:
    """Mixin for dataclasses stored as JSON objects.

    Subclasses declare `_fields` (field name -> converter), `_read_defaults` (used when a
    field is missing on read) and `_omit_when_none` (fields left out when None on write).
    """

    _fields: ClassVar[dict[str, Converter]] = {}
    _read_defaults: ClassVar[dict[str, Any]] = {}
    _omit_when_none: ClassVar[frozenset[str]] = frozenset()

    def to_value(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None and f.name in self._omit_when_none:
                continue
            out[f.name] = _plain(value)
        return out

    def to_json(self) -> bytes:
        return dump_json(self.to_value())

    @classmethod
    def from_value(cls, value: Any, key: str) -> Any:
        obj = expect_object(value, key, cls.__name__)
        kwargs = {}
        for name, convert in cls._fields.items():
            if name in obj:
                kwargs[name] = convert(obj[name], key, name)
            elif name in cls._read_defaults:
                kwargs[name] = cls._read_defaults[name]
            elif getattr(convert, "optional", False):
                kwargs[name] = None
            else:
                raise MetadataError(f"etcd key {key!r}: {cls.__name__} is missing required field {name!r}")
        return cls(**kwargs)

    @classmethod
    def from_json(cls, raw: bytes, key: str) -> Any:
        return cls.from_value(load_json(raw, key), key)


# ---- storage (§5.2) -------------------------------------------------------------------------


@dataclass
class ObjectDescriptor(JsonRecord):
    """One uploaded object; `start_offset`/`end_offset` are both inclusive.

    `offset_index` holds sparse `(offset, byte_pos-from-object-start)` entries (§4.5).
    `size`/`etag` come from the writer's close metadata and are not to be trusted (§9.3).
    """

    object_id: str
    start_offset: int
    end_offset: int
    size: int
    etag: str | None
    created_at: int
    completed: bool = True
    offset_index: list[tuple[int, int]] | None = None

    _fields = {
        "object_id": string, "start_offset": u64, "end_offset": u64, "size": u64,
        "etag": optional(string), "created_at": u64, "completed": boolean,
        "offset_index": optional(list_of(_offset_pair)),
    }
    _omit_when_none = frozenset({"offset_index"})


@dataclass
class CurPointer(JsonRecord):
    """`objects/cur`: the padded start key of the last uploaded object (a string)."""

    start: str

    _fields = {"start": string}

    @classmethod
    def for_offset(cls, start_offset: int) -> "CurPointer":
        return cls(padded_offset(start_offset))


@dataclass
class SealedState(JsonRecord):
    """Written on unload; the next owner starts its WAL at `last_committed_offset + 1` (§6.3).

    With `sealed: false` (ignored by every reader of the offset, §5.2) the leader's failover
    names the dead owner in `broker_id`, so the next owner can recover that broker's WAL tail.
    """

    broker_id: int
    last_committed_offset: int
    sealed: bool
    timestamp: int

    _fields = {"broker_id": u64, "last_committed_offset": u64, "sealed": boolean, "timestamp": u64}


# ---- namespaces and topics (§5.3, §5.4) -----------------------------------------------------


@dataclass
class Policies(JsonRecord):
    """Namespace/topic limits; 0 means unlimited. Defaults are the read defaults of §5.4."""

    max_consumers_per_subscription: int = 0
    max_consumers_per_topic: int = 0
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    max_producers_per_topic: int = 0
    max_publish_rate: int = 0
    max_subscription_dispatch_rate: int = 0
    max_subscriptions_per_topic: int = 0

    _fields = {
        name: u32 for name in (
            "max_consumers_per_subscription", "max_consumers_per_topic", "max_message_size",
            "max_producers_per_topic", "max_publish_rate", "max_subscription_dispatch_rate",
            "max_subscriptions_per_topic",
        )
    }
    _read_defaults = {name: 0 for name in _fields} | {"max_message_size": DEFAULT_MAX_MESSAGE_SIZE}


@dataclass
class ProducerRecord(JsonRecord):
    """`/topics{T}/producers/{id}`; access_mode 0 Shared, 1 Exclusive."""

    access_mode: int
    producer_id: int
    producer_name: str
    status: bool
    topic_name: str

    _fields = {
        "access_mode": u32, "producer_id": u64, "producer_name": string,
        "status": boolean, "topic_name": string,
    }


@dataclass
class SubscriptionRecord(JsonRecord):
    """`/topics{T}/subscriptions/{sub}`; type 0 Exclusive, 1 Shared, 2 Failover.

    The broker writes `consumer_id: null`, so the key is always present on write.
    """

    consumer_id: int | None
    consumer_name: str
    subscription_name: str
    subscription_type: int

    _fields = {
        "consumer_id": optional(u64), "consumer_name": string,
        "subscription_name": string, "subscription_type": u32,
    }


@dataclass
class SchemaConfig(JsonRecord):
    """`/topics{T}/schema_config`."""

    enable_payload_validation: bool
    subject: str
    validation_policy: str

    _fields = {
        "enable_payload_validation": boolean, "subject": string,
        "validation_policy": one_of("None", "Warn", "Enforce"),
    }


RELIABLE = "Reliable"
NON_RELIABLE = "NonReliable"


def dump_delivery(strategy: str) -> bytes:
    if strategy not in (RELIABLE, NON_RELIABLE):
        raise ValueError(f"delivery strategy {strategy!r} must be {RELIABLE!r} or {NON_RELIABLE!r}")
    return dump_json(strategy)


def parse_delivery(raw: bytes, key: str) -> str:
    """`/topics{T}/delivery`: "Reliable" or "NonReliable"."""
    return one_of(RELIABLE, NON_RELIABLE)(load_json(raw, key), key, "delivery")


def dump_u64(n: int) -> bytes:
    """A bare JSON number: cursors, the leader id, next_schema_id."""
    return dump_json(u64(n, "<new value>", "value"))


def parse_u64(raw: bytes, key: str) -> int:
    return u64(load_json(raw, key), key, "value")


def dump_cursor(offset: int) -> bytes:
    """Cursor = last acknowledged offset (inclusive); resume at +1."""
    return dump_u64(offset)


def parse_cursor(raw: bytes, key: str) -> int:
    return parse_u64(raw, key)


def parse_string(raw: bytes, key: str) -> str:
    """A bare JSON string value (e.g. `/topics{T}/schema_subject`)."""
    return string(load_json(raw, key), key, "value")


# ---- cluster (§5.5) -------------------------------------------------------------------------


@dataclass
class BrokerRegistration(JsonRecord):
    """`/cluster/register/{id}` (leased). `wal_url` is our extension: fsspec URL of the
    broker's WAL root, so a new owner can read a previous owner's WAL; Danube ignores it."""

    admin_addr: str
    broker_url: str
    connect_url: str
    prom_exporter: str | None = None
    wal_url: str | None = None

    _fields = {
        "admin_addr": string, "broker_url": string, "connect_url": string,
        "prom_exporter": optional(string), "wal_url": optional(string),
    }
    _omit_when_none = frozenset({"prom_exporter", "wal_url"})


BROKER_MODES = ("active", "draining", "drained")


@dataclass
class BrokerState(JsonRecord):
    """`/cluster/brokers/{id}/state`; a missing key means active.

    `wal_url` is our extension, the same URL as the registration's: the state key is not
    leased, so the next owner of a dead broker's topics can still find its WAL; Danube
    ignores it.
    """

    mode: str
    reason: str | None = None
    wal_url: str | None = None

    _fields = {"mode": one_of(*BROKER_MODES), "reason": optional(string), "wal_url": optional(string)}
    _omit_when_none = frozenset({"reason", "wal_url"})


RESOURCE_TYPES = ("CPU", "Memory", "DiskIO", "NetworkIO")


@dataclass
class ResourceUsage(JsonRecord):
    """One `resources_usage` entry of a LoadReport."""

    resource: str
    usage: float

    _fields = {"resource": one_of(*RESOURCE_TYPES), "usage": f64}


@dataclass
class TopicLoadStats(JsonRecord):
    """One `topics` entry of a LoadReport; rates are per second."""

    backlog_messages: int
    byte_rate: int
    byte_rate_mbps: float
    consumer_count: int
    message_rate: int
    producer_count: int
    subscription_count: int
    topic_name: str

    _fields = {
        "backlog_messages": u64, "byte_rate": u64, "byte_rate_mbps": f64, "consumer_count": u64,
        "message_rate": u64, "producer_count": u64, "subscription_count": u64, "topic_name": string,
    }


@dataclass
class LoadReport(JsonRecord):
    """`/cluster/load/{id}`. Its floats are why `dump_json` formats floats as Rust does."""

    broker_id: int
    resources_usage: list[ResourceUsage]
    timestamp: int
    topics: list[TopicLoadStats]
    total_lag_messages: int
    total_message_rate: int
    total_throughput_mbps: float

    _fields = {
        "broker_id": u64,
        "resources_usage": list_of(lambda v, key, name: ResourceUsage.from_value(v, key)),
        "timestamp": u64,
        "topics": list_of(lambda v, key, name: TopicLoadStats.from_value(v, key)),
        "total_lag_messages": u64, "total_message_rate": u64, "total_throughput_mbps": f64,
    }


@dataclass
class UnassignedMarker(JsonRecord):
    """`/cluster/unassigned/{ns}/{topic}`. All-None is the `null` value (new topic/failover).

    reason: "unload" | "rebalance" | "drain_redirect"; timestamp/to_broker only for rebalance.
    """

    from_broker: int | None = None
    reason: str | None = None
    timestamp: int | None = None
    to_broker: int | None = None

    _fields = {
        "from_broker": optional(u64), "reason": optional(string),
        "timestamp": optional(u64), "to_broker": optional(u64),
    }
    _omit_when_none = frozenset({"timestamp", "to_broker"})

    @property
    def is_null(self) -> bool:
        return self.from_broker is None and self.reason is None

    def to_json(self) -> bytes:
        return NULL_JSON if self.is_null else super().to_json()

    @classmethod
    def from_value(cls, value: Any, key: str) -> "UnassignedMarker":
        return cls() if value is None else super().from_value(value, key)
