"""JSON Schema (as registered in Danube's schema registry) -> the Spark struct `from_json` parses into.

Only the structural part of JSON Schema maps onto Spark types: `type` (a name or a list with
"null"), `properties` (in the order the schema lists them), `items`, and
`additionalProperties`. Anything Spark cannot type (`oneOf`, `$ref`, a property with no type)
becomes a string column that holds the value's JSON text, so nothing in a payload is dropped.
Top-level `required` names are kept for the decoder, which treats a missing required field as
a payload that does not match its schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from danube_core.errors import ConfigError

_SCALARS: dict[str, DataType] = {
    "string": StringType(),
    "integer": LongType(),
    "number": DoubleType(),
    "boolean": BooleanType(),
}


@dataclass(frozen=True)
class JsonPayloadSchema:
    """What decoding a JSON payload needs: the Spark struct and the required top-level fields."""

    struct: StructType
    required: tuple[str, ...]

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(self.struct.fieldNames())


def parse_json_schema(raw_schema: str, where: str) -> JsonPayloadSchema:
    """Convert a JSON Schema text; ConfigError naming `where` (subject/version or config key)."""
    try:
        schema = json.loads(raw_schema)
    except ValueError as exc:
        raise ConfigError(f"{where}: the JSON schema is not valid JSON: {exc}") from exc
    if not isinstance(schema, dict) or _type_name(schema) != "object" or not isinstance(schema.get("properties"), dict):
        raise ConfigError(
            f"{where}: a payload schema must be a JSON Schema of type 'object' with 'properties' "
            f"(each property becomes a column), got {raw_schema[:200]!r}"
        )
    struct = _to_spark(schema)
    required = schema.get("required") or []
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ConfigError(f"{where}: 'required' must be a list of property names, got {required!r}")
    assert isinstance(struct, StructType)
    return JsonPayloadSchema(struct, tuple(r for r in required if r in struct.fieldNames()))


def _type_name(node: dict) -> str | None:
    """The node's type, ignoring "null" in a type list (nullability is Spark's default)."""
    declared = node.get("type")
    if isinstance(declared, list):
        names = [t for t in declared if t != "null"]
        return names[0] if len(names) == 1 else None
    if declared is None and isinstance(node.get("properties"), dict):
        return "object"
    return declared if isinstance(declared, str) else None


def _to_spark(node: Any) -> DataType:
    if not isinstance(node, dict):
        return StringType()
    name = _type_name(node)
    if name in _SCALARS:
        return _SCALARS[name]
    if name == "array":
        return ArrayType(_to_spark(node.get("items")), containsNull=True)
    if name == "object":
        properties = node.get("properties")
        if isinstance(properties, dict) and properties:
            return StructType([StructField(key, _to_spark(sub), nullable=True) for key, sub in properties.items()])
        additional = node.get("additionalProperties")
        return MapType(StringType(), _to_spark(additional) if isinstance(additional, dict) else StringType())
    return StringType()
