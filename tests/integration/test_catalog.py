"""The driver's catalog against a real etcd, moto S3 and local WAL directories.

Topics are written by `TopicBuilder` in the real broker's layout; every data-loss case of the
issue is planned from what the catalog finds.
"""

from __future__ import annotations

import json
import os
import secrets
import uuid
from dataclasses import replace
from typing import Callable, Iterator

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from connectors import topic_audit
from connectors.catalog import TopicCatalog
from connectors.planner import cap_end_offsets, plan_tasks
from connectors.salvage import salvage_tasks
from connectors.task_reader import read_task
from danube_core import keys
from danube_core.checkpoints import WalCheckpoint
from danube_core.errors import DataLossError
from danube_core.metadata import MetadataStore
from danube_core.objectstore import ObjectStore, object_id_for
from danube_core.records import NULL_JSON, BrokerState, dump_cursor
from danube_core.topics import TopicName
from tests.topic_builder import PAYLOAD_OFFSET_IN_FRAME, TopicBuilder, corrupt_byte, messages_of


class CountingMetadata:
    """Delegates to a real store; counts the rows range reads return and whole-history reads."""

    def __init__(self, inner: MetadataStore) -> None:
        self.inner, self.rows, self.history_reads, self.largest_read = inner, 0, 0, 0

    def get_range(self, start_key, end_key, limit=None):
        rows = self.inner.get_range(start_key, end_key, limit)
        self.rows += len(rows)
        self.largest_read = max(self.largest_read, len(rows))
        self.history_reads += start_key.endswith("/objects/")
        return rows

    def get_prefix(self, prefix, keys_only=False):
        self.history_reads += "/objects/" in prefix
        rows = self.inner.get_prefix(prefix, keys_only)
        self.largest_read = max(self.largest_read, len(rows))
        return rows

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
def make(metadata, s3_store, tmp_path) -> Iterator[Callable[..., TopicBuilder]]:
    made: list[TopicBuilder] = []

    def build(topic: str, **kwargs) -> TopicBuilder:
        kwargs.setdefault("broker_id", secrets.randbits(64))
        builder = TopicBuilder(metadata, kwargs.pop("store", s3_store),
                               kwargs.pop("wal_root", str(tmp_path / "wal")), topic, **kwargs)
        made.append(builder)
        return builder

    yield build
    for builder in made:
        builder.close()


@pytest.fixture
def ns() -> str:
    return "ns" + uuid.uuid4().hex[:10]


def catalog(metadata, store: ObjectStore, wal_root: str = "auto", fail: bool = True) -> TopicCatalog:
    return TopicCatalog(metadata, root_prefix=keys.DEFAULT_ROOT_PREFIX, storage_url=store.url,
                        storage_options=store.storage_options, wal_root=wal_root, fail_on_data_loss=fail)


def plan(cat: TopicCatalog, topic: str, start: int, end: int, fail: bool = True):
    snap = cat.snapshot(topic, start)
    return plan_tasks({topic: snap}, {topic: start}, {topic: end}, max_partition_bytes=1 << 20,
                      fail_on_data_loss=fail)


def read_back(cat: TopicCatalog, topic: str, start: int, end: int):
    return messages_of(b for t in plan(cat, topic, start, end).tasks for b in read_task(t))


# ---- topics -------------------------------------------------------------------------------

def test_resolve_topics(metadata, make, ns):
    for name in ("orders-part-0", "orders-part-2", "orders-part-10", "orders-part-1", "ordersx", "other"):
        metadata.put(keys.namespace_topic_key(TopicName(ns, name)), NULL_JSON)
    cat = catalog(metadata, ObjectStore("memory://resolve"), wal_root="none")
    parts = [f"/{ns}/orders-part-{k}" for k in (0, 1, 2, 10)]
    assert list(map(str, cat.resolve_topics([f"/{ns}/orders"]))) == parts
    assert list(map(str, cat.resolve_topics([f"/{ns}/other", f"/{ns}/orders-part-2"]))) == \
        [f"/{ns}/orders-part-2", f"/{ns}/other"]
    assert list(map(str, cat.resolve_topics([f"/{ns}/later"]))) == [f"/{ns}/later"]
    assert list(map(str, cat.resolve_topics(pattern=f"/{ns}/orders"))) == parts
    assert list(map(str, cat.resolve_topics(pattern=r".*x", namespace=ns))) == [f"/{ns}/ordersx"]
    assert len(cat.resolve_topics(namespace=ns)) == 6
    with pytest.raises(ValueError, match="exactly one"):
        cat.resolve_topics([f"/{ns}/a"], namespace=ns)
    with pytest.raises(ValueError, match="exactly one"):
        cat.resolve_topics()


# ---- offsets and snapshots ----------------------------------------------------------------

def test_offsets_and_snapshot_of_objects_plus_wal(metadata, make, s3_store, unique_name):
    b = make(f"/default/{unique_name('t')}")
    b.append(1500)
    b.rotate()
    b.append(700)
    b.upload()  # one object spanning wal.log and wal.1.log
    b.append(30)
    ckpt = WalCheckpoint.decode(open(f"{b.wal_dir}/wal.ckpt", "rb").read(), "wal.ckpt")
    assert ckpt.file_path.startswith("./danube-data/wal/")  # relative, as the broker writes it
    cat = catalog(metadata, s3_store)
    assert cat.earliest_offsets([b.name]) == {b.name: 0}
    assert cat.latest_offsets([b.name]) == {b.name: 2230}
    snap = cat.snapshot(b.name, 100)
    assert [o.object_id for o in snap.objects] == [b.descriptors[0].object_id]
    assert snap.objects[0].index_offsets[:3] == (0, 1000, 2000) and snap.wal[-1].stop_offset == 2230
    assert snap.wal_start <= 2200 and snap.object_storage_options == s3_store.storage_options
    assert read_back(cat, b.name, 0, 2230) == [b.messages[o] for o in range(2230)]


def uploaded_in_fives(make, unique_name, uploads: int = 40) -> TopicBuilder:
    """A topic of `uploads` objects of 5 messages each, every one uploaded."""
    b = make(f"/default/{unique_name('t')}")
    for _ in range(uploads):
        b.append(5)
        b.upload()
    return b


def test_planning_reads_descriptors_by_range_not_the_whole_history(metadata, make, s3_store, unique_name):
    b = uploaded_in_fives(make, unique_name)
    counting = CountingMetadata(metadata)
    cat = catalog(counting, s3_store, wal_root="none")
    cat.latest_offsets([b.name])  # the run audit reads the whole history once per catalog
    assert counting.history_reads == 1
    counting.rows = 0
    snap = cat.snapshot(b.name, 187)
    assert [o.start_offset for o in snap.objects] == [185, 190, 195]
    assert counting.rows <= 8  # `cur`'s range, the covering descriptor and the two after it
    counting.rows = 0
    assert [o.start_offset for o in cat.snapshot(b.name, 192).objects] == [190, 195]
    assert counting.rows == 3  # `cur`'s range, then from the descriptor the last snapshot knew
    counting.rows = 0
    assert [o.start_offset for o in cat.snapshot(b.name, 197).objects] == [195]
    assert counting.rows == 1
    assert counting.history_reads == 1


def test_a_run_audit_folds_a_clean_history_a_page_at_a_time(metadata, make, s3_store, unique_name, monkeypatch):
    """A stream from `earliest` audits the history it will read holding one page of it; the
    audit is the one a whole read gives, and every message is still read."""
    monkeypatch.setattr(topic_audit, "AUDIT_PAGE_KEYS", 8)
    b = uploaded_in_fives(make, unique_name)
    counting = CountingMetadata(metadata)
    cat = catalog(counting, s3_store, wal_root="none")
    audit = cat.audit(b.name)
    assert audit.clean and (audit.current_first, audit.current_stop, audit.held) == (0, 200, [(0, 200)])
    assert counting.largest_read <= 8 and counting.history_reads == 1
    assert len(audit.current_descriptors) == 40  # kept: fewer than COMPACT_KEEP
    assert read_back(cat, b.name, 0, 200) == [b.messages[o] for o in range(200)]


def test_an_upload_between_the_wal_scan_and_the_run_audit_is_not_a_restart(metadata, make, s3_store, unique_name,
                                                                             monkeypatch):
    """The soak's first find (issue 43): a stream's first look at a topic scanned the WAL, then
    the run audit read the descriptors; the broker uploading in between left descriptors
    above that WAL head, which the audit took for a restart at offset 0, so it called the new
    objects stale and their offsets reused (data loss, at every pipeline start under load)."""
    b = make(f"/default/{unique_name('t')}")
    b.append(40)
    b.upload()
    b.append(25)
    original = topic_audit.TopicAuditor.audit

    def audit_after_an_upload(self, *args, **kwargs):
        b.append(5)
        b.upload()  # what the WAL scan before the audit did not see
        return original(self, *args, **kwargs)

    monkeypatch.setattr(topic_audit.TopicAuditor, "audit", audit_after_an_upload)
    audit = catalog(metadata, s3_store).audit(b.name)
    assert audit.clean, audit.summary()
    assert audit.wal_restart is None and not audit.stale_descriptors
    assert (audit.current_first, audit.current_stop) == (0, 70)


def test_a_topic_back_on_a_broker_with_its_old_wal_file_is_not_a_restart(metadata, make, s3_store, unique_name,
                                                                         tmp_path):
    """The soak's defect 4: a broker that had served the topic loads it again after another broker
    uploaded past its old frames, and opens a new, still empty WAL file at the next offset. The
    old file's frames (below the uploads) are no run of their own: until the new file gets its
    first frame, the WAL's head is where the uploads end, not below them (a restart)."""
    b = make(f"/default/{unique_name('t')}")
    first_broker, first_root = b.broker_id, b.wal_root
    b.append(30)
    b.upload()  # 0..29 uploaded; the first broker's wal.log keeps them
    b.seal()
    b.move_to(secrets.randbits(64), str(tmp_path / "wal-other"))
    b.append(20)
    b.upload()  # 30..49, by the other broker
    b.seal()
    b.move_to(first_broker, first_root)
    b.rotate()  # a new empty wal.1.log; wal.log still holds 0..29
    cat = catalog(metadata, s3_store)
    audit = cat.audit(b.name)
    assert audit.clean and audit.wal_restart is None, audit.summary()
    assert cat.latest_offsets([b.name]) == {b.name: 50}
    assert read_back(cat, b.name, 0, 50) == [b.messages[o] for o in range(50)]
    b.append(5)  # the new file's first frames: 50..54
    assert cat.latest_offsets([b.name]) == {b.name: 55}
    assert read_back(cat, b.name, 0, 55) == [b.messages[o] for o in range(55)]


def leave_orphan(b: TopicBuilder, store: ObjectStore, first: int, frames: bytes) -> str:
    """An object of `frames` from offset `first`, as an uploader leaves it when it dies (or its
    etcd put fails) after closing the object and before putting its descriptor."""
    object_id = object_id_for(first, b.descriptors[-1].created_at if b.descriptors else 1)
    with store.open_writer(b.topic, object_id) as writer:
        writer.write(frames)
    return object_id


def connector_options(b: TopicBuilder, store: ObjectStore, etcd_endpoint: str, subscription: str) -> dict:
    return {"etcd.endpoints": etcd_endpoint, "storage.url": store.url,
            "storage.options": json.dumps(store.storage_options), "topic": b.name,
            "subscription": subscription, "startingOffsets": "earliest"}


def test_an_object_orphaned_by_a_failed_descriptor_write_is_read_once_not_as_an_older_run(
        metadata, make, s3_store, unique_name, etcd_endpoint):
    """The soak's open defect 3 (issue 43): a broker uploaded offsets 40..41 and died before
    putting the descriptor; the next owner uploaded 40..45 again, from the dead broker's WAL,
    under a descriptor. The same messages of the same run, not an older run's: a batch read and
    an availableNow stream read every message exactly once, and the audit is clean."""
    from connectors.batch import DanubeBatchReader
    from connectors.options import parse_options
    from connectors.partitions import read_partition
    from connectors.stream import DanubeStreamReader

    b = make(f"/default/{unique_name('t')}")
    b.append(40)
    b.upload()
    b.append(6)
    orphan = leave_orphan(b, s3_store, 40, b"".join(encode(b, o) for o in (40, 41)))
    b.upload()  # 40..45, recovered and uploaded again under a descriptor
    b.append(4)  # 46..49 in the WAL only
    every = [(o, b.messages[o].payload, b.messages[o].publish_time) for o in range(50)]

    def rows_of(partitions) -> list[tuple[int, bytes, int]]:
        """(offset, payload, publish time in ms) of every row the connector's partitions read."""
        rows = [row for p in partitions for x in read_partition(p, False) for row in x.to_pylist()]
        return sorted((r["offset"], r["payload"], round(r["publish_time"].timestamp() * 1000)) for r in rows)

    options = connector_options(b, s3_store, etcd_endpoint, unique_name("s"))

    batch = DanubeBatchReader(parse_options({**options, "endingOffsets": "latest"}))
    assert rows_of(batch.partitions()) == every

    stream = DanubeStreamReader(parse_options(options))
    try:
        stream.prepareForTriggerAvailableNow()
        start = stream.initialOffset()
        end = stream.latestOffset(start, ReadAllAvailable())
        assert rows_of(stream.partitions(start, end)) == every
        stream.commit(end)
    finally:
        stream.stop()
    audit = catalog(metadata, s3_store).audit(b.name)
    assert audit.clean, audit.summary()
    assert s3_store.exists(s3_store.object_url(b.topic, orphan))  # left in place: readers never delete


@pytest.mark.parametrize("differs", ["payload", "publish_time", "torn_tail", "past_the_descriptors"])
def test_an_unreferenced_object_with_other_frames_at_the_current_runs_offsets_is_still_reuse(
        metadata, make, s3_store, unique_name, differs):
    """Only byte-identical frames make an unreferenced object a repeated upload: one differing
    message (another payload, a publish time 1 ms off), a torn frame, or offsets the current
    run's descriptors do not hold keep it an older run's, and its offsets reused, naming it."""
    from danube_core.frames import encode_frame
    from danube_core.message import encode_message

    b = make(f"/default/{unique_name('t')}")
    b.append(40)
    b.upload()
    b.append(8)
    frames = [encode(b, o) for o in (40, 41)]
    if differs in ("payload", "publish_time"):
        m = b.messages[41]
        other = (replace(m, payload=m.payload + b"!") if differs == "payload"
                 else replace(m, publish_time=m.publish_time + 1))
        frames[1] = encode_frame(41, encode_message(other))
    elif differs == "torn_tail":
        frames.append(encode(b, 42)[:20])
    else:
        frames += [encode(b, o) for o in range(42, 48)]
    orphan = leave_orphan(b, s3_store, 40, b"".join(frames))
    b.upload(max_frames=6)  # 40..45 under a descriptor; 46..47 in the WAL only
    last = 47 if differs == "past_the_descriptors" else 41
    with pytest.raises(DataLossError, match=rf"\[40, 4\d\).*reused.*{orphan} offsets 40\.\.{last}"):
        plan(catalog(metadata, s3_store), b.name, 0, 48)
    stale = catalog(metadata, s3_store, fail=False).audit(b.name).stale_sources
    assert [(s.name, s.first_offset, s.last_offset) for s in stale] == [(orphan, 40, last)]


@pytest.mark.parametrize("shape", ["gap", "restart"])
def test_a_fold_that_meets_another_run_audits_the_whole_list(metadata, make, s3_store, unique_name, monkeypatch,
                                                              shape):
    """Past the first page: a gap is still data loss naming its offsets; a restart that
    overwrote a descriptor is still reuse naming the older object."""
    monkeypatch.setattr(topic_audit, "AUDIT_PAGE_KEYS", 4)
    b = make(f"/default/{unique_name('t')}")
    uploads = []
    for _ in range(20):
        b.append(10)
        uploads.append(b.upload())
    if shape == "gap":
        metadata.delete(b.storage_keys.object_key(b.topic, 150))
        with pytest.raises(DataLossError, match=r"\[150, 160\).*gap in the descriptor chain"):
            plan(catalog(metadata, s3_store, wal_root="none"), b.name, 0, 200)
        return
    b.crash_restart(secrets.randbits(64))
    b.append(10)
    b.upload()  # overwrites descriptor 0 of the older run
    stale = catalog(metadata, s3_store, wal_root="none", fail=False).audit(b.name).stale_sources
    assert uploads[0].object_id in {s.name for s in stale}


def test_walroot_none_reads_sealed_objects_only(metadata, make, s3_store, unique_name):
    b = make(f"/default/{unique_name('t')}")
    b.append(10)
    b.upload()
    b.append(5)
    cat = catalog(metadata, s3_store, wal_root="none")
    assert cat.latest_offsets([b.name]) == {b.name: 10}
    b.seal()
    assert cat.latest_offsets([b.name]) == {b.name: 15}
    with pytest.raises(DataLossError, match=r"\[10, 15\)"):
        plan(cat, b.name, 0, 15)


def test_incremental_wal_scans_follow_appends(metadata, make, s3_store, unique_name):
    b = make(f"/default/{unique_name('t')}")
    cat = catalog(metadata, s3_store)
    assert cat.latest_offsets([b.name]) == {b.name: 0}
    for n in (3, 50, 1):
        b.append(n)
        assert cat.latest_offsets([b.name]) == {b.name: len(b.messages)}
    assert read_back(cat, b.name, 0, 54) == [b.messages[o] for o in range(54)]


def test_wal_scan_starts_at_the_uploaders_resume_point(metadata, make, s3_store, unique_name):
    b = make(f"/default/{unique_name('t')}")
    b.append(100)
    b.upload()
    b.append(20)
    path, pos = b.frame_position(10)
    corrupt_byte(path, pos + PAYLOAD_OFFSET_IN_FRAME)  # damage an uploaded frame only
    assert catalog(metadata, s3_store).latest_offsets([b.name]) == {b.name: 120}


def test_offsets_for_timestamp(metadata, make, s3_store, unique_name):
    b = make(f"/default/{unique_name('t')}")
    for _ in range(4):
        b.append(25, publish_time=lambda o: 1_000 + 10 * o)
        b.upload()
    b.append(25, publish_time=lambda o: 1_000 + 10 * o)  # WAL only
    cat = catalog(metadata, s3_store)
    found = {ts: cat.offsets_for_timestamp([b.name], ts)[b.name] for ts in (0, 1_000, 1_005, 1_600, 1_995, 2_240, 9_999)}
    assert found == {0: 0, 1_000: 0, 1_005: 1, 1_600: 60, 1_995: 100, 2_240: 124, 9_999: 125}


def test_read_cursor(metadata, make, s3_store, unique_name):
    b = make(f"/default/{unique_name('t')}")
    cat = catalog(metadata, s3_store)
    assert cat.read_cursor(b.name, "sub") is None
    metadata.put(keys.cursor_key(b.topic, "sub"), dump_cursor(2**63 + 5))
    assert cat.read_cursor(b.name, "sub") == 2**63 + 5


def test_exact_byte_caps_read_frame_headers_inside_an_object(metadata, make, s3_store, unique_name):
    b = make(f"/default/{unique_name('t')}")
    b.append(300, payload=lambda o: b"x" * (o % 50))
    b.upload()
    cat = catalog(metadata, s3_store)
    snap = cat.snapshot(b.name, 40)
    budget = 5_000
    end = cap_end_offsets({b.name: 40}, {b.name: 300}, {b.name: snap}, max_messages=None,
                          max_bytes=budget, frame_index=cat.read_frame_index)[b.name]
    size = lambda lo, hi: sum(len(encode(b, o)) for o in range(lo, hi))  # noqa: E731
    assert size(40, end) <= budget < size(40, end + 1)


def encode(b: TopicBuilder, offset: int) -> bytes:
    from danube_core.frames import encode_frame
    from danube_core.message import encode_message

    return encode_frame(offset, encode_message(b.messages[offset]))


# ---- topic moves and data loss ------------------------------------------------------------

def test_sealed_offsets_never_uploaded_come_from_the_previous_owners_wal(metadata, make, s3_store, tmp_path, unique_name):
    b = make(f"/default/{unique_name('t')}", wal_root=str(tmp_path / "a"))
    old = b.broker_id
    b.append(100)
    b.upload()
    b.append(21)  # sealed, never uploaded
    b.seal()
    b.move_to(secrets.randbits(64), str(tmp_path / "b"))
    b.append(10)
    cat = catalog(metadata, s3_store)
    assert cat.latest_offsets([b.name]) == {b.name: 131}
    assert [m.msg_id.topic_offset for m in read_back(cat, b.name, 0, 131)] == list(range(131))
    b.unregister(old)  # its WAL can no longer be found
    with pytest.raises(DataLossError, match=r"\[100, 121\)"):
        plan(catalog(metadata, s3_store), b.name, 0, 131)
    lost = plan(catalog(metadata, s3_store, fail=False), b.name, 0, 131, fail=False).lost
    assert sum(r.count for r in lost) == 21


def test_dead_owners_wal_found_through_its_durable_state_record(metadata, make, s3_store, tmp_path, unique_name):
    b = make(f"/default/{unique_name('t')}", wal_root=str(tmp_path / "a"))
    b.append(40)
    b.upload()
    b.append(12)  # acked by the owner, not uploaded yet
    dead = b.broker_id
    metadata.put(keys.broker_state_key(dead),
                 BrokerState("active", "boot", wal_url="file://" + str(tmp_path / "a")).to_json())
    b.unregister(dead)  # the registration lease expired with the broker; the state record stays
    cat = catalog(metadata, s3_store)
    assert cat.latest_offsets([b.name]) == {b.name: 52}
    assert [m.msg_id.topic_offset for m in read_back(cat, b.name, 0, 52)] == list(range(52))


def test_wal_root_template_with_broker_id(metadata, make, s3_store, tmp_path, unique_name):
    first, second = secrets.randbits(64), secrets.randbits(64)
    b = make(f"/default/{unique_name('t')}", wal_root=str(tmp_path / f"brokers/{first}"),
             broker_id=first, register=False)
    b.append(12)
    b.seal()
    b.move_to(second, str(tmp_path / f"brokers/{second}"), register=False)
    b.append(3)
    b.metadata.put(keys.register_key(first), b"{\"admin_addr\":\"\",\"broker_url\":\"\",\"connect_url\":\"\"}")
    b.registered.add(first)
    cat = catalog(metadata, s3_store, wal_root=f"file://{tmp_path}/brokers/{{broker_id}}")
    assert cat.latest_offsets([b.name]) == {b.name: 15}
    assert [m.msg_id.topic_offset for m in read_back(cat, b.name, 0, 15)] == list(range(15))


def test_wal_pruned_before_upload_is_data_loss(metadata, make, s3_store, unique_name):
    b = make(f"/default/{unique_name('t')}")
    b.append(100)
    b.upload()
    b.rotate()
    b.append(50)
    b.rotate()
    b.append(20)
    os.remove(b.file_path(1))  # offsets 100..149 deleted before any upload
    cat = catalog(metadata, s3_store)
    assert cat.latest_offsets([b.name]) == {b.name: 170}
    with pytest.raises(DataLossError, match=r"\[100, 150\)"):
        plan(cat, b.name, 0, 170)


def test_gap_in_the_descriptor_chain_is_data_loss(metadata, make, s3_store, unique_name):
    b = make(f"/default/{unique_name('t')}")
    for _ in range(3):
        b.append(10)
        b.upload()
    metadata.delete(b.storage_keys.object_key(b.topic, 10))
    with pytest.raises(DataLossError, match=r"\[10, 20\).*gap in the descriptor chain"):
        plan(catalog(metadata, s3_store, wal_root="none"), b.name, 0, 30)


def test_restart_at_0_overwriting_descriptor_0_is_reuse_and_data_loss(metadata, make, s3_store, unique_name):
    b = make(f"/default/{unique_name('t')}")
    b.append(100)
    first = b.upload()
    b.append(100)
    second = b.upload()
    b.crash_restart(secrets.randbits(64))
    b.append(30)
    b.upload()  # overwrites descriptor 0 with offsets 0..29 of the new run
    for wal_root in ("auto", "none"):
        strict = catalog(metadata, s3_store, wal_root=wal_root)
        assert strict.latest_offsets([b.name]) == {b.name: 30}
        with pytest.raises(DataLossError, match="offsets went backwards"):
            plan(strict, b.name, 200, 30)
        with pytest.raises(DataLossError, match=rf"\[0, 30\).*reused.*{first.object_id}"):
            plan(strict, b.name, 0, 30)
        skipping = catalog(metadata, s3_store, wal_root=wal_root, fail=False)
        result = plan(skipping, b.name, 0, 30, fail=False)
        assert result.lost_offsets == {b.name: 30}
        assert messages_of(x for t in result.tasks for x in read_task(t)) == [b.messages[o] for o in range(30)]
        stale = {(s.name, s.first_offset, s.last_offset, s.referenced)
                 for s in skipping.audit(b.name).stale_sources}
        assert stale == {(first.object_id, 0, 99, False), (second.object_id, 100, 199, True)}


@pytest.mark.parametrize("new_run", [30, 250])
def test_restart_at_0_not_yet_uploaded_is_found_in_the_shared_wal_file(metadata, make, s3_store, unique_name,
                                                                        new_run):
    """The real broker's same-host restart: one `wal.log` holds the old run and the new one
    back to back, and the new run has not uploaded yet, so every descriptor is the old run's:
    whether the new run's head is still below the uploads (30) or already past them (250)."""
    b = make(f"/default/{unique_name('t')}")
    b.append(200)
    old = dict(b.messages)
    first = b.upload()
    b.crash_restart(secrets.randbits(64))
    b.append(new_run)  # offsets from 0 again, behind 0..199 in the same wal.log
    reused = min(new_run, 200)
    strict = catalog(metadata, s3_store)
    assert strict.latest_offsets([b.name]) == {b.name: new_run}
    with pytest.raises(DataLossError, match=rf"\[0, {reused}\).*{first.object_id}.*wal\.log"):
        plan(strict, b.name, 0, new_run)
    skipping = catalog(metadata, s3_store, fail=False)
    result = plan(skipping, b.name, 0, new_run, fail=False)
    assert result.lost_offsets == {b.name: reused}
    assert messages_of(x for t in result.tasks for x in read_task(t)) == [b.messages[o] for o in range(new_run)]
    audit = skipping.audit(b.name)
    assert {(s.kind, s.first_offset, s.last_offset) for s in audit.stale_sources} == {
        ("object", 0, 199), ("wal", 0, 199)}
    salvaged = salvage_tasks(skipping, b.name, [first.object_id], fail_on_data_loss=True)
    assert messages_of(x for t in salvaged for x in read_task(t)) == [old[o] for o in range(200)]
    old_run = next(s.name for s in audit.stale_sources if s.kind == "wal")
    assert old_run.endswith("/wal.log#0")
    salvaged = salvage_tasks(skipping, b.name, [old_run], fail_on_data_loss=True)
    assert [t.source for t in salvaged] == [old_run]
    assert messages_of(x for t in salvaged for x in read_task(t)) == [old[o] for o in range(200)]
    both = salvage_tasks(skipping, b.name, [old_run.split("#")[0]], fail_on_data_loss=True)
    assert [(t.start_offset, t.end_offset) for t in both] == [(0, 200), (0, new_run)]


@pytest.mark.parametrize("fail", [True, False])
def test_restart_while_a_stream_is_past_its_first_offset_is_reported(metadata, make, s3_store, unique_name, fail):
    """A stream at offset 150 of run one; the broker restarts at 0 and uploads 0..199 of run two
    before the next trigger. Run two's 0..149 would never be read: data loss, not a quiet skip."""
    from connectors.options import parse_options
    from connectors.stream import DanubeStreamReader
    from tests.conftest import _RUNNING_ETCD

    b = make(f"/default/{unique_name('t')}")
    b.append(150)
    b.upload()
    options = {"etcd.endpoints": _RUNNING_ETCD[0].endpoint, "storage.url": s3_store.url,
               "storage.options": json.dumps(s3_store.storage_options), "topic": b.name,
               "subscription": unique_name("s"), "startingOffsets": "earliest",
               "failOnDataLoss": str(fail).lower()}
    reader = DanubeStreamReader(parse_options(options))
    try:
        first = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
        assert first["offsets"] == {b.name: 150}
        b.crash_restart(secrets.randbits(64))
        b.append(200)
        b.upload()
        # The reader's cache follows etcd through a watch: the next trigger must see run two.
        reader._driver().scope.cache.wait_for_revision(metadata.current_revision(), 10)
        if fail:
            with pytest.raises(DataLossError, match=r"\[0, 150\).*restarted at 0"):
                reader.latestOffset(first, ReadAllAvailable())
        else:
            reader.latestOffset(first, ReadAllAvailable())
            assert reader.reportLatestOffset()["skippedOffsets"][b.name] >= 150
    finally:
        reader.stop()
