"""A dataset's tail, without servers: the offsets a Delta version holds, the store's snapshots and
trims, the hand-over's pin, the follower's caps and states, the wire, the admission's refusals."""

from __future__ import annotations

import io
import json
import threading
import time

import duckdb
import pyarrow as pa
import pytest

from speedlayer.api.v1 import management_service_pb2 as mg
from speedlayer.errors import InvalidRequestError, PreconditionError, TenantIsolationError
from speedlayer.master.tail_admission import admit_tail, validate_tail
from speedlayer.protocol.tail_wire import TailWireError, read_answer, read_request, write_answer, write_failure, write_request
from speedlayer.records import DatasetSpec, TenantConfig
from speedlayer.sources import ResolvedTable
from speedlayer.sources.delta_offsets import TableOffsets, fold_commits
from speedlayer.tail_spec import TailSpec
from speedlayer.worker.tail_follower import TailFollower, capped
from speedlayer.worker.tail_store import TailSnapshot, TailStore
from speedlayer.worker.tail_table import TailTable
from speedlayer.worker.tails import WorkerTails, oldest
from tests.rig import eventually

pytestmark = pytest.mark.unit

P0, P1 = "/default/orders-part-0", "/default/orders-part-1"


def rows(topic: str, offsets: range) -> pa.Table:
    return pa.table({"_topic": [topic] * len(offsets), "_offset": pa.array(list(offsets), pa.int64()),
                     "v": [f"{topic}:{o}" for o in offsets]})


def tail_store(start: dict[str, int], db: duckdb.DuckDBPyConnection | None = None, **limits) -> TailStore:
    """A store whose rows go to a table in `db` (a database of its own by default)."""
    return TailStore(dict(start), TailTable((db or duckdb.connect()).cursor, "orders"), **limits)


def answered(db: duckdb.DuckDBPyConnection, snap: TailSnapshot) -> list[tuple[str, int]]:
    """The (partition, offset) of the rows an answer reads of `snap` from the tail's table."""
    if snap.relation is None:
        return []
    return db.cursor().execute(f"SELECT _topic, _offset FROM ({snap.relation}) ORDER BY 1, 2").fetchall()


def table_rows(db: duckdb.DuckDBPyConnection, store: TailStore) -> int:
    return db.cursor().execute(f'SELECT count(*) FROM "{store.table.name}"').fetchall()[0][0]


def meta(pipeline: str, **spans: tuple[int, int]) -> str:
    return json.dumps({"pipeline": pipeline, "offsets": {t: {"start": s, "end": e} for t, (s, e) in spans.items()}})


# ---- the offsets a version holds -----------------------------------------------------------

def test_fold_takes_the_greatest_end_per_partition_in_any_order():
    commits = [(2, meta("orders", **{P0: (5, 9)})), (0, meta("orders", **{P0: (0, 5), P1: (0, 3)})), (1, None),
               (3, "not json"), (4, json.dumps({"engineInfo": "x"}))]
    folded = fold_commits(commits)
    assert folded.offsets == {P0: 9, P1: 3} and folded.pipelines == {"orders"}
    assert fold_commits([(5, meta("orders", **{P1: (3, 7)}))], folded).offsets == {P0: 9, P1: 7}


def test_a_versions_offsets_come_from_its_own_commit_files(tmp_path):
    """delta-rs's history() of an older version labels the newest commits with its numbers: the
    commit files are read instead, and a newer version reads only the commits after the last."""
    from deltalake import CommitProperties, write_deltalake

    from speedlayer.errors import SourceError
    from speedlayer.sources.delta_offsets import DeltaOffsets

    table = str(tmp_path / "orders")
    for v in range(4):
        write_deltalake(table, pa.table({"a": [v]}), mode="append", commit_properties=CommitProperties(
            custom_metadata={"userMetadata": meta("orders", **{P0: (v * 10, v * 10 + 10)})}))
    offsets = DeltaOffsets()
    assert offsets.at(table, 1).offsets == {P0: 20}
    assert offsets.at(table, 3).offsets == {P0: 40}
    assert DeltaOffsets().at(table, 2).offsets == {P0: 30}
    (tmp_path / "orders" / "_delta_log" / f"{0:020d}.json").unlink()  # cleaned up
    with pytest.raises(SourceError, match=r"no commit file for version\(s\) \[0\]"):
        DeltaOffsets().at(table, 2)


def test_a_table_no_pipeline_wrote_holds_no_offsets():
    assert fold_commits([(0, None), (1, json.dumps({"note": "manual"}))]) == TableOffsets()


# ---- the spec ------------------------------------------------------------------------------

def test_spec_round_trips_and_refuses_bad_fields_by_name():
    spec = TailSpec("name: orders\n", 10, 0, {P0: 4})
    assert TailSpec.from_json(spec.to_json()) == spec
    assert spec.at({P1: 2}).offsets == {P1: 2} and spec.at({}).follows == spec.follows
    with pytest.raises(ValueError, match="limit_rows"):
        TailSpec.from_json(json.dumps({"pipeline_config": "x", "limit_rows": 0}))
    with pytest.raises(ValueError, match="pipeline_config"):
        TailSpec.from_json(json.dumps({"limit_rows": 3}))
    with pytest.raises(ValueError, match="offsets"):
        TailSpec.from_json(json.dumps({"pipeline_config": "x", "offsets": {P0: -1}}))


def test_dataset_spec_keeps_its_tail_and_reads_old_records():
    spec = DatasetSpec("delta", "/t", tail=TailSpec("x", 5).to_json())
    assert DatasetSpec.from_json(spec.to_json(), "k") == spec
    assert "tail" not in json.loads(DatasetSpec("delta", "/t").to_json())
    assert TenantConfig.from_json(TenantConfig(topic_namespaces=("default",)).to_json(), "k").topic_namespaces == ("default",)


# ---- the store -----------------------------------------------------------------------------

def test_snapshot_reads_exactly_the_rows_at_or_above_the_epochs_offsets():
    db = duckdb.connect()
    store = tail_store({P0: 10, P1: 0}, db, limit_rows=100)
    store.append(rows(P0, range(10, 15)), {P0: 10, P1: 0}, {P0: 15, P1: 0})
    store.append(rows(P1, range(0, 4)), {P1: 0}, {P1: 4})
    snap = store.snapshot({P0: 12, P1: 1})
    assert snap is not None and snap.keys is not None
    got = sorted(zip(snap.keys["_topic"].to_pylist(), snap.keys["_offset"].to_pylist()))
    assert got == [(P0, 12), (P0, 13), (P0, 14), (P1, 1), (P1, 2), (P1, 3)]
    assert answered(db, snap) == got
    assert snap.last_offsets == {P0: 14, P1: 3} and snap.held_rows == 9
    assert store.snapshot({P0: 15, P1: 4}).keys is None  # the epoch holds all of it


def test_rows_and_the_state_that_read_them_are_seen_together():
    """An answer never shows a read's rows with the state from before it (the suite once saw
    every tail row answered while the state still said `starting`)."""
    store = tail_store({P0: 0}, limit_rows=100)
    assert store.snapshot({P0: 0}).state == "starting" and store.age_ms() == -1
    store.append(rows(P0, range(0, 3)), {P0: 0}, {P0: 3}, state="following", caught_up=True)
    snap = store.snapshot({P0: 0})
    assert (snap.held_rows, snap.state) == (3, "following") and store.age_ms() >= 0


def test_a_one_partition_chunk_is_cut_at_the_epochs_offset_as_a_filter_would_cut_it():
    store = tail_store({P0: 0}, limit_rows=100)
    kept = [o for o in range(0, 30) if o % 7]  # offsets the pipeline quarantines are absent
    store.append(pa.concat_tables([rows(P0, range(o, o + 1)) for o in kept]), {P0: 0}, {P0: 30})
    for epoch in (0, 1, 7, 8, 20, 29, 30):
        snap = store.snapshot({P0: epoch})
        assert snap is not None
        got = [] if snap.keys is None else snap.keys["_offset"].to_pylist()
        assert got == [o for o in kept if o >= epoch]


def test_snapshot_refuses_an_epoch_older_than_the_store_rather_than_leave_a_gap():
    store = tail_store({P0: 10}, limit_rows=100)
    assert store.snapshot({P0: 9}) is None
    assert store.snapshot({P0: 10}) is not None


def test_a_partition_the_epoch_holds_nothing_of_is_answered_from_its_start():
    store = tail_store({P0: 5}, limit_rows=100)
    store.append(rows(P1, range(0, 2)), {P1: 0}, {P1: 2})
    snap = store.snapshot({P0: 5})
    assert snap.keys["_offset"].to_pylist() == [0, 1]


def test_append_must_continue_where_the_store_ends():
    store = tail_store({P0: 10}, limit_rows=100)
    with pytest.raises(ValueError, match="continue where it stopped"):
        store.append(rows(P0, range(11, 12)), {P0: 11}, {P0: 12})


def test_trim_drops_what_the_oldest_epoch_holds_and_frees_room():
    db = duckdb.connect()
    store = tail_store({P0: 0}, db, limit_rows=6)
    store.append(rows(P0, range(0, 6)), {P0: 0}, {P0: 6})
    assert store.room() == 0
    pinned = store.snapshot({P0: 0})
    store.trim({P0: 4})
    assert store.held[0] == 2 and store.room() == 4 and store.snapshot({P0: 3}) is None
    # a query's snapshot is never changed under it: the trim's rows stay until it is released
    assert pinned.keys.num_rows == 6 and answered(db, pinned) == [(P0, o) for o in range(6)]
    later = store.snapshot({P0: 4})
    assert answered(db, later) == [(P0, 4), (P0, 5)]
    assert table_rows(db, store) == 6
    pinned.release()
    assert table_rows(db, store) == 2  # released: the trim's rows are deleted
    later.release()


def test_a_trim_past_what_the_tail_read_skips_what_every_epoch_holds():
    store = tail_store({P0: 0}, limit_rows=100)
    store.append(rows(P0, range(0, 3)), {P0: 0}, {P0: 3})
    store.trim({P0: 10})  # the oldest epoch served holds [0, 10): nothing below is read
    assert store.ends == {P0: 10} and store.held[0] == 0
    store.append(rows(P0, range(3, 12)), {P0: 3}, {P0: 12})  # a read begun before the trim
    assert store.ends == {P0: 12} and store.snapshot({P0: 10}).keys["_offset"].to_pylist() == [10, 11]
    with pytest.raises(ValueError, match="continue where it stopped"):
        store.append(rows(P0, range(13, 14)), {P0: 13}, {P0: 14})


def test_small_reads_are_merged_into_few_chunks_and_snapshots_keep_what_they_pinned():
    db = duckdb.connect()
    store = tail_store({P0: 0}, db, limit_rows=10_000)
    pinned = None
    for i in range(100):
        store.append(rows(P0, range(i * 3, i * 3 + 3)), {P0: i * 3}, {P0: i * 3 + 3})
        if i == 10:
            pinned = store.snapshot({P0: 0})
    snap = store.snapshot({P0: 5})
    assert len(store._chunks) == 1 and store.held[0] == 300
    assert snap.keys["_offset"].to_pylist() == list(range(5, 300))
    assert pinned.keys["_offset"].to_pylist() == list(range(0, 33))
    assert answered(db, pinned) == [(P0, o) for o in range(0, 33)]


def test_a_column_a_newer_schema_adds_reaches_the_table_null_in_the_rows_before_it():
    db = duckdb.connect()
    store = tail_store({P0: 0}, db, limit_rows=100)
    store.append(rows(P0, range(0, 2)), {P0: 0}, {P0: 2})
    store.append(rows(P0, range(2, 4)).append_column("region", pa.array(["eu", None])), {P0: 2}, {P0: 4})
    snap = store.snapshot({P0: 0})
    got = db.cursor().execute(f"SELECT _offset, v, region FROM ({snap.relation}) ORDER BY 1").fetchall()
    assert got == [(0, f"{P0}:0", None), (1, f"{P0}:1", None), (2, f"{P0}:2", "eu"), (3, f"{P0}:3", None)]


def test_a_stopped_tail_drops_its_table_once_the_answers_reading_it_have_ended():
    db = duckdb.connect()
    store = tail_store({P0: 0}, db, limit_rows=100)
    store.append(rows(P0, range(0, 3)), {P0: 0}, {P0: 3})
    pinned = store.snapshot({P0: 1})
    store.close()
    store.append(rows(P0, range(3, 5)), {P0: 3}, {P0: 5})  # a read still on its way: ignored
    store.trim({P0: 2})
    assert answered(db, pinned) == [(P0, 1), (P0, 2)]
    pinned.release()
    pinned.release()  # once only
    assert db.execute(f"SELECT count(*) FROM duckdb_tables() WHERE table_name = '{store.table.name}'").fetchall() == [(0,)]


def test_a_byte_limit_stops_the_store_too():
    store = tail_store({P0: 0}, limit_rows=1000, limit_bytes=1)
    store.append(rows(P0, range(0, 2)), {P0: 0}, {P0: 2})
    assert store.room() == 0


def test_a_tail_of_no_rows_is_refused():
    with pytest.raises(ValueError, match="limit_rows=0"):
        tail_store({}, limit_rows=0)


def test_oldest_offsets_leave_out_a_partition_one_epoch_holds_nothing_of():
    assert oldest([{P0: 5, P1: 3}, {P0: 9}]) == {P0: 5}
    assert oldest([]) == {}


# ---- the follower ------------------------------------------------------------------------

def test_capped_shares_the_room_between_partitions_and_never_exceeds_it():
    assert capped({P0: 0, P1: 0}, {P0: 5, P1: 5}, 100) == {P0: 5, P1: 5}
    ends = capped({P0: 0, P1: 0}, {P0: 100, P1: 2}, 10)
    assert ends == {P0: 8, P1: 2}
    assert capped({P0: 0}, {P0: 9}, 0) == {P0: 0}


class FakeFeed:
    """A topic in memory: `produce(topic, n)` adds offsets; reads give a row per offset except
    those in `quarantine`. `fail` makes the next calls raise."""

    def __init__(self, earliest: dict[str, int] | None = None) -> None:
        self.head = dict(earliest or {P0: 0, P1: 0})
        self.first = dict(self.head)
        self.quarantine: set[tuple[str, int]] = set()
        self.fail: Exception | None = None
        self.lock = threading.Lock()
        self.alive = True

    def produce(self, topic: str, n: int) -> None:
        with self.lock:
            self.head[topic] += n

    def topics(self):
        return sorted(self.head)

    def earliest(self, topics):
        return {t: self.first[t] for t in topics}

    def latest(self, topics, above=None, wait_s=0.0):
        if self.fail is not None:
            raise self.fail
        with self.lock:
            head = {t: self.head[t] for t in topics}
        if above is not None and all(n <= above.get(t, n) for t, n in head.items()):
            time.sleep(wait_s)  # the long poll found nothing new
        return head

    def read(self, start, end):
        parts = [rows(t, range(start[t], end[t])) for t in end if end[t] > start[t]]
        table = pa.concat_tables(parts)
        keep = [(t, o) not in self.quarantine for t, o in zip(table["_topic"].to_pylist(), table["_offset"].to_pylist())]
        table = table.filter(pa.array(keep))

        class Read:
            pass

        read = Read()
        read.rows, read.first, read.ends = table, {t: start[t] for t in end}, dict(end)
        return read

    def close(self):
        pass


def test_follower_reads_contiguously_and_skips_quarantined_rows():
    feed = FakeFeed()
    feed.quarantine.add((P0, 2))
    store = tail_store({P0: 0}, limit_rows=100)
    follower = TailFollower("orders", TailSpec("x"), store, lambda spec, d: feed, poll_interval_s=0.005)
    follower.start()
    try:
        feed.produce(P0, 5)
        feed.produce(P1, 3)
        eventually(lambda: store.ends == {P0: 5, P1: 3})
        snap = store.snapshot({P0: 0})
        assert sorted(snap.keys["_offset"].to_pylist()) == [0, 0, 1, 1, 2, 3, 4]
        eventually(lambda: store.snapshot({}).state == "following" and store.age_ms() >= 0)
    finally:
        follower.stop()


def test_a_full_tail_says_it_is_behind_and_a_loss_is_named_never_skipped():
    from danube_core.errors import DataLossError

    feed = FakeFeed({P0: 0})
    store = tail_store({P0: 0}, limit_rows=3)
    follower = TailFollower("orders", TailSpec("x", 3), store, lambda spec, d: feed, poll_interval_s=0.005)
    follower.start()
    try:
        feed.produce(P0, 10)
        eventually(lambda: store.snapshot({}).state.startswith("behind:"))
        state = store.snapshot({}).state
        assert "limit_rows 3" in state and "7 messages on the topic not read" in state
        assert store.ends == {P0: 3}
        feed.fail = DataLossError("offsets 3..9 of /default/orders-part-0 are gone (retention)")
        eventually(lambda: store.snapshot({}).state.startswith("lost:"))
        assert store.ends == {P0: 3}  # where it was: nothing skipped
    finally:
        follower.stop()


# ---- the hand-over --------------------------------------------------------------------------

def test_pin_with_tail_counts_no_offset_twice_whichever_epoch_is_pinned():
    feed = FakeFeed({P0: 0})
    db = duckdb.connect()
    tails = WorkerTails(lambda spec, d: feed, cursor=db.cursor, poll_interval_s=0.005)
    published: dict[str, dict] = {}
    spec = TailSpec("x", 1000)
    try:
        tails.publish_with_tail("orders", "e1", spec.at({P0: 3}), lambda: published.setdefault("e1", {P0: 3}))
        feed.produce(P0, 10)
        eventually(lambda: tails.datasets()["orders"].ends == {P0: 10})
        tails.publish_with_tail("orders", "e2", spec.at({P0: 7}), lambda: published.setdefault("e2", {P0: 7}))
        for epoch, held in (("e1", 3), ("e2", 7)):
            pinned, tail = tails.pin_with_tail("orders", lambda epoch=epoch: epoch, lambda e: e)
            assert pinned == epoch
            assert tail.snapshot.keys["_offset"].to_pylist() == list(range(held, 10))
            assert answered(db, tail.snapshot) == [(P0, o) for o in range(held, 10)]
            tail.release()
        tails.unpublish_with_tail("orders", "e1", lambda: True)
        assert tails.datasets()["orders"].held[0] == 3  # trimmed to e2's offsets
        _, gone = tails.pin_with_tail("orders", lambda: "e1", lambda e: e)
        assert gone.snapshot is None and "no tail on this worker" in gone.note
        table = tails.datasets()["orders"].table.name
        tails.unpublish_with_tail("orders", "e2", lambda: True)
        assert tails.datasets() == {}
        assert tails.pin_with_tail("orders", lambda: "e2", lambda e: e) == ("e2", None)
        assert db.execute(f"SELECT count(*) FROM duckdb_tables() WHERE table_name = '{table}'").fetchall() == [(0,)]
    finally:
        tails.stop()


# ---- the wire ------------------------------------------------------------------------------

def test_wire_carries_requests_answers_rows_and_named_failures():
    pipe = io.BytesIO()
    write_request(pipe, "read", start={P0: 1}, end={P0: 3})
    pipe.seek(0)
    assert read_request(pipe) == {"op": "read", "start": {P0: 1}, "end": {P0: 3}}
    assert read_request(pipe) is None
    pipe = io.BytesIO()
    write_answer(pipe, {"read": 2}, rows(P0, range(1, 3)))
    write_failure(pipe, "DataLossError", "offsets 1..2 are gone")
    pipe.seek(0)
    value, table = read_answer(pipe)
    assert value == {"read": 2} and table["_offset"].to_pylist() == [1, 2]
    with pytest.raises(TailWireError, match="DataLossError: offsets 1..2 are gone"):
        read_answer(pipe)
    with pytest.raises(TailWireError, match="closed its output"):
        read_answer(pipe)


def test_a_latest_request_waits_for_a_message_beyond_what_the_worker_holds():
    from pipelines.tail_server import _answer

    class Feed:
        def latest(self, topics, above=None, wait_s=0.0):
            self.asked = (topics, above, wait_s)
            return {P0: 5}

    feed, out = Feed(), io.BytesIO()
    _answer({"op": "latest", "topics": [P0], "above": {P0: 5}, "wait_ms": 250}, feed, out)
    assert feed.asked == ([P0], {P0: 5}, 0.25)
    _answer({"op": "latest", "topics": [P0]}, feed, out)
    assert feed.asked == ([P0], None, 0.0)
    out.seek(0)
    assert read_answer(out)[0] == read_answer(out)[0] == {P0: 5}


# ---- the admission's refusals ----------------------------------------------------------------

def tail_request(**tail) -> mg.AdmitDatasetRequest:
    request = mg.AdmitDatasetRequest(tenant_id="acme", dataset_id="orders",
                                     source=mg.DataSourceIdentifier(delta_table=mg.DeltaTable(table_uri="/t")))
    request.tail.CopyFrom(mg.TailOptions(**{"pipeline_config": "name: orders\n", "limit_rows": 10, **tail}))
    return request


@pytest.mark.parametrize("tail, field", [
    ({"limit_rows": 0}, "tail.limit_rows=0"),
    ({"limit_bytes": -1}, "tail.limit_bytes=-1"),
    ({"pipeline_config": " "}, "tail.pipeline_config is empty"),
])
def test_admission_refuses_bad_tail_fields_by_name(tail, field):
    with pytest.raises(InvalidRequestError, match=field):
        validate_tail(tail_request(**tail))


def test_admission_refuses_a_tail_on_a_pinned_version():
    request = tail_request()
    request.source.delta_table.pin_version = True
    with pytest.raises(InvalidRequestError, match="pin_version"):
        validate_tail(request)


class Offsets:
    def __init__(self, held: TableOffsets) -> None:
        self.held = held

    def at(self, uri, version):
        return self.held


@pytest.fixture
def resolved():
    from speedlayer.api.v1 import control_plane_service_pb2 as cp

    return ResolvedTable("delta:/t", 4, cp.DataSource(delta=cp.DeltaSource(table_uri="/t", version=4)), b"")


def test_admission_refuses_a_table_no_pipeline_wrote_naming_it(resolved):
    with pytest.raises(PreconditionError, match="table_uri /t: no commit up to version 4 names topic offsets"):
        admit_tail(tail_request(), TenantConfig(), resolved, Offsets(TableOffsets()), check=lambda text: {})


def test_admission_refuses_a_topic_namespace_the_tenant_may_not_read(resolved):
    facts = {"name": "orders", "namespaces": ["billing"]}
    with pytest.raises(TenantIsolationError, match="source.topics: tenant 'acme' may not read topics of namespace"):
        admit_tail(tail_request(), TenantConfig(topic_namespaces=("default",)), resolved,
                   Offsets(TableOffsets({P0: 3}, frozenset({"orders"}))), check=lambda text: facts)


def test_admission_refuses_another_pipelines_file_and_an_unregistered_subject(resolved):
    held = Offsets(TableOffsets({P0: 3}, frozenset({"orders"})))
    with pytest.raises(InvalidRequestError, match="name 'payments' is not the pipeline that writes /t"):
        admit_tail(tail_request(), TenantConfig(), resolved, held,
                   check=lambda text: {"name": "payments", "namespaces": ["default"]})

    def unregistered(text):
        raise TailWireError("ConfigError", "tail.pipeline_config: decode.subject: schema registry subject 'orders' "
                                           "is not registered")

    with pytest.raises(InvalidRequestError, match="decode.subject: schema registry subject 'orders' is not registered"):
        admit_tail(tail_request(), TenantConfig(), resolved, held, check=unregistered)
    spec = admit_tail(tail_request(limit_bytes=5), TenantConfig(), resolved, held,
                      check=lambda text: {"name": "orders", "namespaces": ["default"]})
    assert (spec.limit_rows, spec.limit_bytes, spec.offsets) == (10, 5, {})
