"""How the topic browser shows one message: its offset, publish time, attributes and payload,
the payload decoded with the schema it was published under (the message's schema id and
version, else the topic's subject's latest) when the registry has one.

JSON Schema payloads are shown parsed and indented; String and Number payloads as text. A
payload with no schema, or one whose schema the console does not decode (Avro, Protobuf need
their own decoders, which the console does not ship), is shown as text when it is UTF-8 and
printable, else as hex (its first `PREVIEW_BYTES`), with the schema named.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone

from danube_core import keys
from danube_core.errors import DanubeError
from danube_core.message import StreamMessage
from danube_core.records import parse_string
from danube_core.schema_records import SchemaDef
from danube_core.schema_registry import SchemaRegistry

from console.topics import KeyReader

PREVIEW_BYTES = 1024
TEXT_KINDS = ("String", "Number")


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
    if schema is not None and schema.kind in TEXT_KINDS:
        try:
            return "text", payload.decode("utf-8"), None
        except UnicodeDecodeError as exc:
            return (*_raw(payload), f"not UTF-8 text: {exc}")
    if schema is not None and schema.kind != "Bytes":
        return (*_raw(payload), f"{schema.kind} payloads are not decoded by the console")
    return (*_raw(payload), None)


def _raw(payload: bytes) -> tuple[str, str]:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and all(ch.isprintable() or ch in "\n\r\t" for ch in text):
        return "text", text
    head = payload[:PREVIEW_BYTES].hex(" ")
    return "hex", head + (f" … ({len(payload)} bytes)" if len(payload) > PREVIEW_BYTES else "")
