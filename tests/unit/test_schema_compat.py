"""Compatibility of a subject's next version, per mode, for JSON Schema, Avro and the other kinds."""

from __future__ import annotations

import json

import pytest

from danube_core.schema_compat import incompatibilities
from danube_core.schema_registry import InvalidSchemaError, schema_def


def _json(properties: dict, required: list[str]):
    return schema_def("json_schema", json.dumps({"type": "object", "properties": properties, "required": required}))


def _avro(fields: list[dict]):
    return schema_def("avro", json.dumps({"type": "record", "name": "Order", "fields": fields}))


ID = {"order_id": {"type": "string"}}


@pytest.mark.parametrize("mode, errors", [("none", 0), ("backward", 0), ("forward", 0), ("full", 0)])
def test_an_added_optional_field_is_compatible_both_ways(mode, errors):
    old, new = _json(ID, ["order_id"]), _json({**ID, "note": {"type": "string"}}, ["order_id"])
    assert len(incompatibilities(mode, old, new)) == errors


def test_a_new_required_field_breaks_backward_but_not_forward():
    old, new = _json(ID, ["order_id"]), _json({**ID, "amount": {"type": "number"}}, ["order_id", "amount"])
    assert incompatibilities("backward", old, new) == [
        "field 'amount' is required by the new schema but missing from the previous version"]
    assert incompatibilities("forward", old, new) == []
    assert len(incompatibilities("full", old, new)) == 1


def test_a_removed_required_field_breaks_forward():
    old, new = _json({**ID, "amount": {"type": "number"}}, ["order_id", "amount"]), _json(ID, ["order_id"])
    assert incompatibilities("backward", old, new) == []
    assert incompatibilities("forward", old, new) == [
        "field 'amount' is required by the previous version but missing from the new schema"]


def test_a_changed_type_breaks_every_mode_but_none():
    old, new = _json(ID, ["order_id"]), _json({"order_id": {"type": "integer"}}, ["order_id"])
    for mode in ("backward", "forward", "full"):
        assert incompatibilities(mode, old, new) == ['field \'order_id\' changed type from "string" to "integer"']
    assert incompatibilities("none", old, new) == []


def test_avro_fields_with_defaults_are_optional():
    old = _avro([{"name": "id", "type": "string"}])
    with_default = _avro([{"name": "id", "type": "string"}, {"name": "n", "type": "int", "default": 0}])
    without_default = _avro([{"name": "id", "type": "string"}, {"name": "n", "type": "int"}])
    assert incompatibilities("backward", old, with_default) == []
    assert incompatibilities("backward", old, without_default) == [
        "field 'n' is required by the new schema but missing from the previous version"]


def test_kind_changes_and_protobuf_edits_are_refused_unless_mode_is_none():
    string, number = schema_def("string", ""), schema_def("number", "")
    assert incompatibilities("backward", string, number) == ["schema type changed from String to Number"]
    assert incompatibilities("backward", string, schema_def("string", "")) == []
    proto_a, proto_b = schema_def("protobuf", "message A {}"), schema_def("protobuf", "message B {}")
    assert incompatibilities("backward", proto_a, schema_def("protobuf", "message A {}")) == []
    assert "not checked" in incompatibilities("full", proto_a, proto_b)[0]
    assert incompatibilities("none", proto_a, proto_b) == []


def test_bad_modes_and_definitions_are_named():
    with pytest.raises(ValueError, match="'sideways'"):
        incompatibilities("sideways", schema_def("string", ""), schema_def("string", ""))
    with pytest.raises(InvalidSchemaError, match="not valid JSON"):
        schema_def("avro", "{oops")
    with pytest.raises(InvalidSchemaError, match="needs a schema_definition"):
        schema_def("json_schema", "  ")
