"""The inspection CLI: `dump` of WAL files and .dnb1 objects (local and S3), `objects` on etcd."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import zlib
from contextlib import contextmanager
from typing import Iterator

import pytest
import s3fs

from broker.tools import main
from broker.wal import Wal, WalConfig
from danube_core.keys import StorageKeys, namespace_topic_key
from danube_core.message import MessageID, StreamMessage
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.records import NULL_JSON, CurPointer, ObjectDescriptor, SealedState
from danube_core.topics import TopicName
from tests.conftest import REPO_ROOT

DUMP_KEYS = [
    "offset", "request_id", "producer_id", "topic_name", "broker_addr", "topic_offset",
    "payload_b64", "publish_time", "producer_name", "subscription_name", "attributes",
    "schema_id", "schema_version",
]


def make_msg(i: int, topic: str) -> StreamMessage:
    return StreamMessage(
        request_id=i + 1,
        msg_id=MessageID(0x0123456789ABCDEF, topic, "http://127.0.0.1:6650/", 0),
        payload=bytes([i, 255, 0]) + "é".encode(),
        publish_time=1_700_000_000_123 + i,
        producer_name="p1",
        attributes={"k": f"v{i}"},
        schema_id=5 if i % 2 else None,
        schema_version=1 if i % 2 else None,
    )


def write_wal(root, topic: str, count: int) -> str:
    """A WAL file with `count` messages; returns its path."""
    config = WalConfig(root=str(root), fsync_interval_ms=3_600_000, durable=False)
    with Wal.open(TopicName.parse(topic), config) as wal:
        for i in range(count):
            wal.append(make_msg(i, topic))
        wal.flush()
        return wal.segments()[-1].path


def run(*argv: str) -> tuple[int, list[dict], str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue()


def assert_dump_matches(records: list[dict], topic: str, first_offset: int = 0) -> None:
    for n, rec in enumerate(records):
        i, offset = n, first_offset + n
        assert list(rec) == DUMP_KEYS
        assert rec == {
            "offset": offset, "request_id": i + 1, "producer_id": 0x0123456789ABCDEF,
            "topic_name": topic, "broker_addr": "http://127.0.0.1:6650/", "topic_offset": offset,
            "payload_b64": base64.b64encode(bytes([i, 255, 0]) + "é".encode()).decode(),
            "publish_time": 1_700_000_000_123 + i, "producer_name": "p1", "subscription_name": "",
            "attributes": {"k": f"v{i}"}, "schema_id": 5 if i % 2 else None,
            "schema_version": 1 if i % 2 else None,
        }


@pytest.mark.parametrize("chunk_bytes", ["7", "8388608"])
def test_dump_wal_file(tmp_path, unique_name, chunk_bytes):
    topic = f"/default/{unique_name('dump')}"
    path = write_wal(tmp_path, topic, 5)
    code, records, err = run("dump", path, "--chunk-bytes", chunk_bytes)
    assert (code, err) == (0, "")
    assert len(records) == 5
    assert_dump_matches(records, topic)


def test_dump_local_object_by_file_url(tmp_path, unique_name):
    topic = f"/default/{unique_name('obj')}"
    with open(write_wal(tmp_path / "wal", topic, 3), "rb") as fh:
        data = fh.read()
    obj = tmp_path / "cloud" / "storage" / "topics" / "data-0-1700000030.dnb1"
    obj.parent.mkdir(parents=True)
    obj.write_bytes(data)
    code, records, err = run("dump", f"file://{obj}")
    assert (code, err) == (0, "")
    assert_dump_matches(records, topic)


def test_dump_object_on_s3(tmp_path, moto_s3, s3_bucket, unique_name):
    topic = f"/default/{unique_name('s3')}"
    with open(write_wal(tmp_path, topic, 4), "rb") as fh:
        data = fh.read()
    key = f"{s3_bucket}/storage/topics/default/x/objects/data-0-1700000030.dnb1"
    s3fs.S3FileSystem(**moto_s3.storage_options).pipe(key, data)
    code, records, err = run(
        "dump", f"s3://{key}", "--storage-option", "key=testing", "--storage-option", "secret=testing",
        "--storage-option", f"client_kwargs.endpoint_url={moto_s3.endpoint_url}",
        "--storage-option", "client_kwargs.region_name=us-east-1", "--chunk-bytes", "50",
    )
    assert (code, err) == (0, "")
    assert_dump_matches(records, topic)


def test_dump_of_a_crc_mismatch_names_file_offset_and_byte(tmp_path, unique_name):
    topic = f"/default/{unique_name('crc')}"
    path = write_wal(tmp_path, topic, 3)
    with open(path, "rb") as fh:
        data = bytearray(fh.read())
    second = 16 + int.from_bytes(data[8:12], "little")
    data[second + 20] ^= 0x40
    with open(path, "wb") as fh:
        fh.write(data)
    code, records, err = run("dump", path)
    assert code == 1
    assert [r["offset"] for r in records] == [0]
    assert path in err and f"at byte {second}" in err and "offset 1" in err and "CRC" in err


def test_dump_of_a_torn_tail_exits_1(tmp_path, unique_name):
    path = write_wal(tmp_path, f"/default/{unique_name('torn')}", 2)
    size = os.path.getsize(path)
    with open(path, "ab") as fh:
        fh.write((2).to_bytes(8, "little") + (99).to_bytes(4, "little"))
    code, records, err = run("dump", path)
    assert code == 1 and len(records) == 2
    assert path in err and f"at byte {size}" in err and "offset 2" in err


def test_dump_of_an_undecodable_payload_exits_1(tmp_path):
    payload = b"\xff\xff"
    path = tmp_path / "wal.log"
    path.write_bytes((7).to_bytes(8, "little") + len(payload).to_bytes(4, "little")
                     + zlib.crc32(payload).to_bytes(4, "little") + payload)
    code, records, err = run("dump", str(path))
    assert (code, records) == (1, [])
    assert str(path) in err and "offset 7" in err and "at byte 0" in err


def test_dump_of_a_missing_file_exits_3(tmp_path):
    code, _records, err = run("dump", str(tmp_path / "nope.log"))
    assert code == 3 and "nope.log" in err


def test_dump_of_a_partitioned_topics_base_name_names_its_partitions_wal_files(tmp_path, unique_name):
    # The README once said `dump ./danube-data/wal/default/orders/wal.log` for a partitioned topic:
    # its WAL is per partition, `orders-part-N/wal.log`, and the answer was a bare "no such file".
    name = unique_name("orders")
    for k in range(2):
        write_wal(tmp_path, f"/default/{name}-part-{k}", 1)
    code, _records, err = run("dump", str(tmp_path / "default" / name / "wal.log"))
    assert code == 3
    assert f"{name!r} is a partitioned topic" in err
    assert all(str(tmp_path / "default" / f"{name}-part-{k}" / "wal.log") in err for k in range(2)), err
    code, _records, err = run("dump", str(tmp_path / "default" / "nope" / "wal.log"))
    assert code == 3 and "is a partitioned topic" not in err


def test_bad_storage_option_exits_2(tmp_path):
    code, _records, err = run("dump", str(tmp_path / "x"), "--storage-option", "novalue")
    assert code == 2 and "novalue" in err


def test_module_entry_point_runs(tmp_path, unique_name):
    path = write_wal(tmp_path, f"/default/{unique_name('cli')}", 1)
    done = subprocess.run(
        [sys.executable, "-m", "broker.tools", "dump", path], cwd=REPO_ROOT,
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["offset"] == 0


def test_objects_lists_descriptors_cur_and_state(etcd_endpoint, unique_name):
    topic = TopicName("default", unique_name("objs"))
    root = f"/{unique_name('root')}"
    keys = StorageKeys(root)
    descriptors = [
        ObjectDescriptor(f"data-{s}-1700000030.dnb1", s, s + 9, 950, None, 1700000031,
                         offset_index=[(s, 0)])
        for s in (0, 10)
    ]
    with EtcdMetadataStore(etcd_endpoint) as store:
        for d in descriptors:
            store.put(keys.object_key(topic, d.start_offset), d.to_json())
        store.put(keys.cur_key(topic), CurPointer.for_offset(10).to_json())
        code, lines, err = run("objects", "--etcd", etcd_endpoint, "--topic", str(topic), "--root-prefix", root)
        assert (code, err) == (0, "")
        assert [line["kind"] for line in lines] == ["descriptor", "descriptor", "cur", "state"]
        assert [line["descriptor"] for line in lines[:2]] == [
            json.loads(d.to_json()) for d in descriptors
        ]
        assert lines[0]["key"] == keys.object_key(topic, 0)
        assert lines[2]["cur"] == {"start": "00000000000000000010"}
        assert lines[3]["state"] is None
        sealed = SealedState(broker_id=2**63 + 5, last_committed_offset=19, sealed=True, timestamp=1700000040)
        store.put(keys.state_key(topic), sealed.to_json())
        store.put(keys.objects_prefix(topic) + "00000000000000000099", b"{not json")
        code, lines, err = run("objects", "--etcd", etcd_endpoint, "--topic", str(topic), "--root-prefix", root)
    assert code == 1 and "00000000000000000099" in err
    assert lines[-1]["state"] == {"broker_id": 2**63 + 5, "last_committed_offset": 19,
                                  "sealed": True, "timestamp": 1700000040}


def test_objects_rejects_a_bad_topic_name(etcd_endpoint):
    code, _lines, err = run("objects", "--etcd", etcd_endpoint, "--topic", "no-slash")
    assert code == 2 and "no-slash" in err


@contextmanager
def partitioned_topic_with_objects(etcd_endpoint: str, unique_name, partitions: int
                                   ) -> Iterator[tuple[TopicName, str, StorageKeys, list[TopicName]]]:
    """A unique base topic's partitions `base-part-K` in the namespace index (as the registry creates
    them, without the assignment markers a broker would react to) under a unique root prefix,
    partition K holding K+1 one-object descriptors: (base, root, keys, partitions), removed on exit."""
    base = TopicName("default", unique_name("orders"))
    root = f"/{unique_name('root')}"
    keys = StorageKeys(root)
    names = [TopicName.partition_name(base, k) for k in range(partitions)]
    with EtcdMetadataStore(etcd_endpoint) as store:
        try:
            for k, name in enumerate(names):
                store.put(namespace_topic_key(name), NULL_JSON)
                for start in range(k + 1):
                    descriptor = ObjectDescriptor(f"data-{start}-1700000030.dnb1", start, start, 95, None,
                                                  1700000031, offset_index=[(start, 0)])
                    store.put(keys.object_key(name, start), descriptor.to_json())
            yield base, root, keys, names
        finally:
            for name in names:
                store.delete(namespace_topic_key(name))
            store.delete_prefix(root + "/")


def test_objects_of_a_partitioned_base_name_lists_each_partition_not_null(etcd_endpoint, unique_name):
    """Regression: `objects --topic /default/orders` of a 3-partition topic printed `null`s only."""
    with partitioned_topic_with_objects(etcd_endpoint, unique_name, 3) as (base, root, keys, names):
        code, lines, err = run("objects", "--etcd", etcd_endpoint, "--topic", str(base), "--root-prefix", root)
    assert (code, err) == (0, "")
    for name in names:
        rows = [line for line in lines if line["key"].startswith(keys.topic_prefix(name))]
        assert [row["kind"] for row in rows] == ["descriptor"] * (name.partition + 1) + ["cur", "state"]
    assert len(lines) == sum(k + 3 for k in range(3))


def test_objects_of_a_topic_that_does_not_exist_exits_3_naming_it(etcd_endpoint, unique_name):
    topic = f"/default/{unique_name('nothing')}"
    code, lines, err = run("objects", "--etcd", etcd_endpoint, "--topic", topic)
    assert (code, lines) == (3, [])
    assert err.count("\n") == 1 and f"topic {topic} does not exist" in err
