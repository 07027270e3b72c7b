"""How the topic browser shows one message: its offset, publish time, attributes and payload,
the payload decoded with the schema it was published under (the message's schema id and
version, else the topic's subject's latest) when the registry has one.

JSON Schema payloads are shown parsed and indented; Avro payloads (the schemaless binary
encoding `from_avro` reads in the pipelines) decoded with fastavro and shown as JSON, in the
schema's field order (bytes and fixed as hex, dates and times in ISO 8601, decimals and uuids
as strings); String and Number payloads as text. An Avro payload that does not decode with
its schema is shown as hex with fastavro's error, never failing the page; a JSON or text
payload that does not parse, raw with the reason. Protobuf payloads are shown as hex: the
registry holds the `.proto` text, and the protobuf runtime builds descriptors only from
compiled ones (protoc's `FileDescriptorProto`s), it has no `.proto` parser. A payload with no
schema is shown as text when it is UTF-8 and printable, else as hex (its first `PREVIEW_BYTES`).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from datetime import date, datetime, time, timezone
from decimal import Decimal
from functools import lru_cache
from typing import Any
from uuid import UUID

import fastavro

from danube_core import keys
from danube_core.errors import DanubeError
from danube_core.message import StreamMessage
from danube_core.records import parse_string
from danube_core.schema_records import SchemaDef
from danube_core.schema_registry import SchemaRegistry

from console.topics import KeyReader

PREVIEW_BYTES = 1024
TEXT_KINDS = ("String", "Number")
PROTOBUF_NOTE = "Protobuf payloads are shown as bytes: decoding needs the .proto compiled"


@dataclass(frozen=True)
class MessageRow:
    offset: int
    publish_time: str  # UTC, milliseconds
    producer: str
    attributes: dict[str, str]
    schema: str | None  # "subject v<n> (Kind)"
    shown_as: str  # json | text | hex
    payload: str
    note: str | None = None  # why it is not shown decoded
    size: int = 0


class PayloadDecoder:
    """Decodes the messages of one page; schemas looked up once per (id, version)."""

    def __init__(self, cache: KeyReader, topic: str) -> None:
        self._registry = SchemaRegistry(cache)  # type: ignore[arg-type]  # its reads are `get` only
        self._cache = cache
        self._topic = topic
        self._schemas: dict[tuple[int | None, int | None], tuple[str, SchemaDef] | None] = {}

    def row(self, msg: StreamMessage) -> MessageRow:
        schema = self._schema(msg.schema_id, msg.schema_version)
        label = f"{schema[0]} ({schema[1].kind})" if schema is not None else None
        shown, payload, note = show_payload(msg.payload, schema[1] if schema is not None else None)
        published = datetime.fromtimestamp(msg.publish_time / 1000, tz=timezone.utc)
        return MessageRow(msg.msg_id.topic_offset, published.isoformat(timespec="milliseconds"), msg.producer_name,
                          dict(msg.attributes), label, shown, payload, note, len(msg.payload))

    def _schema(self, schema_id: int | None, version: int | None) -> tuple[str, SchemaDef] | None:
        key = (schema_id, version)
        if key not in self._schemas:
            self._schemas[key] = self._lookup(schema_id, version)
        return self._schemas[key]

    def _lookup(self, schema_id: int | None, version: int | None) -> tuple[str, SchemaDef] | None:
        try:
            if schema_id is not None:
                subject = self._registry.subject_of(schema_id)
            else:
                raw = self._cache.get(keys.schema_subject_key(self._topic))
                if raw is None:
                    return None
                subject = parse_string(raw, keys.schema_subject_key(self._topic))
            _, found = self._registry.version(subject, version)
        except DanubeError:
            return None
        return f"{subject} v{found.version}", found.schema_def


def show_payload(payload: bytes, schema: SchemaDef | None) -> tuple[str, str, str | None]:
    """(shown as, text, note): decoded where the schema allows, else text or hex."""
    if schema is not None and schema.kind == "JsonSchema":
        try:
            return "json", json.dumps(json.loads(payload), indent=2, sort_keys=True, ensure_ascii=False), None
        except ValueError as exc:
            return (*_raw(payload), f"not JSON although its schema is a JSON Schema: {exc}")
    if schema is not None and schema.kind == "Avro":
        return _show_avro(payload, schema.raw_schema or "")
    if schema is not None and schema.kind in TEXT_KINDS:
        try:
            return "text", payload.decode("utf-8"), None
        except UnicodeDecodeError as exc:
            return (*_raw(payload), f"not UTF-8 text: {exc}")
    if schema is not None and schema.kind == "Protobuf":
        return "hex", _hex(payload), PROTOBUF_NOTE
    return (*_raw(payload), None)  # no schema, or Bytes


def _show_avro(payload: bytes, raw_schema: str) -> tuple[str, str, str | None]:
    """An Avro payload as indented JSON; as hex with the reason when it does not decode."""
    parsed, problem = _avro_schema(raw_schema)
    if parsed is None:
        return "hex", _hex(payload), f"its Avro schema does not parse: {problem}"
    buf = io.BytesIO(payload)
    try:
        record = fastavro.schemaless_reader(buf, parsed)
    except Exception as exc:
        # Bytes that are not this schema's data lead fastavro's reader into whatever the wrong
        # bytes ask for (EOFError, IndexError for a union branch or enum symbol, UnicodeDecodeError,
        # its own ReadError, ...); each means the same to someone browsing: not a record of it.
        return "hex", _hex(payload), f"not Avro data of its schema: {_reason(exc)}"
    text = json.dumps(record, indent=2, ensure_ascii=False, default=_json_value)
    left = len(payload) - buf.tell()
    # from_avro ignores bytes after the record too; they usually mean another schema wrote it
    return "json", text, f"{left} byte(s) left after the record: written with another schema?" if left else None


@lru_cache(maxsize=64)
def _avro_schema(raw_schema: str) -> tuple[Any, str | None]:
    """(the parsed schema, None) or (None, why it does not parse); parsed once per text."""
    try:
        return fastavro.parse_schema(json.loads(raw_schema)), None
    except Exception as exc:
        # parse_schema raises SchemaParseException, UnknownType, but also KeyError, TypeError
        # or AttributeError for a malformed definition; the registry checks only its JSON.
        return None, _reason(exc)


def _json_value(value: Any) -> Any:
    """What `json.dumps` cannot write of fastavro's values: bytes, logical types (else its repr)."""
    if isinstance(value, (bytes, bytearray)):
        return value.hex(" ")
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, (Decimal, UUID)):
        return str(value)
    return repr(value)


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _raw(payload: bytes) -> tuple[str, str]:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and all(ch.isprintable() or ch in "\n\r\t" for ch in text):
        return "text", text
    return "hex", _hex(payload)


def _hex(payload: bytes) -> str:
    head = payload[:PREVIEW_BYTES].hex(" ")
    return head + (f" … ({len(payload)} bytes)" if len(payload) > PREVIEW_BYTES else "")
