"""A topic's offset generations ("runs"): which stored messages the current run owns.

The real Danube v0.7.3 broker reuses offsets: a broker restarted without a seal, or the new
owner of a topic whose move raced its seal, starts again at offset 0 (spec §6.6; the `moved`
golden scenario). Its uploads then overwrite descriptor keys (`objects/00000000000000000000`),
the old objects stay in storage with no descriptor, older descriptors above the new run's
head stay behind, a sealed state may name offsets the new run never held, and one WAL file
may hold the old run and the new one back to back. Read naively, such a topic mixes two
runs' messages in one offset space, or drops one run without a word.

`audit_runs` sorts every stored source of a topic (descriptors, objects in storage, WAL runs)
into the current run and stale ones, from evidence the broker leaves behind:

* `cur` names the newest upload. Descriptors are chained back from it (each ends just below
  the next one's start, and was uploaded no later); a descriptor above `cur` belongs to the
  current run only if it continues the chain and is not older than `cur` (an upload whose
  `cur` update is in flight). Every other descriptor is stale.
* A WAL head below the uploaded offsets means the run restarted and has not uploaded yet:
  the WAL chain is the current run, and descriptors reaching into it are stale. So does a WAL
  chain whose first run went back in its file after the uploader's last position
  (`WalRun.restarted_after_upload`), even once the new run's head has passed the uploads.
* Objects in storage that no descriptor references, not a newer upload in flight, are orphans
  of an older run (`topic_audit` has already left out those repeating the current run's frames).
* WAL runs that do not lead to the WAL head are an older run's frames.
* A sealed state whose offsets a later upload restarted below is stale (the move race).

Offsets that a stale source and the current run both hold are *reused*: the stale messages
there cannot be read in the topic's offset space, which is data loss. The planner reports
them through `connectors.data_loss`; the stale sources stay readable for salvage
(`includeSource` + the `salvage` option, and `connectors.topic_inspector runs`).

Offsets: `first_offset`/`last_offset` inclusive (as descriptors); ranges end-exclusive.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from connectors.snapshot import WalRun
from danube_core.objectstore import parse_object_id
from danube_core.records import ObjectDescriptor, SealedState

OBJECT = "object"
WAL_FILE = "wal"
SEALED_STATE = "sealed-state"


@dataclass(frozen=True)
class RunSource:
    """One place that holds messages of a run: an object, a WAL file's run, a sealed state.

    `name` is what users see and pass to the `salvage` option: the object id, or the WAL
    file's URL with `#<byte position>` of the run's first frame. `referenced`: a descriptor points at it (objects only). `created_at`: the
    object's upload time (seconds, from its descriptor or its name), when known.
    """

    kind: str
    name: str
    url: str
    first_offset: int
    last_offset: int
    referenced: bool = False
    created_at: int | None = None
    note: str = ""

    @property
    def stop_offset(self) -> int:
        return self.last_offset + 1

    def describe(self) -> str:
        if self.kind == SEALED_STATE:
            return self.note
        what = "object" if self.kind == OBJECT else "WAL file"
        note = f" ({self.note})" if self.note else ""
        return f"{what} {self.name} offsets {self.first_offset}..{self.last_offset}{note}"


@dataclass(frozen=True)
class ReusedRange:
    """Offsets `[start, stop)` held by the current run and by the stale `sources` too."""

    start: int
    stop: int
    sources: tuple[RunSource, ...]

    def describe(self) -> str:
        names = ",".join(s.name for s in self.sources if s.url)
        salvage = (f". Read them with the batch option salvage={names!r} (`python -m connectors "
                   "runs` lists every run)" if names else "")
        return (f"offsets {self.start}..{self.stop - 1} were reused by a newer run of the topic "
                f"(a broker restarted it, or a move raced its seal, spec §6.6); the older run's "
                f"messages there are in: {'; '.join(s.describe() for s in self.sources)}{salvage}")


COMPACT_KEEP = 64  # newest descriptors a clean run's audit keeps (`RunAudit.compact`)


@dataclass
class RunAudit:
    """The current run of one topic and every stale source found beside it."""

    topic: str
    current_descriptors: list[ObjectDescriptor]
    stale_descriptors: list[ObjectDescriptor]
    stale_sources: list[RunSource] = field(default_factory=list)
    stale_seal: SealedState | None = None
    current_first: int | None = None  # first offset the current run holds, if known
    current_stop: int | None = None  # end-exclusive head of the current run, if known
    held: list[tuple[int, int]] = field(default_factory=list)  # [start, stop) the run's sources hold
    wal_restart: tuple[str, int] | None = None  # identity of the WAL run it restarted at (`restart_in_wal`)

    @property
    def clean(self) -> bool:
        return not self.stale_sources

    def stale_ids(self) -> set[str]:
        """Object ids of every stale descriptor, to filter range reads."""
        return {d.object_id for d in self.stale_descriptors}

    def continues(self, newest: ObjectDescriptor) -> bool:
        """Whether `newest` (the descriptor `cur` names now) is this audit's run, moved on.

        Asked every trigger: the cheap answers come first, and the run is searched newest
        first (`cur` names its last upload or a new one), so a long history costs nothing."""
        if self.current_descriptors:
            if newest.start_offset > self.current_descriptors[-1].end_offset:
                return True
            return any(d.object_id == newest.object_id for d in reversed(self.current_descriptors))
        return self.current_first is None or newest.start_offset >= self.current_first

    def advance(self, newer: Sequence[ObjectDescriptor]) -> None:
        """Take uploads made since the audit (by start offset) into the current run, so the
        next range read starts after them; ones that do not move forward are left out."""
        for d in newer:
            last = self.current_descriptors[-1] if self.current_descriptors else None
            if last is None or (d.start_offset > last.end_offset and d.created_at >= last.created_at):
                self.current_descriptors.append(d)
                self.held.append((d.start_offset, d.end_offset + 1))
                self.current_stop = max(self.current_stop or 0, d.end_offset + 1)

    def compact(self) -> None:
        """Keep, of a clean run, only its newest descriptors and the ranges it holds merged: a
        stream audits a long history once when it starts, and must not hold the whole list for
        its life. (A clean run's `reused` is empty and `continues` asks about the newest; an
        unclean one keeps everything, as its reads are planned from it.)"""
        if not self.clean:
            return
        del self.current_descriptors[:-COMPACT_KEEP]
        merged: list[tuple[int, int]] = []
        for start, stop in sorted(self.held):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
            else:
                merged.append((start, stop))
        self.held = merged

    def summary(self) -> str:
        """One line for logs: the current run and what is stale beside it."""
        run = (f"current run holds offsets {self.current_first}..{self.current_stop - 1}"
               if self.current_first is not None and self.current_stop else "current run is empty")
        reused = self.reused(0, self.current_stop or 0)
        count = sum(r.stop - r.start for r in reused)
        return (f"{run}; {count} offsets reused; older runs' messages are in: "
                f"{'; '.join(s.describe() for s in self.stale_sources)}")

    def reused(self, start: int, stop: int) -> list[ReusedRange]:
        """Reused offsets inside `[start, stop)`: held by the current run and a stale source.

        (Offsets the current run does not hold are gaps, which the planner reports as such.)
        A clean run reuses nothing: answered at once, as every trigger of a stream asks, and
        `held` grows with the run's history.
        """
        if not self.stale_sources:
            return []
        bounds = {c for a, b in self.held for c in (a, b)}
        bounds |= {c for s in self.stale_sources for c in (s.first_offset, s.stop_offset)}
        cuts = sorted({start, stop, *(c for c in bounds if start < c < stop)})
        out: list[ReusedRange] = []
        for a, b in zip(cuts, cuts[1:]):
            holders = tuple(s for s in self.stale_sources if s.first_offset <= a and b <= s.stop_offset)
            if not holders or not any(lo <= a and b <= hi for lo, hi in self.held):
                continue
            if out and out[-1].stop == a and out[-1].sources == holders:
                out[-1] = ReusedRange(out[-1].start, b, holders)
            else:
                out.append(ReusedRange(a, b, holders))
        return out


def current_chain(
    descriptors: Sequence[ObjectDescriptor], cur_start: int | None
) -> tuple[list[ObjectDescriptor], list[ObjectDescriptor]]:
    """(the current run's descriptors, the stale ones), both by start offset.

    `descriptors` are all of a topic's descriptors by start offset; `cur_start` is the start
    key `cur` names (None without `cur`: then the highest key stands in for it).
    """
    if not descriptors:
        return [], []
    by_start = {d.start_offset: d for d in descriptors}
    head = by_start.get(cur_start) if cur_start is not None else None
    if head is None:
        head = descriptors[-1]
    chain = [head]
    # The predecessor ends below the chain's start (just below, or with a gap the planner
    # reports) and was uploaded no later; anything overlapping the chain is another run's.
    # Both bounds only shrink as the chain grows, so one pass down the ends finds them all.
    for d in sorted(descriptors, key=lambda d: (d.end_offset, d.created_at), reverse=True):
        if d.end_offset < chain[-1].start_offset and d.created_at <= chain[-1].created_at:
            chain.append(d)
    chain.reverse()
    nxt = by_start.get(chain[-1].end_offset + 1)
    while nxt is not None and nxt.created_at >= chain[-1].created_at and nxt.start_offset > chain[-1].end_offset:
        chain.append(nxt)  # uploaded, `cur` not moved yet
        nxt = by_start.get(nxt.end_offset + 1)
    members = {id(d) for d in chain}
    return chain, [d for d in descriptors if id(d) not in members]


def restart_in_wal(wal_chain: Sequence[WalRun], uploaded_stop: int | None) -> WalRun | None:
    """The WAL run at which the topic restarted below its uploads and has not uploaded since
    (the chain's first run), else None: the WAL head is below the uploaded offsets, or the
    chain's first run went back after the last upload and holds offsets the uploads hold."""
    if not wal_chain or uploaded_stop is None:
        return None
    first = wal_chain[0]
    if wal_chain[-1].stop_offset < uploaded_stop:
        return first
    return first if first.restarted_after_upload and first.first_offset < uploaded_stop else None


def audit_runs(
    topic: str,
    descriptors: Sequence[ObjectDescriptor],
    cur_start: int | None,
    objects_url: str,
    listed_objects: Sequence[tuple[str, int, int | None]],
    wal_chain: Sequence[WalRun],
    other_wal_runs: Sequence[WalRun],
    sealed: SealedState | None,
) -> RunAudit:
    """Sort a topic's stored sources into its current run and stale ones (module docstring).

    `listed_objects`: (object id, first offset, last offset or None if unknown) of every
    object found in storage. `wal_chain`: the WAL runs leading to the head, oldest first;
    `other_wal_runs`: every other WAL run found.
    """
    current, stale = current_chain(descriptors, cur_start)
    uploaded_stop = current[-1].end_offset + 1 if current else None
    wal_stop = wal_chain[-1].stop_offset if wal_chain else None
    restart_run = restart_in_wal(wal_chain, uploaded_stop)
    restarted = restart_run is not None
    if restart_run is not None:
        restart = restart_run.first_offset
        stale += [d for d in current if d.end_offset >= restart]
        current = [d for d in current if d.end_offset < restart]
    first = current[0].start_offset if current else (wal_chain[0].first_offset if wal_chain else None)
    stops = [s for s in (current[-1].end_offset + 1 if current else None, wal_stop) if s is not None]
    held = [(d.start_offset, d.end_offset + 1) for d in current]
    held += [(r.first_offset, r.stop_offset) for r in wal_chain if r.stop_offset > r.first_offset]
    audit = RunAudit(topic, current, sorted(stale, key=lambda d: d.start_offset),
                     current_first=first, current_stop=max(stops) if stops else None, held=held,
                     wal_restart=restart_run.identity if restart_run is not None else None)
    referenced = {d.object_id for d in descriptors}
    for d in audit.stale_descriptors:
        audit.stale_sources.append(RunSource(OBJECT, d.object_id, objects_url + d.object_id, d.start_offset,
                                             d.end_offset, True, d.created_at, "stale descriptor"))
    unreferenced = [(object_id, start, last) for object_id, start, last in listed_objects
                    if object_id not in referenced]
    _add_stale_sources(audit, objects_url, unreferenced, uploaded_stop, bool(descriptors), wal_chain,
                       other_wal_runs, sealed, restarted)
    return audit


class ContiguousRun:
    """A topic's descriptors folded by start offset, page by page, while they form one clean
    run: each starts just after the one before ends and was uploaded no earlier.

    Such a run is its own current chain whatever `cur` names (`current_chain` keeps every one
    of them), so the audit needs only its first offset, its end, its newest descriptors and
    the listed objects it does not reference: a stream from `earliest` audits a long history
    holding a page, not the list. Anything else (a gap, an overlap, an older upload above a
    newer one) ends the fold with `clean` False, and the caller audits the whole list.
    """

    def __init__(self, listed_ids: Sequence[str]) -> None:
        self.first: int | None = None
        self.stop: int | None = None  # end-exclusive
        self.newest: deque[ObjectDescriptor] = deque(maxlen=COMPACT_KEEP)
        self.clean = True
        # Listed objects by start offset, dropped as the descriptors reach them.
        self._listed = deque(sorted(((_object_start(i), i) for i in listed_ids)))
        self._unreferenced: list[tuple[int, str]] = []

    def take(self, descriptors: Sequence[ObjectDescriptor]) -> bool:
        """Fold the next descriptors (by start offset); False once the run is not clean."""
        for d in descriptors:
            last = self.newest[-1] if self.newest else None
            if last is not None and (d.start_offset != last.end_offset + 1 or d.created_at < last.created_at):
                self.clean = False
                return False
            if self.first is None:
                self.first = d.start_offset
            self.newest.append(d)
            self.stop = d.end_offset + 1
            while self._listed and self._listed[0][0] <= d.start_offset:
                start, object_id = self._listed.popleft()
                if not (start == d.start_offset and object_id == d.object_id):
                    self._unreferenced.append((start, object_id))
        return True

    def unreferenced(self) -> list[tuple[str, int]]:
        """(object id, start offset) of every listed object no folded descriptor references."""
        return [(i, s) for s, i in self._unreferenced] + [(i, s) for s, i in self._listed]


def audit_contiguous_run(
    topic: str,
    run: ContiguousRun,
    objects_url: str,
    unreferenced: Sequence[tuple[str, int, int | None]],
    wal_chain: Sequence[WalRun],
    other_wal_runs: Sequence[WalRun],
    sealed: SealedState | None,
) -> RunAudit:
    """`audit_runs` for a clean fold of descriptors whose WAL did not restart below them:
    the same audit, from the fold's ends and newest descriptors (already compact)."""
    assert run.clean and run.first is not None and run.stop is not None
    wal_stop = wal_chain[-1].stop_offset if wal_chain else None
    held = [(run.first, run.stop)]
    held += [(r.first_offset, r.stop_offset) for r in wal_chain if r.stop_offset > r.first_offset]
    audit = RunAudit(topic, list(run.newest), [], current_first=run.first,
                     current_stop=max(run.stop, wal_stop or 0), held=held)
    _add_stale_sources(audit, objects_url, unreferenced, run.stop, True, wal_chain, other_wal_runs, sealed,
                       restarted=False)
    return audit


def _add_stale_sources(audit: RunAudit, objects_url: str, unreferenced: Sequence[tuple[str, int, int | None]],
                       uploaded_stop: int | None, described: bool, wal_chain: Sequence[WalRun],
                       other_wal_runs: Sequence[WalRun], sealed: SealedState | None, restarted: bool) -> None:
    """The stale sources beside the current run's descriptors: objects no descriptor references
    (but uploads in flight), WAL runs that do not lead to the head, a seal restarted below."""
    current = audit.current_descriptors
    newest = max((d.created_at for d in current), default=None)
    first = audit.current_first
    for object_id, start, last in unreferenced:
        created = _object_secs(object_id)
        in_flight = uploaded_stop is not None and start >= uploaded_stop and (newest is None or created >= newest)
        if in_flight or (not described and (first is None or start >= first)):
            continue  # a first upload whose descriptor is not written yet
        audit.stale_sources.append(RunSource(OBJECT, object_id, objects_url + object_id, start,
                                             start if last is None else last, False, created,
                                             "no descriptor references it"))
    chained = {r.identity for r in wal_chain}
    for run in other_wal_runs:
        if run.identity not in chained and run.stop_offset > run.first_offset:
            audit.stale_sources.append(RunSource(WAL_FILE, wal_run_name(run.url, int(run.positions[0])), run.url,
                                                 run.first_offset, run.stop_offset - 1,
                                                 note="does not lead to the WAL head"))
    audit.stale_seal = _stale_seal(sealed, current, audit.current_stop, restarted)
    if audit.stale_seal is not None:
        s = audit.stale_seal
        audit.stale_sources.append(RunSource(
            SEALED_STATE, f"sealed state of broker {s.broker_id}", "", 0, s.last_committed_offset,
            note=f"sealed at {s.last_committed_offset} by broker {s.broker_id} at {s.timestamp}, "
                 "before the current run restarted below it"))


def wal_run_name(url: str, byte_pos: int) -> str:
    """How users name one run of a WAL file (`salvage`, provenance): `<file URL>#<byte>`.
    A file may hold two runs with the same offsets (a restart appends to `wal.log`)."""
    return f"{url}#{byte_pos}"


def _stale_seal(sealed: SealedState | None, current: Sequence[ObjectDescriptor],
                current_stop: int | None, restarted: bool) -> SealedState | None:
    """A seal the current run restarted below: the next owner never continued from it.

    Evidence: an upload made after the seal starts at or below its offset, or the WAL head
    went back below the uploads (a restart not uploaded yet) and below the seal.
    """
    if sealed is None or not sealed.sealed:
        return None
    if current_stop is not None and current_stop > sealed.last_committed_offset:
        return None  # the current run went past it: it continued, or reuse is reported anyway
    later = [d for d in current if d.created_at > sealed.timestamp and d.start_offset <= sealed.last_committed_offset]
    return sealed if later or restarted else None


def _object_secs(object_id: str) -> int:
    return parse_object_id(object_id)[1]


def _object_start(object_id: str) -> int:
    return parse_object_id(object_id)[0]
