"""Which messages the tail splits without Spark (`pipelines.tail_split`), without Spark: plain JSON
of the declared types is decoded, anything else left to Spark, rows naming another schema version
dropped as the pipeline quarantines them, and a subject of several versions left to Spark whole."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa
import pytest

from connectors.schema import arrow_schema
from pipelines.config import DecodeConfig
from pipelines.decode import Decoder, PayloadSchema
from pipelines.tail_split import ArrowSplit, FlatSchema, parse_clean, split_plan

SCHEMA = {"type": "object", "required": ["id"],
          "properties": {"id": {"type": "string"}, "n": {"type": "integer"}, "x": {"type": "number"}}}
FLAT = FlatSchema((("id", "string"), ("n", "integer"), ("x", "number")), frozenset({"id"}))


@pytest.mark.parametrize("payload, values", [
    (b'{"id": "a", "n": 1, "x": 2}', ("a", 1, 2.0)),
    (b'  {"x": -0.5, "id": "\\u00e9"}  ', ("\u00e9", None, -0.5)),
    (b'{"id": "a", "n": null}', ("a", None, None)),
    (b'{"id": "a", "n": 9223372036854775808}', None),   # past int64
    (b'{"id": "a", "n": true}', None),
    (b'{"id": "a", "x": Infinity}', None),
    (b'{"id": "a", "extra": 1}', None),
    (b'{"n": 1}', None),
    (b'\xff{"id": "a"}', None),
    (b'', None),
    (None, None),
])
def test_only_plain_payloads_are_decoded_here(payload, values):
    assert parse_clean(payload, FLAT) == values


@pytest.mark.parametrize("payload, decided", [
    (None, True), (b"", True), (b"this is not json", True), (b"\t hello", True),
    (b'{"n": 1}', True), (b'{"id": null}', True),                       # a required field missing
    (b"truest", False), (b"nullable", False), (b"Nope", True), (b"{oops", False), (b"'a'", False),  # Spark's parser decides
    (b'{"n": 1, "more": 2}', False), (b'{"id": "a"}', False),
])
def test_under_quarantine_certain_decode_errors_are_decided_here(payload, decided):
    from pipelines.tail_split import QUARANTINED

    assert (parse_clean(payload, FLAT, quarantine=True) is QUARANTINED) is decided
    assert parse_clean(payload, FLAT) is not QUARANTINED  # rescue keeps them: Spark says how


@dataclass
class _Version:
    version: int


@dataclass
class _Meta:
    id: int
    latest_version: int
    versions: list


class _Schemas:
    subject = "orders"

    def __init__(self, versions: list[int]) -> None:
        self.versions = versions

    def subject_metadata(self) -> _Meta:
        return _Meta(7, max(self.versions), [_Version(v) for v in self.versions])

    def loaded_versions(self) -> set[int]:
        return set()


class _Decoder(Decoder):
    """A decoder of a registry subject whose versions all hold SCHEMA, without etcd."""

    def __init__(self, versions: list[int]) -> None:
        super().__init__(DecodeConfig(format="json", subject="orders"), _Schemas(versions))  # type: ignore[arg-type]

    def _version_schema(self, version: int) -> PayloadSchema | str:
        return PayloadSchema("JsonSchema", json.dumps(SCHEMA), f"version {version}")


def batch(payloads: list[bytes], schema_ids: list, versions: list) -> pa.RecordBatch:
    n = len(payloads)
    return pa.RecordBatch.from_pydict({
        "topic": ["/default/t"] * n, "partition": [0] * n, "offset": list(range(n)), "publish_time": [None] * n,
        "producer_name": ["p"] * n, "producer_id": [None] * n, "payload": payloads, "attributes": [[]] * n,
        "schema_id": schema_ids, "schema_version": versions, "source": ["wal"] * n}, schema=arrow_schema(True))


def test_rows_naming_another_version_are_dropped_and_unclean_ones_left_to_spark():
    good, bad = b'{"id": "a", "n": 1}', b'{"id": "a", "n": "1"}'
    read = batch([good, good, good, bad, good], [7, None, 7, 7, 8], [1, None, 2, 1, 2])
    rows, rest = ArrowSplit(_Decoder([1]), None).split([read])
    assert rows is not None and rows["_offset"].to_pylist() == [0, 1, 4]  # 2 names version 2 of subject 7
    assert rows["_topic"].to_pylist() == ["/default/t-part-0"] * 3
    assert [o for b in rest for o in b.column("offset").to_pylist()] == [3]


def test_a_subject_of_several_versions_is_left_to_spark():
    assert split_plan(_Decoder([1, 2])) is None
    read = batch([b'{"id": "a"}'], [None], [None])
    assert ArrowSplit(_Decoder([1, 2]), None).split([read]) == (None, [read])
