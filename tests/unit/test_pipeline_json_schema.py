"""JSON Schema -> Spark struct for the JSON decoder (pure: no JVM)."""

from __future__ import annotations

import json

import pytest
from pyspark.sql.types import ArrayType, BooleanType, DoubleType, LongType, MapType, StringType

from danube_core.errors import ConfigError
from pipelines.json_schema import parse_json_schema

pytestmark = pytest.mark.unit


def test_properties_become_typed_columns_in_schema_order():
    schema = parse_json_schema(json.dumps({
        "type": "object",
        "properties": {
            "order_id": {"type": "string"},
            "amount": {"type": "number"},
            "qty": {"type": ["integer", "null"]},
            "paid": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "address": {"type": "object", "properties": {"city": {"type": "string"}}},
            "extra": {"type": "object"},
            "either": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        },
        "required": ["order_id", "not_a_property"],
    }), "subject orders v1")
    fields = {f.name: f.dataType for f in schema.struct.fields}
    assert list(fields) == ["order_id", "amount", "qty", "paid", "tags", "address", "extra", "either"]
    assert fields["order_id"] == StringType() and fields["amount"] == DoubleType()
    assert fields["qty"] == LongType() and fields["paid"] == BooleanType()
    assert fields["tags"] == ArrayType(StringType(), True)
    assert fields["address"].fieldNames() == ["city"]
    assert fields["extra"] == MapType(StringType(), StringType())
    assert fields["either"] == StringType()  # untyped values keep their JSON text
    assert schema.required == ("order_id",)


@pytest.mark.parametrize("text", ["{nope", '{"type": "string"}', '{"type": "object"}', "[1, 2]"])
def test_schemas_that_cannot_give_columns_are_refused_naming_where(text):
    with pytest.raises(ConfigError, match="subject orders v2"):
        parse_json_schema(text, "subject orders v2")
