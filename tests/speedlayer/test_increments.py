"""Refresh planning without servers: how a new Delta version relates to the held epoch
(append-only -> the added files; any removal, a schema or partitioning change -> rebuild), on
real Delta logs written by deltalake, and the incremental plan's two file lists."""

from __future__ import annotations

import pyarrow as pa
import pytest

from speedlayer.api.v1 import control_plane_service_pb2 as cp
from speedlayer.sources.delta import DeltaTableSource
from speedlayer.sources.delta_changes import INCREMENTAL, REBUILD, classify, incremental_source

pytestmark = pytest.mark.unit


def write(path: str, start: int, rows: int, mode: str = "append", **extra) -> None:
    from deltalake import write_deltalake

    ids = range(start, start + rows)
    data = {"id": pa.array(ids, pa.int64()), "day": [f"d{i % 2}" for i in ids]}
    data.update({k: [v] * rows for k, v in extra.items()})
    write_deltalake(path, pa.table(data), partition_by=["day"], mode=mode,
                    schema_mode="merge" if extra else None)


def held_plan(resolved) -> cp.LoadPlan:
    return cp.LoadPlan(source=resolved.source, arrow_schema=resolved.arrow_schema,
                       partition_columns=resolved.partition_columns)


@pytest.fixture
def table(tmp_path):
    path = str(tmp_path / "t")
    write(path, 0, 10)
    return path, DeltaTableSource()


def test_appends_since_the_held_version_are_an_increment_of_exactly_the_added_files(table):
    path, connector = table
    held = connector.resolve_uri(path, None, [])
    write(path, 10, 4)
    write(path, 14, 4)  # two versions: one increment with both commits' files
    new = connector.resolve_uri(path, None, [])
    change = classify(held_plan(held), new)
    assert change.kind == INCREMENTAL and new.version == 2
    held_uris = {f.uri for f in held.source.delta.files}
    assert {f.uri for f in change.added} == {f.uri for f in new.source.delta.files} - held_uris
    assert sum(f.record_count for f in change.added) == 8
    source = incremental_source(new, change)
    assert len(source.delta.files) == new.file_count and len(source.delta.added_files) == 4


def test_a_version_without_new_files_is_an_empty_increment(table):
    from deltalake import DeltaTable

    path, connector = table
    held = connector.resolve_uri(path, None, [])
    DeltaTable(path).alter.set_table_description("only metadata")  # a commit with a metaData action
    new = connector.resolve_uri(path, None, [])
    change = classify(held_plan(held), new)
    assert change.kind == INCREMENTAL and change.added == []


@pytest.mark.parametrize("operation", ["optimize", "delete", "overwrite"])
def test_versions_that_remove_files_are_rebuilt(table, operation):
    from deltalake import DeltaTable

    path, connector = table
    write(path, 10, 10)
    held = connector.resolve_uri(path, None, [])
    write(path, 20, 5)  # an append first: the removal among later versions still counts
    if operation == "optimize":
        DeltaTable(path).optimize.compact()
    elif operation == "delete":
        DeltaTable(path).delete("id < 3")
    else:
        write(path, 100, 5, mode="overwrite")
    change = classify(held_plan(held), connector.resolve_uri(path, None, []))
    assert change.kind == REBUILD and change.removed_count > 0 and "removed" in change.reason


def test_schema_and_partition_changes_are_rebuilt(table, tmp_path):
    path, connector = table
    held = connector.resolve_uri(path, None, [])
    write(path, 10, 5, note="x")  # merge schema: a new column, files only added
    change = classify(held_plan(held), connector.resolve_uri(path, None, []))
    assert change.kind == REBUILD and "schema" in change.reason

    other = held_plan(held)
    other.partition_columns[:] = []
    write(path, 20, 1, note="y")
    assert "partition columns" in classify(other, connector.resolve_uri(path, None, [])).reason


def test_a_partition_filtered_epoch_only_adds_files_of_its_partitions(table):
    path, connector = table
    held = connector.resolve_uri(path, None, [{"day": "d0"}])
    write(path, 10, 6)
    new = connector.resolve_uri(path, None, [{"day": "d0"}])
    change = classify(held_plan(held), new)
    assert change.kind == INCREMENTAL
    assert {f.partition_values["day"] for f in change.added} == {"d0"}


def test_other_table_or_older_version_is_rebuilt(table, tmp_path):
    path, connector = table
    held = connector.resolve_uri(path, None, [])
    write(path, 10, 1)
    assert "not after" in classify(held_plan(connector.resolve_uri(path, None, [])),
                                   connector.resolve_uri(path, 0, [])).reason
    other = str(tmp_path / "other")
    write(other, 0, 3)
    write(other, 3, 3)
    assert "now follows" in classify(held_plan(held), connector.resolve_uri(other, None, [])).reason


def test_latest_version_follows_new_commits_of_a_cached_log(table):
    path, connector = table
    assert connector.latest_version(path) == 0
    write(path, 10, 1)
    write(path, 11, 1)
    assert connector.latest_version(path) == 2
    assert [op.split(":")[1] for op in connector.operations(path, 0, 2)] == ["WRITE", "WRITE"]
