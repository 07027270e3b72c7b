"""The soak's checker (`devstack/chaos/checker.py`) on small Delta tables written here (parquet
files and a JSON log, no Spark) and a made-up history: a clean run passes, and each anomaly
class is caught by itself."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq

from devstack.chaos.checker import FAILURES, check
from devstack.chaos.platform import Stream
from devstack.chaos.recorder import Answer, CursorSample, History

TOPIC = "/default/t"


def write_table(path: Path, versions: list[list[tuple[int, int]]], batches: list[dict] | None = None) -> None:
    """Each version adds one file of (n, offset) rows; `batches[i]` is version i's userMetadata."""
    log = path / "_delta_log"
    log.mkdir(parents=True)
    for version, rows in enumerate(versions):
        name = f"part-{version}.parquet"
        pq.write_table(pa.table({"n": [n for n, _ in rows], "_topic": [TOPIC] * len(rows),
                                 "_offset": [o for _, o in rows]}), path / name)
        meta = (batches or [])[version] if batches and version < len(batches) else {
            "pipeline": "p", "batch_id": version,
            "offsets": {TOPIC: {"start": min((o for _, o in rows), default=0),
                                "end": max((o for _, o in rows), default=-1) + 1}}}
        actions = [{"add": {"path": name, "size": 1, "dataChange": True}},
                   {"commitInfo": {"userMetadata": json.dumps(meta)}}]
        (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions))


def stream(tmp_path: Path, sent: list[int], acked: list[int]) -> Stream:
    config = tmp_path / "pipeline" / "p.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    return Stream("a", TOPIC, 0, config, "sub", producer=SimpleNamespace(sent=sent, acked=acked))  # type: ignore[arg-type]


def history(answers=(), cursors=()) -> History:
    return History(0.0, answers=list(answers), cursors=list(cursors))


def answer(rows: int, total: int, ready: int, *, error: str = "", after_heal: bool = False) -> Answer:
    return Answer("soak_a", 1.0, 1.1, None if error else rows, None if error else total, error, ready, ready,
                  after_heal)


def failures(verdict) -> dict:
    return {a: verdict.counts[a] for a in FAILURES if verdict.counts[a]}


def clean(tmp_path: Path) -> Stream:
    s = stream(tmp_path, list(range(6)), list(range(6)))
    write_table(s.target, [[(0, 0), (1, 1), (2, 2)], [(3, 3), (4, 4), (5, 5)]])
    return s


def test_a_clean_run_passes(tmp_path):
    s = clean(tmp_path)
    verdict = check({"a": s}, history([answer(3, 3, 0), answer(6, 15, 1), answer(6, 15, 1, after_heal=True)],
                                      [CursorSample(1.0, "a", TOPIC, 2, 3), CursorSample(2.0, "a", TOPIC, 5, 6)]))
    assert failures(verdict) == {}, verdict.examples
    assert verdict.passed


def test_a_row_written_twice_is_duplicated(tmp_path):
    s = stream(tmp_path, list(range(4)), list(range(4)))
    write_table(s.target, [[(0, 0), (1, 1)], [(2, 2), (3, 3)], [(3, 3)]],
                batches=[None, None, {"batch_id": 1, "offsets": {TOPIC: {"start": 2, "end": 4}}}])
    assert failures(check({"a": s}, history())) == {"duplicated": 1}


def test_an_acked_message_missing_is_lost_and_leaves_an_offset_gap(tmp_path):
    s = stream(tmp_path, list(range(4)), list(range(4)))
    write_table(s.target, [[(0, 0), (2, 2), (3, 3)]], batches=[{"batch_id": 0, "offsets": {TOPIC: {"start": 0,
                                                                                                "end": 4}}}])
    verdict = check({"a": s}, history())
    assert failures(verdict) == {"lost": 1, "offset_gap": 1}
    assert verdict.examples["lost"] == ["a:1 (acked, in no table)"]


def test_a_send_retried_at_another_offset_is_reported_not_failed(tmp_path):
    s = stream(tmp_path, [0, 1], [0, 1])
    write_table(s.target, [[(0, 0), (1, 1), (1, 2)]])
    verdict = check({"a": s}, history())
    assert failures(verdict) == {} and verdict.counts["resent"] == 1


def test_a_skipped_range_between_batches_is_discontiguous(tmp_path):
    s = stream(tmp_path, list(range(6)), list(range(6)))
    write_table(s.target, [[(0, 0), (1, 1)], [(2, 2), (3, 3)]],
                batches=[{"batch_id": 0, "offsets": {TOPIC: {"start": 0, "end": 2}}},
                         {"batch_id": 1, "offsets": {TOPIC: {"start": 3, "end": 4}}}])
    assert failures(check({"a": s}, history()))["batch_discontiguous"] == 1


def test_answers_equal_to_no_version_or_from_the_future_or_failing_after_the_heal(tmp_path):
    s = clean(tmp_path)
    verdict = check({"a": s}, history([answer(5, 99, 1), answer(6, 15, 0), answer(0, 0, 1, error="Boom: x",
                                                                                  after_heal=True),
                                       answer(3, 3, 1, after_heal=True)]))
    assert failures(verdict) == {"wrong_answer": 1, "answer_ahead": 1, "failed_after_heal": 2}


def test_cursors_moving_back_or_past_what_delta_holds(tmp_path):
    s = clean(tmp_path)
    samples = [CursorSample(1.0, "a", TOPIC, 4, 6), CursorSample(2.0, "a", TOPIC, 3, 6),
               CursorSample(3.0, "a", TOPIC, 6, 6), CursorSample(4.0, "a", TOPIC, 0, None)]
    assert failures(check({"a": s}, history(cursors=samples))) == {"cursor_backward": 2, "cursor_past_delta": 2}


def test_faults_not_recovered_and_parts_left_down_fail_the_run(tmp_path):
    verdict = check({"a": clean(tmp_path)}, history(), not_recovered=["broker_kill b0"], down=["w1"])
    assert failures(verdict) == {"not_recovered": 1, "down_after_heal": 1}


def test_two_ids_at_one_offset_are_inconsistent(tmp_path):
    s = stream(tmp_path, [0, 1, 2], [0, 1, 2])
    write_table(s.target, [[(0, 0), (1, 1)], [(2, 1)]],
                batches=[None, {"batch_id": 1, "offsets": {TOPIC: {"start": 2, "end": 2}}}])
    assert failures(check({"a": s}, history())) == {"duplicated": 1, "inconsistent_offset": 1,
                                                     "offset_nonmonotonic": 1}


def test_a_later_send_at_a_lower_offset_is_nonmonotonic(tmp_path):
    s = stream(tmp_path, [0, 1, 2], [0, 1, 2])
    write_table(s.target, [[(0, 0), (2, 1), (1, 2)]])
    verdict = check({"a": s}, history())
    assert failures(verdict) == {"offset_nonmonotonic": 1}
    assert verdict.examples["offset_nonmonotonic"] == [f"{TOPIC}: id 1 at 2, later id 2 at 1"]
