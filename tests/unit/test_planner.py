"""Table-driven tests of the pure planner (as Spark's KafkaOffsetRangeCalculatorSuite).

Snapshots are built by hand: objects of fixed-size frames with a 1-in-`every` offset index,
WAL runs with every frame position known.
"""

from __future__ import annotations

import pytest

from connectors.planner import cap_end_offsets, pack_tasks, plan_tasks
from connectors.snapshot import StoredObject, TopicSnapshot, WalRun, chain_wal_runs
from danube_core.errors import DataLossError

T = "/ns/t"
U = "/ns/u"
FRAME = 100


def obj(start: int, end: int, every: int = 1000, created_at: int = 1) -> StoredObject:
    n = end - start + 1
    index = [(start + i, i * FRAME) for i in range(0, n, every)]
    return StoredObject.build(f"data-{start}-{created_at}.dnb1", f"s3://b/data-{start}", start, end,
                              n * FRAME, created_at, index)


def wal(first: int, n: int, url: str = "file:///w/wal.log", base: int = 0) -> WalRun:
    return WalRun(url, first, tuple(base + i * FRAME for i in range(n + 1)))


def snap(objects=(), runs=(), latest=None, topic=T) -> TopicSnapshot:
    objects, runs = list(objects), list(runs)
    if latest is None:
        latest = max([o.end_offset + 1 for o in objects] + [r.stop_offset for r in runs] + [0])
    return TopicSnapshot(topic, objects, runs, latest, {"key": "obj"}, {"key": "wal"})


def plan(s: TopicSnapshot, start: int, end: int, max_bytes: int = 10**9, fail: bool = True):
    return plan_tasks({s.topic: s}, {s.topic: start}, {s.topic: end},
                      max_partition_bytes=max_bytes, fail_on_data_loss=fail)


def shape(tasks):
    return [(t.source, t.byte_start, t.byte_end, t.start_offset, t.end_offset) for t in tasks]


O0 = obj(0, 2499)  # index at 0, 1000, 2000; 250000 bytes


@pytest.mark.parametrize("name, snapshot, start, end, max_bytes, expected", [
    ("whole object is one task", snap([O0]), 0, 2500, 10**9,
     [("data-0-1.dnb1", 0, None, 0, 2500)]),
    ("split at index entries", snap([O0]), 0, 2500, 100_000,
     [("data-0-1.dnb1", 0, 100_000, 0, 1000), ("data-0-1.dnb1", 100_000, 200_000, 1000, 2000),
      ("data-0-1.dnb1", 200_000, None, 2000, 2500)]),
    ("two blocks fit in one task", snap([O0]), 0, 2500, 200_000,
     [("data-0-1.dnb1", 0, 200_000, 0, 2000), ("data-0-1.dnb1", 200_000, None, 2000, 2500)]),
    ("a block larger than the limit stays whole", snap([O0]), 0, 2500, 10,
     [("data-0-1.dnb1", 0, 100_000, 0, 1000), ("data-0-1.dnb1", 100_000, 200_000, 1000, 2000),
      ("data-0-1.dnb1", 200_000, None, 2000, 2500)]),
    ("start inside a block reads from its entry", snap([O0]), 1500, 2500, 10**9,
     [("data-0-1.dnb1", 100_000, None, 1500, 2500)]),
    ("end inside a block stops at the next entry", snap([O0]), 0, 1500, 10**9,
     [("data-0-1.dnb1", 0, 200_000, 0, 1500)]),
    ("end on an entry is exact", snap([O0]), 0, 1000, 10**9,
     [("data-0-1.dnb1", 0, 100_000, 0, 1000)]),
    ("objects then the WAL", snap([obj(0, 99)], [wal(100, 50, base=10_000)]), 0, 150, 10**9,
     [("data-0-1.dnb1", 0, None, 0, 100), ("wal", 10_000, 15_000, 100, 150)]),
    ("WAL cut at frames", snap([], [wal(0, 10)]), 2, 9, 250,
     [("wal", 200, 400, 2, 4), ("wal", 400, 600, 4, 6), ("wal", 600, 800, 6, 8), ("wal", 800, 900, 8, 9)]),
    ("WAL run overlapping the last object", snap([obj(0, 99)], [wal(50, 100, base=5_000)]), 0, 150, 10**9,
     [("data-0-1.dnb1", 0, None, 0, 100), ("wal", 10_000, 15_000, 100, 150)]),
    ("WAL fills a gap between objects", snap([obj(0, 99), obj(150, 199)], [wal(100, 100)]), 0, 200, 10**9,
     [("data-0-1.dnb1", 0, None, 0, 100), ("wal", 0, 5_000, 100, 150), ("data-150-1.dnb1", 0, None, 150, 200)]),
    ("nothing to read", snap([O0]), 700, 700, 10**9, []),
    ("only descriptors overlapping the range", snap([obj(0, 99), obj(100, 199), obj(200, 299)]), 120, 210, 10**9,
     [("data-100-1.dnb1", 0, None, 120, 200), ("data-200-1.dnb1", 0, None, 200, 210)]),
])
def test_plan_tasks(name, snapshot, start, end, max_bytes, expected):
    result = plan(snapshot, start, end, max_bytes)
    assert shape(result.tasks) == expected, name
    assert result.lost == []


def test_tasks_carry_storage_options_strictness_and_policy():
    result = plan(snap([obj(0, 9)], [wal(10, 5)]), 0, 15, fail=False)
    o, w = result.tasks
    assert (o.storage_options, o.strict, o.url, o.topic) == ({"key": "obj"}, True, "s3://b/data-0", T)
    assert (w.storage_options, w.strict, w.url) == ({"key": "wal"}, False, "file:///w/wal.log")
    assert not o.fail_on_data_loss and not w.fail_on_data_loss
    assert all(type(v) is int for t in result.tasks for v in (t.byte_start, t.start_offset, t.end_offset))


@pytest.mark.parametrize("name, snapshot, start, end, lost, tasks", [
    ("gap in the descriptor chain", snap([obj(0, 99), obj(150, 199)]), 0, 200,
     [(100, 150, "gap in the descriptor chain")],
     [("data-0-1.dnb1", 0, None, 0, 100), ("data-150-1.dnb1", 0, None, 150, 200)]),
    ("descriptor 0 overwritten after a restart at 0",
     snap([obj(0, 49, created_at=9), obj(30, 99, created_at=1)]), 0, 100,
     [(30, 50, "offsets went backwards")],
     [("data-0-9.dnb1", 0, None, 0, 50), ("data-30-1.dnb1", 0, None, 50, 100)]),
    ("WAL pruned before upload", snap([obj(0, 99)], [wal(121, 10)]), 0, 131,
     [(100, 121, "the WAL starts only at 121")],
     [("data-0-1.dnb1", 0, None, 0, 100), ("wal", 0, 1_000, 121, 131)]),
    ("sealed offsets never uploaded, no WAL", snap([obj(0, 99)], latest=121), 0, 121,
     [(100, 121, "no WAL holding it")],
     [("data-0-1.dnb1", 0, None, 0, 100)]),
    ("end beyond the WAL head", snap([], [wal(0, 10)]), 0, 15,
     [(10, 15, "beyond the newest readable offset")], [("wal", 0, 1_000, 0, 10)]),
    ("offsets went backwards (end below start)", snap([obj(0, 49)]), 200, 50,
     [(50, 200, "offsets went backwards")], []),
])
def test_data_loss_is_reported_and_skipped(name, snapshot, start, end, lost, tasks):
    result = plan(snapshot, start, end, fail=False)
    got = [(r.start_offset, r.end_offset) for r in result.lost]
    assert got == [(a, b) for a, b, _ in lost], name
    for record, (_, _, reason) in zip(result.lost, lost):
        assert reason in record.reason and record.topic == T
    assert shape(result.tasks) == tasks
    assert result.lost_offsets == {T: sum(b - a for a, b, _ in lost)}


def test_data_loss_fails_the_plan_naming_topic_range_and_object():
    with pytest.raises(DataLossError) as err:
        plan(snap([obj(0, 99), obj(150, 199)]), 0, 200)
    assert T in str(err.value) and "[100, 150)" in str(err.value) and "data-150-1.dnb1" in str(err.value)


def test_overlap_outside_the_batch_is_not_reported():
    result = plan(snap([obj(0, 49, created_at=9), obj(30, 99)]), 60, 100)
    assert result.lost == [] and shape(result.tasks) == [("data-30-1.dnb1", 0, None, 60, 100)]


def test_missing_inputs_are_programming_errors():
    with pytest.raises(ValueError, match="no start offset"):
        plan_tasks({}, {}, {T: 5}, max_partition_bytes=1, fail_on_data_loss=True)
    with pytest.raises(ValueError, match="no snapshot"):
        plan_tasks({}, {T: 0}, {T: 5}, max_partition_bytes=1, fail_on_data_loss=True)
    with pytest.raises(ValueError, match="max_partition_bytes"):
        plan(snap([O0]), 0, 1, max_bytes=0)


def test_index_is_cleaned_and_closed_by_a_sentinel():
    o = StoredObject.build("data-5-1.dnb1", "u", 5, 3004, 300_000, 1,
                           [(5, 0), (1005, 100_000), (900, 50_000), (2005, 400_000), (9999, 1)])
    assert o.index_offsets == (5, 1005, 3005) and o.index_positions == (0, 100_000, 300_000)
    assert StoredObject.build("data-5-1.dnb1", "u", 5, 9, 500, 1, None).index_offsets == (5, 10)


# ---- admission control --------------------------------------------------------------------

def caps(snaps, start, latest=None, **limits):
    snaps = {s.topic: s for s in snaps}
    latest = latest or {t: s.latest_offset for t, s in snaps.items()}
    limits.setdefault("max_messages", None)
    limits.setdefault("max_bytes", None)
    return cap_end_offsets(start, latest, snaps, **limits)


W100 = snap([], [wal(0, 100)])
W300 = snap([], [wal(0, 300, url="file:///w/u.log")], topic=U)


@pytest.mark.parametrize("name, start, latest, max_messages, expected", [
    ("no limit", {T: 0, U: 0}, {T: 100, U: 300}, None, {T: 100, U: 300}),
    ("under the limit", {T: 0, U: 0}, {T: 100, U: 300}, 1000, {T: 100, U: 300}),
    ("prorated by backlog", {T: 0, U: 0}, {T: 100, U: 300}, 40, {T: 10, U: 30}),
    ("remainders to the largest fractions", {T: 0, U: 0}, {T: 100, U: 200}, 10, {T: 3, U: 7}),
    ("small topics are not starved", {T: 0, U: 0}, {T: 1, U: 1000}, 10, {T: 1, U: 9}),
    ("fewer units than topics", {T: 0, U: 0, "/ns/v": 0}, {T: 5, U: 9, "/ns/v": 7}, 2,
     {T: 0, U: 1, "/ns/v": 1}),
    ("offsets went backwards: left for plan_tasks", {T: 500, U: 0}, {T: 100, U: 300}, 30, {T: 100, U: 30}),
])
def test_max_messages(name, start, latest, max_messages, expected):
    assert caps([W100, W300], start, latest, max_messages=max_messages) == expected, name


def test_max_messages_never_exceeds_the_limit():
    latest = {f"/ns/t{i}": 7 * i + 1 for i in range(13)}
    start = {t: 0 for t in latest}
    for limit in range(1, 120):
        end = cap_end_offsets(start, latest, {}, max_messages=limit, max_bytes=None)
        assert sum(end.values()) == min(limit, sum(latest.values()))
        assert all(0 <= end[t] <= latest[t] for t in latest)


def test_max_bytes_on_wal_frames_is_exact():
    assert caps([W100], {T: 10}, max_bytes=250) == {T: 12}
    assert caps([W100], {T: 10}, max_bytes=300) == {T: 13}


def test_max_bytes_prorated_by_byte_backlog():
    assert caps([W100, W300], {T: 0, U: 0}, max_bytes=4000) == {T: 10, U: 30}


def test_max_bytes_rounds_down_to_index_entries_without_frame_headers():
    assert caps([snap([O0])], {T: 0}, max_bytes=150_000) == {T: 1000}


def test_max_bytes_is_exact_inside_objects_with_frame_headers():
    reads = []

    def frame_index(o: StoredObject, lo: int, hi: int):
        reads.append((lo, hi))
        return [(o.start_offset + p // FRAME, p) for p in range(lo, hi, FRAME)]

    assert caps([snap([O0])], {T: 1500}, max_bytes=75_000, frame_index=frame_index) == {T: 2250}
    assert reads == [(100_000, 200_000), (200_000, 250_000)]


def test_a_message_larger_than_max_bytes_is_admitted_alone():
    assert caps([W100], {T: 10}, max_bytes=50) == {T: 11}
    assert caps([snap([O0])], {T: 0}, max_bytes=50) == {T: 1}


def test_max_bytes_passes_over_lost_offsets():
    lossy = snap([obj(0, 9), obj(20, 29)])  # offsets 10..19 lost: they cost no bytes
    assert caps([lossy], {T: 0}, max_bytes=1_000) == {T: 20}
    assert caps([lossy], {T: 0}, max_bytes=2_000) == {T: 30}


def test_both_limits_apply():
    assert caps([W100, W300], {T: 0, U: 0}, max_messages=40, max_bytes=2_000) == {T: 5, U: 15}


# ---- WAL chains ---------------------------------------------------------------------------

def test_chain_follows_the_head_generation_after_a_restart_at_0():
    old = wal(0, 1000, "file:///w/wal.log")
    newer = wal(0, 51, "file:///w/wal.log", base=100_000)
    rotated = wal(1000, 1000, "file:///w/wal.1.log")
    chain = chain_wal_runs(newer, [old, newer, rotated], 0)
    assert [(r.url, r.first_offset, r.stop_offset) for r in chain] == [("file:///w/wal.log", 0, 51)]


def test_chain_reaches_back_into_a_previous_owner_and_trims_overlap():
    previous = wal(0, 130, "file:///a/wal.log")
    owner = wal(121, 10, "file:///b/wal.log")
    chain = chain_wal_runs(owner, [previous, owner], 100)
    assert [(r.url, r.first_offset, r.stop_offset) for r in chain] == [
        ("file:///a/wal.log", 0, 121), ("file:///b/wal.log", 121, 131)]
    assert list(chain[0].positions[-2:]) == [120 * FRAME, 121 * FRAME]


def test_chain_stops_at_a_hole():
    chain = chain_wal_runs(wal(121, 10), [wal(0, 100), wal(121, 10)], 100)
    assert [(r.first_offset, r.stop_offset) for r in chain] == [(121, 131)]


# ---- packing tasks into partitions ----------------------------------------------------------


def test_small_objects_are_packed_up_to_max_partition_bytes_in_offset_order():
    objects = [obj(i * 10, i * 10 + 9) for i in range(100)]  # 100 objects of 10 frames
    tasks = plan(snap(objects), 0, 1000).tasks
    per_task = tasks[0].size_hint
    assert len(tasks) == 100 and all(t.size_hint == per_task for t in tasks)
    groups = pack_tasks(tasks, max_partition_bytes=10 * (per_task + 100), open_cost=100)
    assert [len(g) for g in groups] == [10] * 10
    assert [t for g in groups for t in g] == tasks  # offset order kept, nothing lost or repeated


def test_a_task_larger_than_the_limit_is_a_partition_of_its_own():
    tasks = plan(snap([obj(0, 9), obj(10, 19), obj(20, 29)]), 0, 30).tasks
    assert pack_tasks(tasks, max_partition_bytes=1) == [[t] for t in tasks]
    assert pack_tasks([], max_partition_bytes=1) == []
