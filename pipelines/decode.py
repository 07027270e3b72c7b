"""Payload bytes -> columns, per micro-batch: raw, JSON (registry or inline JSON Schema), Avro.

`Decoder.prepare` turns the `danube` source's rows into the pipeline's metadata columns (`_topic` is a
partition's own broker name, so `(_topic, _offset)` identifies a message). `Decoder.decode`
then adds the payload's columns. With a registry subject, each message is decoded with the
schema version it names (`schema_id`/`schema_version`, when the id is the subject's), else
with `decode.version`, else the subject's latest version, read once per batch: a version
registered while the query runs is used from the next batch on, and Delta's schema merge adds
its new columns. Rows of different versions are decoded separately and unioned by name (for a
subject of a few versions, planned from the registry alone: no Spark job looks for the versions
a batch names first).
A message that names no version is decoded with the latest version at the time; the sink
records that version (and the schema id) with the batch's first write and passes them back
when Spark replays the batch, so a replay decodes every message exactly as the first attempt
did, whatever was registered in between (`pipelines.batch_trail`).

Nothing is dropped: a payload that does not match its schema gets a reason in `_decode_error`
(and goes to quarantine), or, with `on_error: rescue`, stays with its text in `_rescued_data`.
JSON fields the schema does not know also go to `_rescued_data` (a JSON object of their text).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import MapType, StringType, StructField, StructType

from danube_core.errors import ConfigError, DanubeError
from danube_core.schema_records import SchemaVersion
from pipelines.config import DecodeConfig
from pipelines.expressions import ExpressionCache
from pipelines.json_schema import JsonPayloadSchema, parse_json_schema
from pipelines.subject_schemas import SubjectSchemas

logger = logging.getLogger(__name__)

META_COLUMNS = (
    "_topic", "_partition", "_offset", "_publish_time", "_producer_name",
    "_schema_id", "_schema_version", "_source", "_attributes",
)
PAYLOAD = "payload"
DECODE_ERROR = "_decode_error"
RESCUED = "_rescued_data"
_CORRUPT = "_corrupt_record"
_VERSION = "_decode_version"
_PARSED = "_parsed"
_PREPARED = (*META_COLUMNS, PAYLOAD)  # what `prepare` gives, in order
# a subject with at most this many versions is decoded without first listing the versions a batch names
PLANNED_VERSIONS = 8


@dataclass(frozen=True)
class PayloadSchema:
    """One schema to decode with: `kind` JsonSchema | Avro, its text, and where it came from."""

    kind: str
    text: str
    label: str


class Decoder:
    """Adds the payload's columns, `_rescued_data` and `_decode_error` to prepared rows.

    Why the column expressions are built once per schema and reused: every PySpark function
    call and every DataFrame step is a round trip to the JVM (a step also analyses the plan),
    and building a batch's decode step by step took a few hundred milliseconds of each
    micro-batch (`pipelines.expressions`). Each part of a batch is now two projections over its
    filtered rows, with every column and condition built once for the decoder's life."""

    def __init__(self, config: DecodeConfig, schemas: SubjectSchemas | None = None) -> None:
        if config.subject is not None and schemas is None:
            raise ConfigError(f"decode.subject={config.subject!r} needs the schema registry (etcd)")
        self.config = config
        self.schemas = schemas
        self._json_cache: dict[str, JsonPayloadSchema] = {}
        self._projections: dict[PayloadSchema, _Projection] = {}
        self._expressions = ExpressionCache()
        if config.inline_schema is not None:
            self._check(self._inline())

    def prepare(self, batch: DataFrame) -> DataFrame:
        """The source's columns renamed into the pipeline's metadata columns (+ `payload`)."""
        has_source = "source" in batch.columns

        def renames() -> list[Column]:
            partition_topic = F.concat(F.col("topic"), F.lit("-part-"), F.col("partition").cast("string"))
            return [
                F.when(F.col("partition").isNull(), F.col("topic")).otherwise(partition_topic).alias("_topic"),
                F.col("partition").alias("_partition"),
                F.col("offset").alias("_offset"),
                F.col("publish_time").alias("_publish_time"),
                F.col("producer_name").alias("_producer_name"),
                F.col("schema_id").cast("long").alias("_schema_id"),
                F.col("schema_version").alias("_schema_version"),
                (F.col("source") if has_source else F.lit(None).cast("string")).alias("_source"),
                F.col("attributes").alias("_attributes"),
                F.col("payload").alias(PAYLOAD),
            ]

        return batch.select(*self._expressions.get(("prepare", has_source), renames))

    def resolve_versions(self) -> tuple[int | None, int | None]:
        """(the subject's schema id, the version for messages that name none), read now.

        (None, None) without a registry subject. The sink records both with a batch's first
        write and passes them back to `decode` when the batch is replayed.
        """
        if self.schemas is None or self.config.format == "raw":
            return None, None
        return self._subject_versions()

    def _subject_versions(self) -> tuple[int, int]:
        """`resolve_versions` for a decoder with a registry subject."""
        assert self.schemas is not None, "called only for a decoder with a registry subject"
        meta = self.schemas.subject_metadata()
        return meta.id, self.config.version or meta.latest_version

    def decode(self, prepared: DataFrame, versions: tuple[int | None, int | None] | None = None) -> DataFrame:
        """Decode one batch; the result has every prepared column plus the payload's.

        `versions`: (schema id, default version) as `resolve_versions` gave them, to decode a
        replayed batch exactly as its first attempt did; resolved now when None.
        """
        if self.config.format == "raw":
            return prepared.withColumn(DECODE_ERROR, self._expressions.get("no error", lambda: F.lit(None).cast("string")))
        if self.schemas is None:
            return self._decode_with(prepared, self._inline())
        if versions is not None and versions[1] is not None:
            schema_id, default = versions[0], versions[1]
        else:
            schema_id, default = self._subject_versions()
        return self._decode_versions(prepared, schema_id, default)

    def inline_schema(self) -> PayloadSchema:
        """The schema `decode.inline_schema` names (a decoder without a registry subject)."""
        return self._inline()

    def version_schema(self, version: int) -> PayloadSchema | str:
        """The registry version's schema, or why rows naming it cannot be decoded."""
        return self._version_schema(version)

    def json_schema(self, schema: PayloadSchema) -> JsonPayloadSchema:
        """`schema` parsed (once per text) and checked against the pipeline's own columns."""
        self._check(schema)
        return self._json(schema)

    def _inline(self) -> PayloadSchema:
        kind = "JsonSchema" if self.config.format == "json" else "Avro"
        return PayloadSchema(kind, self.config.inline_schema or "", "decode.inline_schema")

    def _decode_versions(self, prepared: DataFrame, schema_id: int | None, default: int) -> DataFrame:
        """Each row decoded with the version it names (else `default`), one union of per-version parts.

        Which versions get a part: where the subject has at most `PLANNED_VERSIONS` versions
        (registered, or loaded earlier by this decoder), one part for each of them and one that
        quarantines rows naming any other version, planned without looking at the rows; else
        the versions the batch's rows name, found with one Spark job over the batch. A subject
        of one version is decoded in a single projection that also quarantines the rows naming
        another version. Where the plan reads `prepared` more than once, it is persisted here
        (the caller unpersists it after the batch)."""
        assert self.schemas is not None

        def row_version() -> Column:
            named = (F.col("_schema_id") == F.lit(schema_id)) & F.col("_schema_version").isNotNull()
            return F.when(named, F.col("_schema_version")).otherwise(F.lit(default))

        version = self._expressions.get(("version", schema_id, default), row_version)
        parts = self._planned_parts(prepared, version, schema_id, default)
        if parts is None:
            prepared.persist()  # read by the job that lists the versions, then by each part
            found = prepared.select(version.alias(_VERSION)).distinct().collect()
            parts = [self._decode_version(prepared.filter(version == v), v) for v in sorted(row[0] for row in found)]
        elif len(parts) > 1:
            prepared.persist()  # read by each part
        if not parts:
            return self._decode_version(prepared, default)
        return reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)

    def _planned_parts(self, prepared: DataFrame, version: Column, schema_id: int | None,
                       default: int) -> list[DataFrame] | None:
        """A part per known version plus the unknown-version part; None when there are too many
        versions to plan, or a known version could not decode a batch that names it (a payload
        field that clashes with the pipeline's columns: only a batch that uses it may fail)."""
        assert self.schemas is not None
        known = sorted(self.schemas.known_versions() | {default})
        if len(known) > PLANNED_VERSIONS:
            return None
        subject = self.schemas.subject

        def conditions() -> tuple[list[Column], Column, Column]:
            label = F.concat(F.lit(f"schema registry subject {subject!r} version "), version.cast("string"))
            reason = F.concat(label, F.lit(f" cannot be loaded: the subject has versions {known} only"))
            return [version == v for v in known], ~version.isin(known), reason

        per_version, unknown, reason = self._expressions.get(("planned", schema_id, default, *known), conditions)
        if len(known) == 1:
            schema = self._version_schema(known[0])
            if isinstance(schema, PayloadSchema):
                try:
                    self._check(schema)
                except ConfigError:
                    return None
                return [self._decode_with(prepared, schema, (unknown, reason, (schema_id, default)))]
        try:
            parts = [self._decode_version(prepared.filter(rows), v) for rows, v in zip(per_version, known)]
        except ConfigError:
            return None
        return [*parts, self._failed(prepared.filter(unknown), reason, ("unknown", schema_id, default, *known))]

    def _decode_version(self, rows: DataFrame, version: int) -> DataFrame:
        schema = self._version_schema(version)
        if not isinstance(schema, PayloadSchema):
            return self._failed(rows, F.lit(schema))
        self._check(schema)
        return self._decode_with(rows, schema)

    def _version_schema(self, version: int) -> PayloadSchema | str:
        """The registry version's schema, or why rows naming it cannot be decoded."""
        assert self.schemas is not None
        label = f"schema registry subject {self.schemas.subject!r} version {version}"
        try:
            found: SchemaVersion = self.schemas.version(version)
        except DanubeError as exc:
            logger.warning("%s: cannot load it (%s); its rows go to quarantine", label, exc)
            return f"{label} cannot be loaded: {exc}"
        wanted = "JsonSchema" if self.config.format == "json" else "Avro"
        if found.schema_def.kind != wanted:
            return f"{label} is a {found.schema_def.kind} schema, decode.format {self.config.format} needs {wanted}"
        return PayloadSchema(wanted, found.schema_def.raw_schema or "", label)

    def _failed(self, rows: DataFrame, reason: Column, key: tuple | None = None) -> DataFrame:
        """`rows` undecoded: their payload rescued as text and `reason` as the decode error.

        `key`: what names `reason` for the decoder's life, so the columns are built once."""
        def columns() -> list[Column]:
            return [*self._prepared(), self._rescue_text().alias(RESCUED), reason.alias(DECODE_ERROR)]

        return rows.select(*(columns() if key is None else self._expressions.get(("failed", *key), columns)))

    def _decode_with(self, rows: DataFrame, schema: PayloadSchema,
                     others: tuple[Column, Column, tuple] | None = None) -> DataFrame:
        """`rows` decoded with `schema`, as two selects built once per schema.

        `others` = (condition, reason, key): rows meeting the condition are not decoded but
        quarantined with `reason` (their payload rescued as text), as `_failed` does; `key`
        names the condition and reason for the decoder's life."""
        if schema not in self._projections:
            self._projections[schema] = (self._json_projection(self._json(schema)) if schema.kind == "JsonSchema"
                                         else self._avro_projection(schema))
        projection = self._projections[schema]
        if others is None:
            parsing, outputs = self._expressions.get(("decode", schema), lambda: projection.selects(self._prepared()))
        else:
            excluded, reason, key = others
            parsing, outputs = self._expressions.get(("decode", schema, *key), lambda: projection.selects(
                self._prepared(), (excluded, reason, self._rescue_text())))
        return rows.select(*parsing).select(*outputs)

    def _prepared(self) -> list[Column]:
        """The columns `prepare` gives, as built once (a name passed to `select` costs a JVM call)."""
        return self._expressions.get("prepared", lambda: [F.col(name) for name in _PREPARED])

    def _json(self, schema: PayloadSchema) -> JsonPayloadSchema:
        if schema.text not in self._json_cache:
            self._json_cache[schema.text] = parse_json_schema(schema.text, schema.label)
        return self._json_cache[schema.text]

    def _check(self, schema: PayloadSchema) -> None:
        """Payload fields must not shadow the pipeline's own columns."""
        names = self._json(schema).field_names if schema.kind == "JsonSchema" else _avro_field_names(schema)
        clash = sorted(set(names) & set(META_COLUMNS + (PAYLOAD, DECODE_ERROR, RESCUED)))
        if clash:
            raise ConfigError(f"{schema.label}: payload fields {clash} clash with the pipeline's own columns")

    def _json_projection(self, schema: JsonPayloadSchema) -> _Projection:
        text = F.col(PAYLOAD).cast("string")
        with_corrupt = StructType(schema.struct.fields + [StructField(_CORRUPT, StringType())])
        parsed = F.from_json(text, with_corrupt, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT})
        names = list(schema.field_names)
        # The ignore: from_json takes a MapType schema too; pyspark's annotation lists only the others.
        as_map = F.from_json(text, MapType(StringType(), StringType()))  # type: ignore[arg-type]
        extra = F.map_filter(as_map, lambda k, _: ~k.isin(*names))
        missing = F.concat_ws(", ", *[F.when(F.col(_PARSED)[r].isNull(), F.lit(r)) for r in schema.required])
        error = (
            F.when(F.col(PAYLOAD).isNull() | (F.length(F.col(PAYLOAD)) == 0), F.lit("empty payload"))
            .when(F.col(_PARSED)[_CORRUPT].isNotNull(), F.lit("payload is not a JSON object matching the schema"))
            .when(missing != "", F.concat(F.lit("missing required field(s): "), missing))
        )
        return self._projection(parsed, [F.col(_PARSED)[n].alias(n) for n in names], error,
                                F.when(F.size(extra) > 0, F.to_json(extra)))

    def _avro_projection(self, schema: PayloadSchema) -> _Projection:
        """from_avro in PERMISSIVE mode; a failed record comes back as nulls, not as an error.

        Spark returns a struct of nulls for a record it cannot read, so a payload is reported
        as not matching when the struct is null or a field Avro declares non-nullable is null
        (a correct read never yields that). A schema whose fields are all nullable cannot tell
        an unreadable payload from a record of nulls; such rows pass as nulls.
        """
        from pyspark.sql.avro.functions import from_avro

        names = _avro_field_names(schema)
        parsed = from_avro(F.col(PAYLOAD), schema.text, {"mode": "PERMISSIVE"})
        unreadable = F.col(_PARSED).isNull()
        for name in _avro_required_fields(schema):
            unreadable = unreadable | F.col(_PARSED)[name].isNull()
        error = F.when(F.col(PAYLOAD).isNull(), F.lit("empty payload")).when(
            unreadable, F.lit("payload is not Avro data of the schema")
        )
        columns = [F.col(_PARSED)[n].alias(n) for n in names] if names else [F.col(_PARSED).alias("value")]
        return self._projection(parsed, columns, error, F.lit(None).cast("string"))

    def _projection(self, parsed: Column, data: list[Column], error: Column, rescued: Column) -> _Projection:
        """Data + `_rescued_data` + `_decode_error`; `on_error` rescue keeps a failed row's payload."""
        if self.config.on_error == "rescue":
            rescued = F.when(error.isNotNull(), self._rescue_text()).otherwise(rescued)
            error = F.lit(None).cast("string")
        return _Projection(parsed, data, rescued, error)

    def _rescue_text(self) -> Column:
        """The payload as text (JSON) or base64 (Avro bytes are not text)."""
        if self.config.format == "avro":
            return self._expressions.get("rescue", lambda: F.base64(F.col(PAYLOAD)))
        return self._expressions.get("rescue", lambda: F.col(PAYLOAD).cast("string"))


@dataclass(frozen=True)
class _Projection:
    """One schema's decode: `parsed` (the payload's struct, selected as `_PARSED`), the data
    columns computed from it (aliased), `_rescued_data` and `_decode_error` (not aliased)."""

    parsed: Column
    data: list[Column]
    rescued: Column
    error: Column

    def selects(self, prepared: list[Column],
                others: tuple[Column, Column, Column] | None = None) -> tuple[list[Column], list[Column]]:
        """The two selects' columns, each keeping `prepared`. `others` = (condition, reason,
        rescued text): rows meeting the condition get no parse, `reason` as the decode error
        and their payload as rescued text."""
        parsed, rescued, error = self.parsed, self.rescued, self.error
        if others is not None:
            excluded, reason, text = others
            parsed = F.when(~excluded, parsed)
            rescued = F.when(excluded, text).otherwise(rescued)
            error = F.when(excluded, reason).otherwise(error)
        return ([*prepared, parsed.alias(_PARSED)],
                [*prepared, *self.data, rescued.alias(RESCUED), error.alias(DECODE_ERROR)])


def _avro_fields(schema: PayloadSchema) -> list[dict]:
    """Top-level fields of an Avro record schema (empty for a non-record schema)."""
    try:
        parsed = json.loads(schema.text)
    except ValueError as exc:
        raise ConfigError(f"{schema.label}: the Avro schema is not valid JSON: {exc}") from exc
    if isinstance(parsed, dict) and parsed.get("type") == "record":
        return [f for f in parsed.get("fields", []) if isinstance(f, dict) and "name" in f]
    return []


def _avro_field_names(schema: PayloadSchema) -> tuple[str, ...]:
    return tuple(f["name"] for f in _avro_fields(schema))


def _avro_required_fields(schema: PayloadSchema) -> tuple[str, ...]:
    """Fields whose type admits no null (not "null", not a union containing "null")."""
    def nullable(kind: object) -> bool:
        return kind == "null" or (isinstance(kind, list) and "null" in kind)

    return tuple(f["name"] for f in _avro_fields(schema) if not nullable(f.get("type")))
