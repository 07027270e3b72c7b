"""The `danube` data source options: one constant per key, parsed once into `DanubeOptions`.

Why one module of ~470 lines: each option's constant and its parser stand side by side and
`parse_options` reads them all into one frozen object; split, every new option would touch two
modules (the value parsers already live apart, in `connectors.option_values`).

Spark hands a Python data source its options with lower-cased keys, so every key below is
matched case-insensitively. Parsing happens once, on the driver, when the data source is
created (`spark.read/readStream ... .load()`): a malformed value raises `ConfigError` (a
`ValueError`) naming the option, the value and what is accepted, before any query runs.
Checks that depend on the kind of read (a stream needs `subscription`, only a batch accepts
`endingOffsets`) are made by `require_batch` / `require_stream` when Spark asks for the reader.

Executors unpickle `DanubeOptions` in every Python worker, so this module imports nothing
heavy at module level (no catalog, no numpy): only names and small checks.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from danube_core.errors import ConfigError, InvalidTopicNameError
from danube_core.etcd_settings import DEFAULT_TIMEOUT_MS, EtcdKeyNames, EtcdSettings, parse_etcd_settings
from danube_core.keys import DEFAULT_ROOT_PREFIX
from danube_core.topics import TopicName

from connectors import option_values as values
from connectors.wal_root import WAL_AUTO, WAL_NONE, WAL_ROOT_FORMS, parse_wal_map  # walRoot's keywords and forms

# ---- where ------------------------------------------------------------------------------------
ETCD_ENDPOINTS = "etcd.endpoints"
ETCD_USER = "etcd.user"
ETCD_PASSWORD = "etcd.password"
ETCD_CA_CERT = "etcd.caCert"
ETCD_CERT_KEY = "etcd.certKey"
ETCD_CERT_CERT = "etcd.certCert"
ETCD_TIMEOUT_MS = "etcd.timeoutMs"
ROOT_PREFIX = "rootPrefix"
STORAGE_URL = "storage.url"
STORAGE_OPTIONS = "storage.options"
STORAGE_PREFIX = "storage."
WAL_ROOT = "walRoot"
# ---- what -------------------------------------------------------------------------------------
TOPIC = "topic"
TOPIC_PATTERN = "topicPattern"
NAMESPACE = "namespace"
# ---- from / to --------------------------------------------------------------------------------
STARTING_OFFSETS = "startingOffsets"
STARTING_TIMESTAMP = "startingTimestamp"
ENDING_OFFSETS = "endingOffsets"
ENDING_TIMESTAMP = "endingTimestamp"
# ---- how much ---------------------------------------------------------------------------------
MAX_MESSAGES_PER_TRIGGER = "maxMessagesPerTrigger"
MAX_BYTES_PER_TRIGGER = "maxBytesPerTrigger"
MIN_MESSAGES_PER_TRIGGER = "minMessagesPerTrigger"
MAX_TRIGGER_DELAY = "maxTriggerDelay"
MAX_PARTITION_BYTES = "maxPartitionBytes"
# ---- cursors and behaviour --------------------------------------------------------------------
SUBSCRIPTION = "subscription"
FAIL_ON_DATA_LOSS = "failOnDataLoss"
FAIL_ON_MISSING_TOPIC = "failOnMissingTopic"
INCLUDE_SOURCE = "includeSource"
SALVAGE = "salvage"
LOST_OFFSETS_LOCATION = "lostOffsetsLocation"

# How the `etcd.*` options spell the settings (`danube_core.etcd_settings`), for errors and hints.
ETCD_KEY_NAMES = EtcdKeyNames(ETCD_ENDPOINTS, ETCD_USER, ETCD_PASSWORD, ETCD_CA_CERT, ETCD_CERT_KEY,
                              ETCD_CERT_CERT, ETCD_TIMEOUT_MS)

ETCD_OPTIONS = (ETCD_ENDPOINTS, ETCD_USER, ETCD_PASSWORD, ETCD_CA_CERT, ETCD_CERT_KEY, ETCD_CERT_CERT,
                ETCD_TIMEOUT_MS)

KNOWN_OPTIONS = (
    ETCD_ENDPOINTS, ETCD_USER, ETCD_PASSWORD, ETCD_CA_CERT, ETCD_CERT_KEY, ETCD_CERT_CERT,
    ETCD_TIMEOUT_MS, ROOT_PREFIX, STORAGE_URL, STORAGE_OPTIONS, WAL_ROOT, TOPIC, TOPIC_PATTERN,
    NAMESPACE, STARTING_OFFSETS, STARTING_TIMESTAMP, ENDING_OFFSETS, ENDING_TIMESTAMP,
    MAX_MESSAGES_PER_TRIGGER, MAX_BYTES_PER_TRIGGER, MIN_MESSAGES_PER_TRIGGER, MAX_TRIGGER_DELAY,
    MAX_PARTITION_BYTES, SUBSCRIPTION, FAIL_ON_DATA_LOSS, FAIL_ON_MISSING_TOPIC, INCLUDE_SOURCE, SALVAGE,
    LOST_OFFSETS_LOCATION,
)
_BY_LOWER = {key.lower(): key for key in KNOWN_OPTIONS}

# Spark's Kafka source names for the same settings: accepted as they are, so a Kafka user's
# options work unchanged (the danube name wins if both are given).
KAFKA_ALIASES = {
    "maxOffsetsPerTrigger": MAX_MESSAGES_PER_TRIGGER,
    "minOffsetsPerTrigger": MIN_MESSAGES_PER_TRIGGER,
}
# Kafka source options with no alias here: what to use instead, so the error teaches.
KAFKA_EQUIVALENTS = {
    "subscribe": f"use {TOPIC!r} (a topic or a comma-separated list)",
    "subscribePattern": f"use {TOPIC_PATTERN!r} (a regular expression over /namespace/topic)",
    "assign": f"use {TOPIC!r} with partition names (/ns/topic-part-N)",
    "kafka.bootstrap.servers": f"use {ETCD_ENDPOINTS!r} and {STORAGE_URL!r}: the connector reads storage, not brokers",
    "includeHeaders": "Danube attributes are always read, in the column `attributes`",
    "minPartitions": f"set {MAX_PARTITION_BYTES!r}: ranges are split and packed by bytes",
    "maxRecordsPerPartition": f"set {MAX_PARTITION_BYTES!r}: ranges are split and packed by bytes",
    "groupIdPrefix": f"use {SUBSCRIPTION!r}: the Danube subscription whose cursor the query commits",
    "kafka.group.id": f"use {SUBSCRIPTION!r}: the Danube subscription whose cursor the query commits",
    "fetchOffset.numRetries": f"there is none: etcd reads are retried within {ETCD_TIMEOUT_MS!r}",
    "fetchOffset.retryIntervalMs": f"there is none: etcd reads are retried within {ETCD_TIMEOUT_MS!r}",
    "kafkaConsumer.pollTimeoutMs": "there is none: executors read storage, with no consumer to poll",
    "startingOffsetsByTimestamp": f"use {STARTING_TIMESTAMP!r} (one timestamp for every topic)",
    "endingOffsetsByTimestamp": f"use {ENDING_TIMESTAMP!r} (one timestamp for every topic)",
    "startingOffsetsByTimestampStrategy": "there is none: a timestamp past the newest message starts at latest",
}
_KAFKA_ALIASES_LOWER = {k.lower(): v for k, v in KAFKA_ALIASES.items()}
_KAFKA_EQUIVALENTS_LOWER = {k.lower(): (k, v) for k, v in KAFKA_EQUIVALENTS.items()}

DEFAULT_ETCD_TIMEOUT_MS = DEFAULT_TIMEOUT_MS
DEFAULT_MAX_PARTITION_BYTES = 128 * 1024 * 1024
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000

# Special per-topic values inside startingOffsets/endingOffsets JSON, as in Spark's Kafka source.
EARLIEST = -2
LATEST = -1


@dataclass(frozen=True)
class Position:
    """Where a read starts or ends.

    `kind`: earliest | latest | cursor | offsets | timestamp (ends: latest | offsets |
    timestamp). `offsets` maps broker topic names (a partitioned topic's base name covers its
    partitions) to an offset, EARLIEST or LATEST: the first to read for a start, end-exclusive
    for an end.
    """

    kind: str
    offsets: Mapping[str, int] | None = None
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class DanubeOptions:
    """Every option of one `danube` read, validated. Picklable, so executors get it too."""

    etcd: EtcdSettings
    storage_url: str
    storage_options: Mapping[str, Any] = field(repr=False)
    root_prefix: str = DEFAULT_ROOT_PREFIX
    wal_root: str = WAL_AUTO  # WAL_AUTO, WAL_NONE (sealed objects only) or a URL / template
    topics: tuple[str, ...] | None = None
    topic_pattern: str | None = None
    namespace: str | None = None
    starting: Position | None = None  # None: latest for streams, earliest for batches
    ending: Position | None = None
    max_messages_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    min_messages_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    subscription: str | None = None
    fail_on_data_loss: bool = True
    fail_on_missing_topic: bool = False
    include_source: bool = False
    columns: tuple[str, ...] | None = None  # the columns the query's schema names (None: all; `projected_columns`)
    salvage: tuple[str, ...] | None = None  # object ids / WAL file URLs of an older run
    lost_offsets_location: str | None = None  # where executors record skipped offsets (connectors.loss_records)

    def starting_for(self, streaming: bool) -> Position:
        """The starting position, defaulting as Spark's Kafka source does."""
        if self.starting is not None:
            return self.starting
        return Position("latest" if streaming else "earliest")

    def require_stream(self) -> None:
        """Checks only a streaming read needs; ConfigError naming the option."""
        if self.subscription is None:
            raise ConfigError(
                f"option {SUBSCRIPTION!r} is required for a streaming read: it names the Danube "
                "subscription whose cursor the query commits to etcd"
            )
        if self.ending is not None:
            raise ConfigError(
                f"options {ENDING_OFFSETS!r} and {ENDING_TIMESTAMP!r} are only valid for batch reads"
            )
        if self.salvage is not None:
            raise ConfigError(f"option {SALVAGE!r} is only valid for batch reads (spark.read)")

    def require_batch(self) -> None:
        """Checks only a batch read needs; ConfigError naming the option."""
        stream_only = {
            MAX_MESSAGES_PER_TRIGGER: self.max_messages_per_trigger,
            MAX_BYTES_PER_TRIGGER: self.max_bytes_per_trigger,
            MIN_MESSAGES_PER_TRIGGER: self.min_messages_per_trigger,
        }
        for key, value in stream_only.items():
            if value is not None:
                raise ConfigError(f"option {key!r} is only valid for streaming reads")
        if self.lost_offsets_location is not None:
            raise ConfigError(f"option {LOST_OFFSETS_LOCATION!r} is only valid for streaming reads")
        if self.starting is not None and self.starting.kind == "cursor" and self.subscription is None:
            raise ConfigError(f"option {STARTING_OFFSETS!r}='cursor' needs option {SUBSCRIPTION!r}")


def parse_options(raw: Mapping[str, str], *, etcd: EtcdSettings | None = None) -> DanubeOptions:
    """Validate every option of one read (keys matched case-insensitively).

    `etcd`: settings checked elsewhere (a command line's `--etcd` flags), used instead of the
    `etcd.*` options, which must then be absent: one source per setting, none ignored."""
    opts = _normalise(raw)
    if etcd is not None:
        given = [key for key in ETCD_OPTIONS if key.lower() in opts]
        if given:
            raise ConfigError(f"option {given[0]!r} is not accepted here: the etcd settings are given "
                              "separately (`python -m connectors`: --etcd and the --etcd-* flags)")
    salvage = _salvage(opts)
    options = DanubeOptions(
        etcd=_etcd(opts) if etcd is None else etcd,
        storage_url=values.required(opts, STORAGE_URL),
        storage_options=_storage_options(opts),
        root_prefix=_root_prefix(opts),
        wal_root=_wal_root(opts),
        topics=_topics(opts),
        topic_pattern=_topic_pattern(opts),
        namespace=_namespace(opts),
        starting=_starting(opts),
        ending=_ending(opts),
        max_messages_per_trigger=values.integer(opts, MAX_MESSAGES_PER_TRIGGER, minimum=1),
        max_bytes_per_trigger=values.size(opts, MAX_BYTES_PER_TRIGGER),
        min_messages_per_trigger=values.integer(opts, MIN_MESSAGES_PER_TRIGGER, minimum=1),
        max_trigger_delay_ms=values.duration_ms(opts, MAX_TRIGGER_DELAY, DEFAULT_MAX_TRIGGER_DELAY_MS),
        max_partition_bytes=values.size(opts, MAX_PARTITION_BYTES) or DEFAULT_MAX_PARTITION_BYTES,
        subscription=_subscription(opts),
        fail_on_data_loss=values.boolean(opts, FAIL_ON_DATA_LOSS, True),
        fail_on_missing_topic=values.boolean(opts, FAIL_ON_MISSING_TOPIC, False),
        include_source=salvage is not None or values.boolean(opts, INCLUDE_SOURCE, False),
        salvage=salvage,
        lost_offsets_location=values.get(opts, LOST_OFFSETS_LOCATION) or None,
    )
    _check_combinations(opts)
    return options


def _normalise(raw: Mapping[str, str]) -> dict[str, str]:
    """Lower-cased keys, Kafka aliases mapped; unknown keys (a typo would silently do nothing)
    are refused, Kafka source options with what to use instead."""
    opts: dict[str, str] = {}
    aliased: dict[str, str] = {}
    for key, value in raw.items():
        lower = key.lower()
        if lower in _KAFKA_ALIASES_LOWER:
            aliased[_KAFKA_ALIASES_LOWER[lower].lower()] = str(value)
            continue
        if lower in _KAFKA_EQUIVALENTS_LOWER:
            name, instead = _KAFKA_EQUIVALENTS_LOWER[lower]
            raise ConfigError(f"Kafka source option {name!r} is not a danube option; for the danube "
                              f"data source {instead}")
        if lower.startswith("kafka."):  # Kafka consumer properties, passed through by Kafka's source
            raise ConfigError(f"option {key!r} is a Kafka consumer property of Spark's Kafka source; the danube "
                              f"data source has no consumer: it reads etcd ({ETCD_ENDPOINTS!r}, 'etcd.*') "
                              f"and storage ({STORAGE_URL!r}, '{STORAGE_PREFIX}<fsspec option>')")
        if lower not in _BY_LOWER and not lower.startswith(STORAGE_PREFIX):
            raise ConfigError(
                f"unknown option {key!r} for the danube data source; accepted: "
                f"{', '.join(KNOWN_OPTIONS)} and {STORAGE_PREFIX}<fsspec storage option>"
            )
        opts[lower] = str(value)
    return {**aliased, **opts}


def parse_etcd(raw: Mapping[str, str]) -> EtcdSettings:
    """Only the `etcd.*` options (keys case-insensitive), e.g. for a cursor-committing listener."""
    return _etcd({key.lower(): str(value) for key, value in raw.items()})


def _etcd(opts: Mapping[str, str]) -> EtcdSettings:
    by_field = {
        "endpoints": values.required(opts, ETCD_ENDPOINTS),
        "user": values.get(opts, ETCD_USER) or None,
        "password": opts.get(ETCD_PASSWORD.lower()) or None,  # as given: blanks may be part of it
        "ca_cert": values.get(opts, ETCD_CA_CERT) or None,
        "cert_key": values.get(opts, ETCD_CERT_KEY) or None,
        "cert_cert": values.get(opts, ETCD_CERT_CERT) or None,
        "timeout_ms": values.get(opts, ETCD_TIMEOUT_MS),
    }
    return parse_etcd_settings(by_field, ETCD_KEY_NAMES, values.invalid)


def _storage_options(opts: Mapping[str, str]) -> dict[str, Any]:
    """`storage.options` (a JSON object) overlaid by dotted `storage.<a>.<b>` keys.

    Dotted keys become nested dicts (`storage.client_kwargs.endpoint_url`); their values are
    strings, except `true`/`false` which become booleans. Spark lower-cases option keys, so
    storage options whose names need capitals, or values of other types, go in the JSON.
    """
    result: dict[str, Any] = {}
    text = values.get(opts, STORAGE_OPTIONS)
    if text:
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise values.invalid(STORAGE_OPTIONS, text, "a JSON object of fsspec storage options") from exc
        if not isinstance(value, dict):
            raise values.invalid(STORAGE_OPTIONS, text, "a JSON object of fsspec storage options")
        result.update(value)
    for key in sorted(opts):
        if not key.startswith(STORAGE_PREFIX) or key in (STORAGE_URL.lower(), STORAGE_OPTIONS.lower()):
            continue
        path = key[len(STORAGE_PREFIX):].split(".")
        if any(not part for part in path):
            raise ConfigError(f"option {key!r}: empty name part in a storage option key")
        _set_nested(result, key, path, _storage_value(opts[key]))
    return result


def _set_nested(target: dict[str, Any], key: str, path: list[str], value: Any) -> None:
    node = target
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"option {key!r}: {part!r} is already set to a non-object value")
        node = child
    node[path[-1]] = value


def _storage_value(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    return text


def _root_prefix(opts: Mapping[str, str]) -> str:
    # Used exactly as configured (spec §5.2: the broker pastes it in without normalising).
    value = opts.get(ROOT_PREFIX.lower())
    if value is None:
        return DEFAULT_ROOT_PREFIX
    if not value.startswith("/") or any(ch.isspace() for ch in value):
        raise values.invalid(ROOT_PREFIX, value, "an etcd key prefix starting with '/' (e.g. /danube-data)")
    return value


def _wal_root(opts: Mapping[str, str]) -> str:
    value = values.get(opts, WAL_ROOT)
    if value is None or value.lower() in (WAL_AUTO, WAL_NONE):
        return WAL_AUTO if value is None else value.lower()
    if not value:
        raise values.invalid(WAL_ROOT, value, WAL_ROOT_FORMS)
    parse_wal_map(value)  # the JSON-map form is checked here, before any query starts
    return value


def _topics(opts: Mapping[str, str]) -> tuple[str, ...] | None:
    value = values.get(opts, TOPIC)
    if value is None:
        return None
    names: list[str] = []
    for part in value.split(","):
        name = part.strip()
        try:
            topic = TopicName.parse(name).broker_name
        except InvalidTopicNameError as exc:
            raise values.invalid(TOPIC, value, f"one or more comma-separated topic names ({exc})") from exc
        if topic not in names:
            names.append(topic)
    return tuple(names)


def _topic_pattern(opts: Mapping[str, str]) -> str | None:
    value = values.get(opts, TOPIC_PATTERN)
    if value is None:
        return None
    try:
        re.compile(value)
    except re.error as exc:
        raise values.invalid(TOPIC_PATTERN, value, f"a Python regular expression ({exc})") from exc
    return value


def _namespace(opts: Mapping[str, str]) -> str | None:
    value = values.get(opts, NAMESPACE)
    if value is None:
        return None
    try:
        # The namespace rule is the topic-name part rule; probe it through TopicName.
        TopicName(value, "probe")
    except InvalidTopicNameError as exc:
        raise values.invalid(NAMESPACE, value, "a namespace name (letters, digits, '_' and '-')") from exc
    return value


def _starting(opts: Mapping[str, str]) -> Position | None:
    accepted = ("'earliest', 'latest', 'cursor' or a JSON object {topic: offset} or, as Kafka's, "
                "{topic: {partition: offset}} (-2 earliest, -1 latest)")
    return _position(opts, STARTING_OFFSETS, STARTING_TIMESTAMP, ("earliest", "latest", "cursor"), accepted, EARLIEST)


def _ending(opts: Mapping[str, str]) -> Position | None:
    accepted = ("'latest' or a JSON object {topic: end-exclusive offset} or {topic: {partition: offset}} "
                "(-1 latest)")
    return _position(opts, ENDING_OFFSETS, ENDING_TIMESTAMP, ("latest",), accepted, LATEST)


def _position(
    opts: Mapping[str, str], offsets_key: str, timestamp_key: str, words: tuple[str, ...], accepted: str, lowest: int
) -> Position | None:
    text = values.get(opts, offsets_key)
    timestamp = values.integer(opts, timestamp_key, minimum=0)
    if text is not None and timestamp is not None:
        raise ConfigError(f"options {offsets_key!r} and {timestamp_key!r} exclude each other")
    if timestamp is not None:
        return Position("timestamp", timestamp_ms=timestamp)
    if text is None:
        return None
    if text.lower() in words:
        return Position(text.lower())
    return Position("offsets", offsets=_offsets_json(offsets_key, text, accepted, lowest))


def _offsets_json(key: str, text: str, accepted: str, lowest: int) -> dict[str, int]:
    """`{topic: offset}`, or Kafka's nested `{topic: {"<partition>": offset}}` (partition N of
    a partitioned topic is `<topic>-part-N`; partition 0 of an unpartitioned one is the topic)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise values.invalid(key, text, accepted) from exc
    if not isinstance(value, dict) or not value:
        raise values.invalid(key, text, accepted)
    offsets: dict[str, int] = {}
    for name, offset in value.items():
        try:
            topic = TopicName.parse(name).broker_name
        except InvalidTopicNameError as exc:
            raise values.invalid(key, text, f"{accepted}; {exc}") from exc
        per_partition = offset.items() if isinstance(offset, dict) else [(None, offset)]
        for partition, value_ in per_partition:
            if partition is not None and not (isinstance(partition, str) and partition.isdigit()):
                raise values.invalid(key, text, f"{accepted}; topic {name!r} has partition {partition!r}")
            if type(value_) is not int or not lowest <= value_ < 2**64:
                raise values.invalid(key, text, f"{accepted}; topic {name!r} has offset {value_!r}")
            offsets[topic if partition is None else f"{topic}-part-{int(partition)}"] = value_
    return offsets


def _salvage(opts: Mapping[str, str]) -> tuple[str, ...] | None:
    """Object ids and WAL file URLs to read whole, for one topic, with their provenance."""
    value = values.get(opts, SALVAGE)
    if value is None:
        return None
    from danube_core.objectstore import OBJECT_ID_PATTERN  # fsspec: ~0.1 s, only when asked for

    names = tuple(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))
    accepted = ("comma-separated object ids (data-<start>-<secs>.dnb1) and WAL file URLs or paths, "
                "as `python -m connectors.topic_inspector runs` lists them")
    if not names or any(not OBJECT_ID_PATTERN.match(n) and "/" not in n for n in names):
        raise values.invalid(SALVAGE, value, accepted)
    topics = values.get(opts, TOPIC)
    if topics is None or "," in topics:
        raise ConfigError(f"option {SALVAGE!r} needs option {TOPIC!r} naming exactly one topic "
                          "(a partition's own name for a partitioned topic)")
    clashing = [k for k in (STARTING_OFFSETS, STARTING_TIMESTAMP, ENDING_OFFSETS, ENDING_TIMESTAMP)
                if k.lower() in opts]
    if clashing:
        raise ConfigError(f"option {SALVAGE!r} reads the named sources whole; it excludes "
                          f"{', '.join(repr(k) for k in clashing)}")
    return names


def _subscription(opts: Mapping[str, str]) -> str | None:
    value = values.get(opts, SUBSCRIPTION)
    if value is None:
        return None
    if not value or "/" in value or any(ch.isspace() or not ch.isprintable() for ch in value):
        raise values.invalid(SUBSCRIPTION, value, "a subscription name without '/' or whitespace")
    return value


def _check_combinations(opts: Mapping[str, str]) -> None:
    chosen = [key for key in (TOPIC, TOPIC_PATTERN, NAMESPACE) if key.lower() in opts]
    if len(chosen) != 1:
        raise ConfigError(
            f"exactly one of the options {TOPIC!r}, {TOPIC_PATTERN!r}, {NAMESPACE!r} must be set "
            f"(got {', '.join(repr(k) for k in chosen) or 'none'})"
        )
    if MAX_TRIGGER_DELAY.lower() in opts and MIN_MESSAGES_PER_TRIGGER.lower() not in opts:
        raise ConfigError(f"option {MAX_TRIGGER_DELAY!r} needs option {MIN_MESSAGES_PER_TRIGGER!r}")
