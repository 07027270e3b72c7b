"""The soak's checker: reads the whole recorded history and the Delta tables after the run
and counts each anomaly class. A run passes when every class in `FAILURES` is 0.

Anomaly classes (each counted, with a few examples):

* `lost`: acknowledged message ids in neither the target nor the quarantine table, beyond
  the offsets a commit reported skipped (`lost` in its userMetadata, the loud form of loss);
* `duplicated`: extra rows of one (topic partition, offset) across both tables;
* `inconsistent_offset`: one (topic partition, offset) holding two different message ids;
* `foreign`: rows whose id no producer sent;
* `offset_gap`: offsets below a partition's highest one found in no table and not reported
  lost (the offsets a broker assigned are dense, so a hole is a message that vanished);
* `offset_nonmonotonic`: a later send stored at a lower offset of its partition than an
  earlier one (each producer waits for each answer, so its sends are ordered);
* `batch_discontiguous`: a batch whose range of a partition does not start where the
  partition's previous batch ended (a skip or a re-read between batches);
* `cursor_backward`: a subscription cursor sampled lower than before;
* `cursor_past_delta`: a cursor beyond the last offset the Delta commits held when it was read;
* `wrong_answer`: a gateway answer equal to no committed version of its table;
* `answer_ahead`: an answer that matches only versions newer than the newest READY epoch
  read right after it;
* `failed_after_heal`: a gateway query after the heal that failed, or answered other than the
  table's final version;
* `not_recovered`: a fault whose recovery probe never held;
* `down_after_heal`: a part not running at the end.

Reported, not failures: `resent` (one id at two offsets: a send the client retried after its
first attempt was stored; danube-client has no idempotent producer) and the parts' own exits
(loud errors: a pipeline that stopped on a fault says why, and the supervisor restarted it).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Iterable

from devstack.chaos.delta_read import TableRead, read_table
from devstack.chaos.platform import Stream
from devstack.chaos.recorder import History

FAILURES = ("lost", "duplicated", "inconsistent_offset", "foreign", "offset_gap", "offset_nonmonotonic",
            "batch_discontiguous", "cursor_backward",
            "cursor_past_delta", "wrong_answer", "answer_ahead", "failed_after_heal", "not_recovered",
            "down_after_heal")
EXAMPLES = 5


@dataclass
class Verdict:
    """Counts per anomaly class, examples of each, and figures."""

    counts: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    figures: dict = field(default_factory=dict)

    def add(self, anomaly: str, example: str, n: int = 1) -> None:
        self.counts[anomaly] += n
        if len(self.examples[anomaly]) < EXAMPLES:
            self.examples[anomaly].append(example)

    @property
    def passed(self) -> bool:
        return all(self.counts[a] == 0 for a in FAILURES)

    def to_json(self) -> dict:
        return {"passed": self.passed, "counts": {a: self.counts[a] for a in (*FAILURES, "resent")},
                "examples": dict(self.examples), "figures": self.figures}


def check(streams: dict[str, Stream], history: History, not_recovered: Iterable[str] = (),
          down: Iterable[str] = ()) -> Verdict:
    verdict = Verdict()
    for name, stream in sorted(streams.items()):
        target, quarantine = read_table(stream.target), read_table(stream.quarantine)
        _messages(verdict, stream, target, quarantine)
        _batches(verdict, name, target, quarantine)
        _answers(verdict, history, stream.dataset, target)
        verdict.figures[f"commits_{name}"] = target.versions
    _cursors(verdict, history)
    for what in not_recovered:
        verdict.add("not_recovered", what)
    for part in down:
        verdict.add("down_after_heal", part)
    return verdict


def _messages(verdict: Verdict, stream: Stream, target: TableRead, quarantine: TableRead) -> None:
    assert stream.producer is not None
    rows = target.rows + quarantine.rows
    by_position = Counter((r.topic, r.offset) for r in rows)
    for (topic, offset), n in sorted(by_position.items(), key=str):
        if n > 1:
            verdict.add("duplicated", f"{topic}@{offset} x{n}", n - 1)
    keys_at: dict[tuple, set[int]] = defaultdict(set)
    for r in rows:
        keys_at[(r.topic, r.offset)].add(r.key)
    for (topic, offset), keys in sorted(keys_at.items(), key=str):
        if len(keys) > 1:
            verdict.add("inconsistent_offset", f"{topic}@{offset} holds ids {sorted(keys)}")
    _send_order(verdict, rows)
    offsets_of: dict[int, set] = defaultdict(set)
    for r in rows:
        offsets_of[r.key].add((r.topic, r.offset))
    for key, positions in sorted(offsets_of.items()):
        if len(positions) > 1:
            verdict.add("resent", f"{stream.name}:{key} at {sorted(positions, key=str)}", len(positions) - 1)
    sent, acked = set(stream.producer.sent), set(stream.producer.acked)
    for key in sorted(set(offsets_of) - sent):
        verdict.add("foreign", f"{stream.name}:{key}")
    reported = sum(target.lost_reported.values()) + sum(quarantine.lost_reported.values())
    missing = sorted(acked - set(offsets_of))
    for key in missing[reported:]:
        verdict.add("lost", f"{stream.name}:{key} (acked, in no table)")
    _gaps(verdict, rows, {**quarantine.lost_reported, **target.lost_reported})
    verdict.figures[f"messages_{stream.name}"] = {"sent": len(sent), "acked": len(acked), "rows": len(rows),
                                                  "in_target": len(target.rows),
                                                  "in_quarantine": len(quarantine.rows),
                                                  "lost_reported": reported}


def _send_order(verdict: Verdict, rows: list) -> None:
    """Each producer sends one message at a time, the next only after the last was answered,
    so within a partition a higher id must sit at a higher offset (a retried send's first copy
    counts)."""
    first_offset: dict[tuple[str, int], int] = {}
    for r in rows:
        if r.topic is not None and r.offset is not None:
            position = (r.topic, r.key)
            first_offset[position] = min(r.offset, first_offset.get(position, r.offset))
    by_topic: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for (topic, message), offset in first_offset.items():
        by_topic[topic].append((message, offset))
    for topic, pairs in sorted(by_topic.items()):
        pairs.sort()
        for (k1, o1), (k2, o2) in zip(pairs, pairs[1:]):
            if o2 <= o1:
                verdict.add("offset_nonmonotonic", f"{topic}: id {k1} at {o1}, later id {k2} at {o2}")


def _gaps(verdict: Verdict, rows: list, lost_reported: dict[str, int]) -> None:
    offsets: dict[str, set[int]] = defaultdict(set)
    for r in rows:
        if r.topic is not None and r.offset is not None:
            offsets[r.topic].add(r.offset)
    for topic, present in sorted(offsets.items()):
        holes = sorted(set(range(max(present) + 1)) - present)
        for offset in holes[lost_reported.get(topic, 0):]:
            verdict.add("offset_gap", f"{topic}@{offset}")


def _batches(verdict: Verdict, name: str, target: TableRead, quarantine: TableRead) -> None:
    batches = {**quarantine.batches, **target.batches}
    previous_end: dict[str, tuple[int, int]] = {}
    for batch_id in sorted(batches):
        for topic, (start, end) in sorted(batches[batch_id].items()):
            if topic in previous_end and start != previous_end[topic][1]:
                before, last = previous_end[topic]
                verdict.add("batch_discontiguous",
                            f"{name} batch {batch_id} {topic} starts at {start}, batch {before} ended at {last}")
            previous_end[topic] = (batch_id, end)
    verdict.figures[f"batches_{name}"] = len(batches)


def _answers(verdict: Verdict, history: History, dataset: str, target: TableRead) -> None:
    versions_of: dict[tuple[int, int], list[int]] = defaultdict(list)
    for version, answer in target.answers.items():
        versions_of[answer].append(version)
    final = max(target.answers, default=-1)
    ok = failed = 0
    staleness: list[int] = []
    for a in history.answers:
        if a.dataset != dataset:
            continue
        if a.error:
            failed += 1
            if a.after_heal:
                verdict.add("failed_after_heal", f"{dataset} at {a.t0:.1f}s: {a.error}")
            continue
        ok += 1
        matched = versions_of.get((a.rows or 0, a.total or 0), [])
        if a.after_heal and final not in matched:
            verdict.add("failed_after_heal", f"{dataset} at {a.t0:.1f}s: rows={a.rows} sum={a.total}, "
                                             f"not the final version v{final}'s answer {target.answers.get(final)}")
        if not matched:
            verdict.add("wrong_answer", f"{dataset} at {a.t0:.1f}s: rows={a.rows} sum={a.total} "
                                        f"(no version has it; newest READY was v{a.ready_after})")
        elif a.ready_after >= 0 and min(matched) > a.ready_after:
            verdict.add("answer_ahead", f"{dataset} at {a.t0:.1f}s: matches v{min(matched)}, "
                                        f"newest READY v{a.ready_after}")
        elif a.ready_after >= 0:
            staleness.append(a.ready_after - max(v for v in matched if v <= a.ready_after))
    verdict.figures[f"queries_{dataset}"] = {"ok": ok, "failed": failed,
                                             "versions_behind_max": max(staleness, default=0)}


def _cursors(verdict: Verdict, history: History) -> None:
    last: dict[tuple[str, str], int] = {}
    for sample in history.cursors:
        if sample.cursor is None:
            continue
        key = (sample.stream, sample.topic)
        if key in last and sample.cursor < last[key]:
            verdict.add("cursor_backward", f"{sample.topic} at {sample.t:.1f}s: {last[key]} -> {sample.cursor}")
        last[key] = max(sample.cursor, last.get(key, sample.cursor))
        if sample.delta_end is None or sample.cursor > sample.delta_end - 1:
            verdict.add("cursor_past_delta", f"{sample.topic} at {sample.t:.1f}s: cursor {sample.cursor}, "
                                             f"Delta holds up to {None if sample.delta_end is None else sample.delta_end - 1}")
    verdict.figures["cursor_samples"] = len(history.cursors)
