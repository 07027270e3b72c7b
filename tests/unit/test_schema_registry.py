"""The registry's read-modify-writes of a subject (danube_core.schema_registry) over the in-memory store."""

from __future__ import annotations

import json

import pytest

from danube_core.keys import schema_index_key, schema_version_key
from danube_core.metadata_memory import MemoryMetadataStore
from danube_core.schema_registry import (
    IncompatibleSchemaError, InvalidSchemaError, SchemaNotFoundError, SchemaRegistry, schema_def,
)

pytestmark = pytest.mark.unit


def _schema(*fields: str) -> str:
    return json.dumps({"type": "object", "properties": {f: {"type": "string"} for f in fields}, "required": ["id"]})


class RacingStore(MemoryMetadataStore):
    """Runs `interloper` once, just before the first compare-and-put: a concurrent writer."""

    def __init__(self) -> None:
        super().__init__()
        self.interloper = None

    def compare_and_put(self, key, expected, value):
        if self.interloper is not None:
            interloper, self.interloper = self.interloper, None
            interloper()
        return super().compare_and_put(key, expected, value)


def test_concurrent_registrations_get_distinct_numbers_and_keys():
    store = RacingStore()
    registry = SchemaRegistry(store)
    registry.register("orders", schema_def("json_schema", _schema("id")))
    store.interloper = lambda: SchemaRegistry(store).register("orders", schema_def("json_schema", _schema("id", "a")))
    mine = registry.register("orders", schema_def("json_schema", _schema("id", "b")))
    assert mine.version == 3
    for number, field in ((2, "a"), (3, "b")):
        _, version = registry.version("orders", number)
        assert field in json.loads(version.schema_def.raw_schema)["properties"]
        assert store.get(schema_version_key("orders", number)) == version.to_json()
    assert [v.version for v in registry.subject("orders").versions] == [1, 2, 3]


def test_a_new_subject_lost_to_a_concurrent_creator_joins_it():
    store = RacingStore()
    store.interloper = lambda: SchemaRegistry(store).register("events", schema_def("string", ""))
    found = SchemaRegistry(store).register("events", schema_def("string", ""))
    assert (found.version, found.is_new_version) == (1, False)
    assert store.get(schema_index_key(found.schema_id)) is not None


def test_mode_changes_keep_versions_registered_meanwhile():
    store = RacingStore()
    registry = SchemaRegistry(store)
    registry.register("orders", schema_def("json_schema", _schema("id")))
    store.interloper = lambda: SchemaRegistry(store).register("orders", schema_def("json_schema", _schema("id", "a")))
    registry.set_mode("orders", "full")
    meta = registry.subject("orders")
    assert (meta.compatibility_mode, meta.latest_version, len(meta.versions)) == ("Full", 2, 2)
    assert registry.mode("orders") == "full"


def test_only_older_versions_are_deleted_and_numbers_are_never_reused():
    registry = SchemaRegistry(MemoryMetadataStore())
    for fields in (("id",), ("id", "a"), ("id", "a", "b")):
        registry.register("orders", schema_def("json_schema", _schema(*fields)))
    with pytest.raises(IncompatibleSchemaError, match="latest version"):
        registry.delete_version("orders", 3)
    registry.delete_version("orders", 2)
    with pytest.raises(SchemaNotFoundError, match="no version 2"):
        registry.delete_version("orders", 2)
    assert registry.register("orders", schema_def("json_schema", _schema("id", "c"))).version == 4
    assert [v.version for v in registry.subject("orders").versions] == [1, 3, 4]


@pytest.mark.parametrize("kind, definition, named", [
    ("json_schema", '{"type": "object", "properties": [], "required": []}', '"properties"'),
    ("json_schema", '{"type": "object", "properties": {}, "required": "id"}', '"required"'),
    ("avro", '{"type": "record", "name": "R", "fields": 3}', '"fields"'),
    ("avro", '{"type": "record", "name": "R", "fields": [{"name": ["x"]}]}', '"fields"'),
])
def test_malformed_schema_parts_are_refused_by_name(kind, definition, named):
    with pytest.raises(InvalidSchemaError, match=named):
        schema_def(kind, definition)
