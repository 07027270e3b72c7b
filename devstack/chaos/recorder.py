"""What the soak records while it runs, for the checker to judge afterwards (`History`):

* every gateway answer (or error) of a reader that queries each dataset without pause, with
  the version of the dataset's newest READY epoch in etcd just before and just after it;
* subscription cursors sampled every second, each with what the Delta tables' commits say
  they hold at that moment (read after the cursor, so a cursor past them is a real anomaly);
* when each Delta version was first seen (recovery probes wait for commits).

The producers' acks are the producers' own (`devstack.faults.kit.AckingProducer`). The recorders
read etcd directly on all three members, not through the front the platform uses, so a
slowed front does not slow the record.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devstack.chaos.platform import Stream
from devstack.chaos.speed import KEY_ROOT, TENANT

SQL = "SELECT count(*) AS row_count, coalesce(sum(n), 0) AS n_total FROM {dataset}"


@dataclass(frozen=True)
class Answer:
    """One gateway query: when (seconds into the run), the answer or the error, and the newest
    READY epoch's table version before and after (-1: none seen)."""

    dataset: str
    t0: float
    t1: float
    rows: int | None
    total: int | None
    error: str
    ready_before: int
    ready_after: int
    after_heal: bool = False
    epoch_after: str = ""  # the id of that newest READY epoch after the query


@dataclass(frozen=True)
class CursorSample:
    t: float
    stream: str
    topic: str
    cursor: int | None
    delta_end: int | None  # the largest end (exclusive) of the topic's offsets in any commit


@dataclass
class History:
    """The run's record; `t()` is seconds since the run started."""

    started: float
    answers: list[Answer] = field(default_factory=list)
    cursors: list[CursorSample] = field(default_factory=list)
    commits_seen: list[tuple[float, str, int]] = field(default_factory=list)  # (t, stream, version)
    notes: list[str] = field(default_factory=list)

    def t(self) -> float:
        return round(time.monotonic() - self.started, 2)

    def to_json(self) -> dict[str, Any]:
        return {"answers": [asdict(a) for a in self.answers], "cursors": [asdict(c) for c in self.cursors],
                "commits_seen": self.commits_seen, "notes": self.notes}


class DeltaLogTail:
    """A Delta table's log read as it grows: each new version's batch offsets (userMetadata)."""

    def __init__(self, table: Path) -> None:
        self.log = Path(table) / "_delta_log"
        self.version = -1
        self.ends: dict[str, int] = {}

    def advance(self) -> list[int]:
        """Read the versions written since the last call; their numbers."""
        if not self.log.is_dir():
            return []
        new = []
        for path in sorted(self.log.glob("*.json")):
            version = int(path.stem)
            if version <= self.version:
                continue
            try:
                lines = path.read_text().splitlines()
            except OSError:
                break
            for line in lines:
                info = json.loads(line).get("commitInfo")
                if info and info.get("userMetadata"):
                    for topic, span in batch_offsets(info["userMetadata"]).items():
                        self.ends[topic] = max(self.ends.get(topic, 0), span[1])
            self.version = version
            new.append(version)
        return new


def batch_offsets(user_metadata: str) -> dict[str, tuple[int, int]]:
    """A pipeline commit's `offsets`: topic partition -> (start, end exclusive); {} if none."""
    try:
        value = json.loads(user_metadata)
    except ValueError:
        return {}
    offsets = value.get("offsets") if isinstance(value, dict) else None
    return {t: (int(s["start"]), int(s["end"])) for t, s in (offsets or {}).items()}


class Recorder:
    """The gateway readers and the cursor sampler, threads stopped by `stop()`."""

    def __init__(self, history: History, streams: dict[str, Stream], gateway: str, etcd: str) -> None:
        from danube_core.metadata_etcd import EtcdMetadataStore

        self.history, self.streams, self.gateway = history, streams, gateway
        self.store = EtcdMetadataStore(etcd)
        self.after_heal = False
        self._stop = threading.Event()
        self._tails = {name: [DeltaLogTail(s.target), DeltaLogTail(s.quarantine)] for name, s in streams.items()}
        self._threads = [threading.Thread(target=self._read, args=(s.dataset,), name=f"soak-reader-{s.dataset}",
                                          daemon=True) for s in streams.values()]
        self._threads.append(threading.Thread(target=self._sample, name="soak-sampler", daemon=True))

    def start(self) -> "Recorder":
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
        self.store.close()

    def ready_version(self, dataset: str) -> int:
        """The table version of the dataset's newest epoch with a READY replica (-1: none)."""
        return self.newest_ready(dataset)[0]

    def newest_ready(self, dataset: str) -> tuple[int, str]:
        """(table version, epoch id) of the dataset's newest epoch with a READY replica ((-1, "")
        if none or etcd did not answer)."""
        from speedlayer.keys import SpeedLayerKeys
        from speedlayer.records import R_READY, AssignmentRecord

        prefix = SpeedLayerKeys(KEY_ROOT).dataset_assignments_prefix(TENANT, dataset)
        try:
            entries = self.store.get_prefix(prefix)
        except Exception:
            return -1, ""
        best: tuple[int, str] = (-1, "")
        for key, raw in entries:
            record = AssignmentRecord.from_json(raw, key)
            if record.shard_of:
                continue
            ready = (record.ready_shards == len(record.shards) if record.sharded
                     else any(r.state == R_READY for r in record.replicas.values()))
            if ready and (record.version, record.epoch) > best:
                best = (record.version, record.epoch)
        return best

    def query_once(self, client: Any, dataset: str) -> Answer:
        before, t0 = self.ready_version(dataset), self.history.t()
        rows = total = None
        error = ""
        try:
            table = client.query(dataset, SQL.format(dataset=dataset), timeout_ms=15_000)
            row = table.to_pylist()[0]
            rows, total = int(row["row_count"]), int(row["n_total"])
        except Exception as exc:
            error = f"{type(exc).__name__}: {str(exc)[:200]}"
        t1 = self.history.t()
        after, epoch = self.newest_ready(dataset)
        return Answer(dataset, t0, t1, rows, total, error, before, after, self.after_heal, epoch)

    def _read(self, dataset: str) -> None:
        from speedlayer.clients import QueryClient

        client = None
        while not self._stop.is_set():
            try:
                if client is None:
                    client = QueryClient(self.gateway, TENANT, client_id=f"soak-{dataset}", timeout_ms=15_000)
                answer = self.query_once(client, dataset)
            except Exception as exc:  # the client itself could not be made: an error answer
                t = self.history.t()
                answer = Answer(dataset, t, t, None, None, f"{type(exc).__name__}: {str(exc)[:200]}", -1, -1,
                                self.after_heal)
            self.history.answers.append(answer)
            if answer.error and client is not None:
                client.close()
                client = None
            self._stop.wait(0.25)

    def _sample(self) -> None:
        from danube_core.keys import cursor_key
        from danube_core.records import parse_cursor

        while not self._stop.wait(1.0):
            for name, stream in self.streams.items():
                t = self.history.t()
                cursors: dict[str, int | None] = {}
                for topic in stream.topic_partitions:
                    key = cursor_key(topic, stream.subscription)
                    try:
                        raw = self.store.get(key)
                    except Exception:
                        continue  # etcd unreachable from here too: no sample
                    cursors[topic] = None if raw is None else parse_cursor(raw, key)
                target, quarantine = self._tails[name]
                for version in target.advance():
                    self.history.commits_seen.append((t, name, version))
                quarantine.advance()
                ends = dict(target.ends)
                for topic, end in quarantine.ends.items():
                    ends[topic] = max(ends.get(topic, 0), end)
                for topic, cursor in cursors.items():
                    self.history.cursors.append(CursorSample(t, name, topic, cursor, ends.get(topic)))
