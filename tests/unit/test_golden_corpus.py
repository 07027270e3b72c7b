"""Our codecs against the golden corpus: files the real Danube v0.7.3 broker wrote.

Why one module of ~600 lines: its five numbered sections check one contract end to end on one
corpus index (the files, the README's frame ranges, the frames decoded once per session).

The corpus (`../shared/golden`, described in its README) is read in place and never changed.
Every WAL file, object, checkpoint and etcd key of every scenario is checked, one test case
per file (or key), so a failure names it:

* frames and payloads decode, every CRC holds, re-encoding gives the same bytes, files are
  consumed to the end, and the fast decoder agrees with the reference one;
* checkpoints and etcd values re-encode byte for byte (including Rust's float layout in load
  reports), and the values the README states are there;
* the messages match what the recording consumers were given (`manifest.jsonl`), and objects
  are the WAL bytes the README says they copy;
* `python -m broker.tools dump` reads every file.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import io
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any, Callable

import pytest

from broker.tools import main as tools_main
from broker.tools import message_record
from danube_core import keys as k
from danube_core import records as r
from danube_core import schema_records as sr
from danube_core.arrow_decode import decode_frames, decode_frames_reference
from danube_core.checkpoints import UploaderCheckpoint, WalCheckpoint
from danube_core.frames import FRAME_HEADER, STOP_END, encode_frame, iter_messages, scan_frames
from danube_core.message import StreamMessage, decode_message, encode_message
from danube_core.objectstore import object_id_for, objects_dir, parse_object_id
from danube_core.topics import TopicName
from tests.conftest import REPO_ROOT
from tests.golden import GOLDEN_DIR as GOLDEN
from tests.golden import SCENARIOS, require_golden

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _corpus() -> None:
    require_golden()


def test_the_corpus_is_here_with_every_scenario():
    """The file lists below are empty without the corpus, which would leave nothing to fail."""
    assert all((require_golden() / scenario).is_dir() for scenario in SCENARIOS), sorted(GOLDEN.iterdir())


def _corpus_files(suffix: str) -> list[str]:
    """Paths relative to GOLDEN of every file whose name ends with `suffix`, sorted."""
    if not GOLDEN.is_dir():
        return []
    return sorted(
        str(p.relative_to(GOLDEN)) for p in GOLDEN.rglob(f"*{suffix}") if p.is_file()
    )


WAL_FILES = [p for p in _corpus_files(".log") if Path(p).name.startswith("wal")]
OBJECT_FILES = _corpus_files(".dnb1")
CHECKPOINT_FILES = _corpus_files(".ckpt")

# Offsets (first, last) of every file that holds frames, as the README states them. Every other
# WAL file of the corpus is expected to be empty (0 bytes): `wal.log` wherever the first
# rotation came before the first flush, and the segments `rotated*` rotated past while frames
# waited in the batch. Offsets inside each file are consecutive; the README names no file
# where they are not (restarts that reuse offsets, spec §6.6, do not occur in this corpus).
_OBJECTS = "cloud/storage/topics/default"
FRAME_RANGES = {
    "normal/wal/default/normal/wal.1.log": (0, 799),
    "normal/wal/default/normal/wal.2.log": (800, 1599),
    "normal/wal/default/normal/wal.3.log": (1600, 1999),
    f"normal/{_OBJECTS}/normal/objects/data-0-1795442584.dnb1": (0, 799),
    f"normal/{_OBJECTS}/normal/objects/data-800-1795442594.dnb1": (800, 1599),
    "rotated/wal/default/rotated/wal.18.log": (1000, 1999),
    "rotated/wal/default/rotated/wal.28.log": (2000, 2999),
    f"rotated/{_OBJECTS}/rotated/objects/data-0-1795443167.dnb1": (0, 999),
    f"rotated/{_OBJECTS}/rotated/objects/data-1000-1795443172.dnb1": (1000, 1999),
    f"rotated/{_OBJECTS}/rotated/objects/data-2000-1795443177.dnb1": (2000, 2999),
    "rotated-one-object/wal/default/rotated/wal.18.log": (998, 1936),
    "rotated-one-object/wal/default/rotated/wal.23.log": (1937, 2476),
    "rotated-one-object/wal/default/rotated/wal.28.log": (2477, 2999),
    f"rotated-one-object/{_OBJECTS}/rotated/objects/data-0-1795442636.dnb1": (0, 2999),
    "moved/wal-a/default/moved/wal.1.log": (0, 799),
    "moved/wal-b/default/moved/wal.1.log": (0, 599),
    f"moved/{_OBJECTS}/moved/objects/data-0-1795442995.dnb1": (0, 599),  # A's, no descriptor
    f"moved/{_OBJECTS}/moved/objects/data-600-1795443005.dnb1": (600, 799),  # A's
    f"moved/{_OBJECTS}/moved/objects/data-0-1795443015.dnb1": (0, 399),  # B's
    f"moved/{_OBJECTS}/moved/objects/data-400-1795443085.dnb1": (400, 599),  # B's
    **{
        f"partitioned/{where}": (0, 299)
        for part in range(3)
        for where in (
            f"wal/default/parts-part-{part}/wal.1.log",
            f"{_OBJECTS}/parts-part-{part}/objects/data-0-1795442811.dnb1",
        )
    },
}


@functools.lru_cache(maxsize=None)
def read(rel: str) -> bytes:
    return (GOLDEN / rel).read_bytes()


@dataclasses.dataclass(frozen=True)
class Frame:
    """One frame as found in a corpus file: header offset, position, raw bytes, decoded message."""

    offset: int
    frame_pos: int
    frame: bytes
    payload: bytes
    message: StreamMessage


@functools.lru_cache(maxsize=None)
def frames_of(rel: str) -> tuple[Frame, ...]:
    """Every frame of a WAL file or object, decoded; asserts the file holds nothing else."""
    data = read(rel)
    scan = scan_frames(data)
    assert (scan.stop_reason, scan.safe_end) == (STOP_END, len(data)), (
        f"{rel}: scan stopped at byte {scan.stop_pos} ({scan.stop_reason}) of {len(data)}"
    )
    view = memoryview(data)
    return tuple(
        Frame(f.offset, f.frame_pos, data[f.frame_pos : f.end_pos], data[f.payload_pos : f.end_pos],
              decode_message(view[f.payload_pos : f.end_pos]))
        for f in scan.frames
    )


# ---- 1. frames and payloads -------------------------------------------------------------


def test_corpus_holds_every_file_the_readme_describes() -> None:
    wal_counts = {s: sum(p.startswith(s + "/") for p in WAL_FILES) for s in SCENARIOS}
    assert wal_counts == {"normal": 4, "rotated": 19, "rotated-one-object": 19, "moved": 4,
                          "partitioned": 6}
    assert len(OBJECT_FILES) == 2 + 3 + 1 + 4 + 3
    assert len(CHECKPOINT_FILES) == 2 * (1 + 1 + 1 + 2 + 3)
    assert set(FRAME_RANGES) <= set(WAL_FILES) | set(OBJECT_FILES)
    assert set(OBJECT_FILES) <= set(FRAME_RANGES)


@pytest.mark.parametrize("rel", WAL_FILES + OBJECT_FILES)
def test_every_frame_decodes_and_reencodes_byte_for_byte(rel: str) -> None:
    frames = frames_of(rel)  # asserts: whole file consumed, no torn tail, every CRC good
    expected = FRAME_RANGES.get(rel)
    if expected is None:
        assert read(rel) == b"", f"{rel}: the README says this WAL file is empty"
        return
    first, last = expected
    assert [f.offset for f in frames] == list(range(first, last + 1))
    for f in frames:
        offset, length, crc = FRAME_HEADER.unpack_from(f.frame)
        assert (offset, length, crc) == (f.offset, len(f.payload), zlib.crc32(f.payload))
        assert encode_message(f.message) == f.payload, f"{rel}: offset {f.offset}"
        assert encode_frame(f.offset, encode_message(f.message)) == f.frame
        assert f.message.msg_id.topic_offset == f.offset  # stamped before encoding (§2.6)
        assert f.message.subscription_name == ""  # Some(""), as the README observed


@pytest.mark.parametrize("rel", OBJECT_FILES)
def test_objects_pass_the_strict_cloud_reader(rel: str) -> None:
    decoded = [(ref.offset, msg) for ref, msg in iter_messages(read(rel), rel)]
    assert decoded == [(f.offset, f.message) for f in frames_of(rel)]


@pytest.mark.parametrize("rel", WAL_FILES + OBJECT_FILES)
def test_fast_decoder_matches_the_reference_decoder(rel: str) -> None:
    data = read(rel)
    fast, reference = decode_frames(data), decode_frames_reference(data)
    assert (fast.stop_reason, fast.consumed) == (STOP_END, len(data))
    assert (reference.stop_reason, reference.consumed) == (STOP_END, len(data))
    assert fast.batch.equals(reference.batch)
    frames = frames_of(rel)
    assert fast.batch.column("offset").to_pylist() == [f.offset for f in frames]
    assert fast.batch.column("payload").to_pylist() == [f.message.payload for f in frames]


# ---- 2. checkpoints ---------------------------------------------------------------------


def decode_checkpoint(rel: str) -> WalCheckpoint | UploaderCheckpoint:
    cls = WalCheckpoint if Path(rel).name == "wal.ckpt" else UploaderCheckpoint
    return cls.decode(read(rel), rel)


def local_wal_path(scenario: str, configured: str) -> Path:
    """A path as the broker wrote it in wal.ckpt, resolved the README's way."""
    assert configured.startswith("./danube-data/wal"), configured
    return GOLDEN / scenario / configured[len("./danube-data/"):]


@pytest.mark.parametrize("rel", CHECKPOINT_FILES)
def test_checkpoint_reencodes_byte_for_byte(rel: str) -> None:
    assert decode_checkpoint(rel).encode() == read(rel)


@pytest.mark.parametrize("rel", [p for p in CHECKPOINT_FILES if p.endswith("/wal.ckpt")])
def test_wal_checkpoint_points_at_the_files_left_on_disk(rel: str) -> None:
    scenario = rel.split("/")[0]
    ckpt = decode_checkpoint(rel)
    active = local_wal_path(scenario, ckpt.file_path)
    assert active.name == ckpt.active_file_name == f"wal.{ckpt.file_seq}.log"
    assert frames_of(str(active.relative_to(GOLDEN)))[-1].offset == ckpt.last_offset
    assert ckpt.last_rotation_at is None  # never set in v0.7.3 (§3.4)
    for seq, path, _first in ckpt.rotated_files:
        rotated = local_wal_path(scenario, path)
        assert rotated.is_file() and rotated.name == ("wal.log" if seq == 0 else f"wal.{seq}.log")


@pytest.mark.parametrize("rel", [p for p in CHECKPOINT_FILES if p.endswith("/uploader.ckpt")])
def test_uploader_checkpoint_resumes_at_the_end_of_what_it_uploaded(rel: str) -> None:
    ckpt = decode_checkpoint(rel)
    directory = Path(rel).parent
    seq = ckpt.last_read_file_seq
    resume_file = directory / ("wal.log" if seq == 0 else f"wal.{seq}.log")
    assert ckpt.last_read_byte_position == len(read(str(resume_file)))
    start, secs = parse_object_id(ckpt.last_object_id)
    assert ckpt.updated_at == secs
    objects = GOLDEN / rel.split("/")[0] / _OBJECTS / directory.name / "objects"
    assert frames_of(str((objects / ckpt.last_object_id).relative_to(GOLDEN)))[-1].offset == (
        ckpt.last_committed_offset
    )


def test_checkpoint_values_the_readme_states() -> None:
    normal = decode_checkpoint("normal/wal/default/normal/wal.ckpt")
    assert [(seq, Path(path).name, first) for seq, path, first in normal.rotated_files] == [
        (0, "wal.log", 0), (1, "wal.1.log", 625), (2, "wal.2.log", 1259)
    ]
    assert (normal.start_offset, normal.active_file_first_offset) == (0, 1892)
    assert (normal.file_seq, normal.last_offset) == (3, 1999)
    assert decode_checkpoint("normal/wal/default/normal/uploader.ckpt").last_committed_offset == 1599
    for scenario in ("rotated", "rotated-one-object"):
        ckpt = decode_checkpoint(f"{scenario}/wal/default/rotated/wal.ckpt")
        # written by the deleter: wal.log .. wal.9.log are gone from the list (§3.7)
        assert ckpt.start_offset == 1075
        assert [seq for seq, _, _ in ckpt.rotated_files] == list(range(10, 28))
        assert ckpt.rotated_files[0][2] == 1075
    for broker, last in (("a", 799), ("b", 599)):
        assert decode_checkpoint(f"moved/wal-{broker}/default/moved/wal.ckpt").last_offset == last
        uploader = decode_checkpoint(f"moved/wal-{broker}/default/moved/uploader.ckpt")
        assert uploader.last_committed_offset == last


# ---- 3. etcd values ---------------------------------------------------------------------

Codec = tuple[Callable[[bytes, str], Any], Callable[[Any], bytes]]
NULL: Codec = (lambda raw, key: r.load_json(raw, key), r.dump_json)
U64: Codec = (r.parse_u64, r.dump_u64)


def record(cls: Any) -> Codec:
    return cls.from_json, lambda value: value.to_json()


def etcd_codec(key: str) -> tuple[Codec, Callable[[Any], str]]:
    """How `key`'s value parses and dumps, and the key our key layout builds for that value."""
    parts = key.split("/")
    if key == k.LEADER_KEY:
        return U64, lambda value: k.LEADER_KEY
    if key.startswith(k.REGISTER_PREFIX):
        return record(r.BrokerRegistration), lambda value: k.register_key(int(parts[-1]))
    if key.startswith(k.LOAD_PREFIX):
        return record(r.LoadReport), lambda value: k.load_key(value.broker_id)
    if key.startswith(k.UNASSIGNED_PREFIX):
        return record(r.UnassignedMarker), lambda value: k.unassigned_key(k.topic_from_unassigned_key(key))
    if key.startswith(k.BROKERS_PREFIX):
        assignment = k.parse_assignment_key(key)
        if assignment is not None:
            return NULL, lambda value: k.assignment_key(*assignment)
        return record(r.BrokerState), lambda value: k.broker_state_key(int(parts[3]))
    if key.startswith(k.CLUSTER_PREFIX) and len(parts) == 3:
        return NULL, lambda value: k.cluster_name_key(parts[2])
    if key.startswith(k.DEFAULT_ROOT_PREFIX + "/storage/topics/"):
        return storage_codec(key, TopicName(parts[4], parts[5]))
    if key.startswith(k.NAMESPACES_PREFIX):
        if key == k.namespace_policy_key(parts[2]):
            return record(r.Policies), lambda value: k.namespace_policy_key(parts[2])
        topic = k.topic_from_namespace_index_key(key)
        return NULL, lambda value: k.namespace_topic_key(topic)
    if key.startswith(k.TOPICS_PREFIX):
        return topic_codec(key, TopicName(parts[2], parts[3]))
    if key.startswith(k.SCHEMAS_PREFIX):
        return schema_codec(key, parts)
    raise AssertionError(f"no record models etcd key {key!r}")


def storage_codec(key: str, topic: TopicName) -> tuple[Codec, Callable[[Any], str]]:
    storage = k.StorageKeys()
    if key == storage.cur_key(topic):
        return record(r.CurPointer), lambda value: storage.cur_key(topic)
    if key == storage.state_key(topic):
        return record(r.SealedState), lambda value: storage.state_key(topic)
    assert k.parse_object_key(key) is not None
    return record(r.ObjectDescriptor), lambda value: storage.object_key(topic, value.start_offset)


def topic_codec(key: str, topic: TopicName) -> tuple[Codec, Callable[[Any], str]]:
    if key == k.topic_root_key(topic):  # only the system events topic has one: `0`
        return U64, lambda value: k.topic_root_key(topic)
    if key == k.delivery_key(topic):
        return (r.parse_delivery, r.dump_delivery), lambda value: k.delivery_key(topic)
    if key == k.schema_subject_key(topic):
        return (r.parse_string, r.dump_json), lambda value: k.schema_subject_key(topic)
    if key == k.schema_config_key(topic):
        return record(r.SchemaConfig), lambda value: k.schema_config_key(topic)
    if key == k.topic_policy_key(topic):
        return record(r.Policies), lambda value: k.topic_policy_key(topic)
    if key.startswith(k.producers_prefix(topic)):
        return record(r.ProducerRecord), lambda value: k.producer_key(topic, value.producer_id)
    subscription, is_cursor = k.parse_subscription_key(topic, key)
    if is_cursor:
        return (r.parse_cursor, r.dump_cursor), lambda value: k.cursor_key(topic, subscription)
    return record(r.SubscriptionRecord), lambda value: k.subscription_key(topic, value.subscription_name)


def schema_codec(key: str, parts: list[str]) -> tuple[Codec, Callable[[Any], str]]:
    if key == k.NEXT_SCHEMA_ID_KEY:
        return U64, lambda value: k.NEXT_SCHEMA_ID_KEY
    if key.startswith(k.SCHEMA_INDEX_PREFIX):
        return record(sr.SchemaIndexEntry), lambda value: k.schema_index_key(value.schema_id)
    if parts[-1] == "metadata":
        return record(sr.SchemaMetadata), lambda value: k.schema_metadata_key(value.subject)
    if parts[-1] == "compatibility":
        return record(sr.SchemaCompatibility), lambda value: k.schema_compatibility_key(parts[2])
    return record(sr.SchemaVersion), lambda value: k.schema_version_key(parts[2], value.version)


def etcd_entries(scenario: str) -> list[tuple[str, bytes]]:
    entries = []
    for line in (GOLDEN / scenario / "etcd.jsonl").read_text(encoding="utf-8").splitlines():
        item = json.loads(line)
        raw = base64.b64decode(item["value_b64"]) if "value_b64" in item else item["value"].encode()
        entries.append((item["key"], raw))
    return entries


ETCD_CASES = [
    pytest.param(scenario, key, raw, id=f"{scenario}:{key}")
    for scenario in (SCENARIOS if GOLDEN.is_dir() else ())
    for key, raw in etcd_entries(scenario)
]


@pytest.mark.parametrize("scenario,key,raw", ETCD_CASES)
def test_etcd_value_parses_and_dumps_byte_for_byte(scenario: str, key: str, raw: bytes) -> None:
    (parse, dump), key_for = etcd_codec(key)
    value = parse(raw, key)
    assert dump(value) == raw
    assert key_for(value) == key


def test_etcd_key_counts_the_readme_states() -> None:
    counts = {scenario: len(etcd_entries(scenario)) for scenario in SCENARIOS}
    assert counts == {"normal": 19, "rotated": 18, "rotated-one-object": 15, "moved": 24,
                      "partitioned": 29}


def test_load_report_floats_are_written_in_rusts_exponent_form() -> None:
    """Python's json writes `6.319877954297229e-08`; the real broker wrote `...e-8`."""
    key = "/cluster/load/13765396746494901369"
    raw = dict(etcd_entries("normal"))[key]
    report = r.LoadReport.from_json(raw, key)
    memory = next(u for u in report.resources_usage if u.resource == "Memory")
    assert memory.usage == 6.319877954297229e-08
    assert b'"usage":6.319877954297229e-8}' in raw
    assert report.to_json() == raw


# ---- 4. objects, WAL files and descriptors against the manifest -------------------------


@dataclasses.dataclass(frozen=True)
class Run:
    """One broker's sequence of offsets of one topic, with the consumer that saw all of it."""

    scenario: str
    topic: str
    wal_files: tuple[str, ...]
    objects: tuple[str, ...]
    subscription: str


def _objects(scenario: str, topic: str, *names: str) -> tuple[str, ...]:
    return tuple(f"{scenario}/{_OBJECTS}/{topic}/objects/{name}" for name in names)


def _wal(scenario: str, wal_dir: str, topic: str, *seqs: int) -> tuple[str, ...]:
    return tuple(f"{scenario}/{wal_dir}/default/{topic}/wal.{seq}.log" for seq in seqs)


RUNS = [
    Run("normal", "/default/normal", _wal("normal", "wal", "normal", 1, 2, 3),
        _objects("normal", "normal", "data-0-1795442584.dnb1", "data-800-1795442594.dnb1"), "audit"),
    Run("rotated", "/default/rotated", _wal("rotated", "wal", "rotated", 18, 28),
        _objects("rotated", "rotated", "data-0-1795443167.dnb1", "data-1000-1795443172.dnb1",
                 "data-2000-1795443177.dnb1"), "audit"),
    Run("rotated-one-object", "/default/rotated",
        _wal("rotated-one-object", "wal", "rotated", 18, 23, 28),
        _objects("rotated-one-object", "rotated", "data-0-1795442636.dnb1"), "audit"),
    # B restarted the topic at offset 0 (README): A's and B's offsets overlap, so they are
    # separate runs, told apart in the manifest by the subscription that recorded them.
    Run("moved", "/default/moved", _wal("moved", "wal-a", "moved", 1),
        _objects("moved", "moved", "data-0-1795442995.dnb1", "data-600-1795443005.dnb1"), "resume"),
    Run("moved", "/default/moved", _wal("moved", "wal-b", "moved", 1),
        _objects("moved", "moved", "data-0-1795443015.dnb1", "data-400-1795443085.dnb1"), "audit-b"),
    *(
        Run("partitioned", f"/default/parts-part-{p}", _wal("partitioned", "wal", f"parts-part-{p}", 1),
            _objects("partitioned", f"parts-part-{p}", "data-0-1795442811.dnb1"), "audit")
        for p in range(3)
    ),
]


@functools.lru_cache(maxsize=None)
def manifest(scenario: str) -> tuple[dict, ...]:
    path = GOLDEN / scenario / "manifest.jsonl"
    return tuple(json.loads(line) for line in path.read_text(encoding="utf-8").splitlines())


def messages_of(files: tuple[str, ...]) -> dict[int, Frame]:
    by_offset: dict[int, Frame] = {}
    for rel in files:
        for f in frames_of(rel):
            assert f.offset not in by_offset, f"{rel}: offset {f.offset} appears twice in the run"
            by_offset[f.offset] = f
    return by_offset


def assert_matches_received(frame: Frame, received: dict) -> None:
    m = frame.message
    got = {
        "offset": frame.offset, "topic_name": m.msg_id.topic_name,
        "broker_addr": m.msg_id.broker_addr, "producer_id": m.msg_id.producer_id,
        "request_id": m.request_id, "publish_time": m.publish_time,
        "producer_name": m.producer_name, "payload_len": len(m.payload),
        "payload_sha256": hashlib.sha256(m.payload).hexdigest(), "attributes": m.attributes,
        "schema_id": m.schema_id, "schema_version": m.schema_version,
    }
    assert got == {name: received[name] for name in got}, f"offset {frame.offset}"


@pytest.mark.parametrize("run", RUNS, ids=[f"{run.scenario}:{run.topic}:{run.subscription}" for run in RUNS])
def test_files_hold_what_the_consumer_received(run: Run) -> None:
    received = [
        e for e in manifest(run.scenario)
        if e["type"] == "received" and e["subscription"] == run.subscription
        and e["topic_name"] == run.topic
    ]
    from_objects, from_wal = messages_of(run.objects), messages_of(run.wal_files)
    # The recording consumer saw every offset once; everything is uploaded except normal's
    # WAL tail 1600..1999, which the broker was stopped before uploading.
    assert sorted(e["offset"] for e in received) == sorted(set(from_objects) | set(from_wal))
    not_uploaded = set(range(1600, 2000)) if run.scenario == "normal" else set()
    assert set(from_wal) - set(from_objects) == not_uploaded
    for entry in received:
        for source in (from_objects, from_wal):
            if entry["offset"] in source:
                assert_matches_received(source[entry["offset"]], entry)
    for offset in set(from_wal) & set(from_objects):
        assert from_wal[offset].frame == from_objects[offset].frame


@pytest.mark.parametrize("scenario", ["normal", "rotated", "rotated-one-object"])
def test_offsets_follow_send_order(scenario: str) -> None:
    """One producer sending one message at a time: offset n is the n-th message sent."""
    sent = [e for e in manifest(scenario) if e["type"] == "sent"]
    run = next(run for run in RUNS if run.scenario == scenario)
    messages = messages_of(run.objects) | messages_of(run.wal_files)
    assert sorted(messages) == [e["seq"] for e in sent]
    for entry in sent:
        m = messages[entry["seq"]].message
        assert hashlib.sha256(m.payload).hexdigest() == entry["payload_sha256"]
        assert m.attributes == entry["attributes"]
        assert m.request_id == entry["request_id_returned"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_received_entry_belongs_to_a_checked_run(scenario: str) -> None:
    checked = {(run.topic, run.subscription) for run in RUNS if run.scenario == scenario}
    checked |= {("/default/normal", "partial")} if scenario == "normal" else set()
    received = [e for e in manifest(scenario) if e["type"] == "received"]
    assert {(e["topic_name"], e["subscription"]) for e in received} == checked


def test_partial_subscription_received_the_first_601_messages() -> None:
    partial = [e for e in manifest("normal") if e["type"] == "received" and e["subscription"] == "partial"]
    assert [e["offset"] for e in partial] == list(range(601))
    messages = messages_of(RUNS[0].objects)
    for entry in partial:
        assert_matches_received(messages[entry["offset"]], entry)


# Objects are WAL bytes copied verbatim (README): each object is the concatenation of the
# listed WAL bytes, or (`rotated-one-object`) ends with them after the deleted `wal.9.log`.
OBJECT_COPIES = [
    (_objects("normal", "normal", "data-0-1795442584.dnb1"), _wal("normal", "wal", "normal", 1)),
    (_objects("normal", "normal", "data-800-1795442594.dnb1"), _wal("normal", "wal", "normal", 2)),
    (_objects("rotated", "rotated", "data-1000-1795443172.dnb1"), _wal("rotated", "wal", "rotated", 18)),
    (_objects("rotated", "rotated", "data-2000-1795443177.dnb1"), _wal("rotated", "wal", "rotated", 28)),
    (RUNS[3].objects, RUNS[3].wal_files),
    (RUNS[4].objects, RUNS[4].wal_files),
    *((run.objects, run.wal_files) for run in RUNS[5:]),
]


@pytest.mark.parametrize("objects,wal_files", OBJECT_COPIES, ids=[o[0] for o, _ in OBJECT_COPIES])
def test_objects_are_verbatim_copies_of_wal_bytes(objects: tuple[str, ...], wal_files: tuple[str, ...]) -> None:
    assert b"".join(map(read, objects)) == b"".join(map(read, wal_files))


def test_one_object_spans_the_deleted_segment_and_three_wal_files() -> None:
    run = RUNS[2]
    obj, tail = read(run.objects[0]), b"".join(map(read, run.wal_files))
    assert obj.endswith(tail)
    prefix = frames_of(run.objects[0])[: 998]  # offsets 0..997 were in the deleted wal.9.log
    assert prefix[-1].offset == 997 and prefix[-1].frame_pos + len(prefix[-1].frame) == len(obj) - len(tail)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_descriptors_describe_their_objects(scenario: str) -> None:
    storage = k.StorageKeys()
    described = set()
    for key, raw in etcd_entries(scenario):
        in_objects = key.startswith(k.DEFAULT_ROOT_PREFIX) and key.split("/")[-2] == "objects"
        if not in_objects or k.parse_object_key(key) is None:  # not a descriptor: state, cur
            continue
        d = r.ObjectDescriptor.from_json(raw, key)
        topic = TopicName(*key.split("/")[4:6])
        rel = f"{scenario}/cloud/{objects_dir(topic)}/{d.object_id}"
        frames = frames_of(rel)
        assert d.object_id == object_id_for(d.start_offset, d.created_at)
        assert (d.start_offset, d.end_offset) == (frames[0].offset, frames[-1].offset)
        assert (d.size, d.etag, d.completed) == (len(read(rel)), None, True)
        assert d.offset_index == [(f.offset, f.frame_pos) for f in frames[::1000]]
        assert key == storage.object_key(topic, d.start_offset)
        described.add(rel)
    orphans = {rel for rel in OBJECT_FILES if rel.startswith(scenario + "/")} - described
    # B's first upload overwrote descriptor ...0000, so A's first object has none (README).
    expected = {f"moved/{_OBJECTS}/moved/objects/data-0-1795442995.dnb1"} if scenario == "moved" else set()
    assert orphans == expected


# ---- 5. the inspection CLI ----------------------------------------------------------------


def run_dump(path: Path) -> tuple[int, list[dict], str]:
    out, err = io.StringIO(), io.StringIO()
    code = tools_main(["dump", str(path)], out, err)
    return code, [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue()


@pytest.mark.parametrize("rel", WAL_FILES + OBJECT_FILES)
def test_dump_prints_every_frame(rel: str) -> None:
    code, lines, err = run_dump(GOLDEN / rel)
    assert (code, err) == (0, "")
    expected = [message_record(f.offset, f.message) for f in frames_of(rel)]
    assert lines == json.loads(json.dumps(expected, ensure_ascii=False))


@pytest.mark.parametrize("rel", CHECKPOINT_FILES)
def test_dump_prints_checkpoints(rel: str) -> None:
    code, lines, err = run_dump(GOLDEN / rel)
    assert (code, err) == (0, "")
    ckpt = decode_checkpoint(rel)
    kind = "wal" if isinstance(ckpt, WalCheckpoint) else "uploader"
    expected = {"checkpoint": kind, **dataclasses.asdict(ckpt)}
    assert lines == [json.loads(json.dumps(expected))]


def test_dump_of_a_corrupt_checkpoint_exits_1(tmp_path: Path) -> None:
    (tmp_path / "wal.ckpt").write_bytes(b"\x00\xfb")  # last_offset cut inside its varint
    code, lines, err = run_dump(tmp_path / "wal.ckpt")
    assert (code, lines) == (1, [])
    assert "corrupt WAL checkpoint" in err and "wal.ckpt" in err


def test_dump_runs_as_a_module() -> None:
    rel = "partitioned/wal/default/parts-part-0/wal.ckpt"
    paths = [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    done = subprocess.run(
        [sys.executable, "-m", "broker.tools", "dump", str(GOLDEN / rel)],
        capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=60,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout)["last_offset"] == 299
