"""Finding a topic's WAL files across brokers and scanning their frame headers (spec §1, §3).

The planner needs the byte position of every WAL frame past the last uploaded offset, and the
WAL head, on every micro-batch. `WalFinder` locates WAL directories: the owning broker's (from
its `/cluster/brokers/{id}/{ns}/{topic}` assignment, with `walRoot=auto` through the `wal_url`
of its `/cluster/register/{id}` record, a URL template with `{broker_id}`, or a JSON map from
broker id to WAL root URL; or one fixed URL), and other brokers' only when the owner's WAL does
not reach back far enough (a topic that moved, §6.3). Runs found there are chained back from
the head without gaps.

Real v0.7.3 brokers register no `wal_url`, so with `walRoot=auto` their WAL cannot be found:
`WalFinder.unreachable` records, per topic, the owner whose WAL could not be read and why, so
the catalog can name it (once per query) and report the unread tail instead of dropping it.

Reading whole WAL files each time would cost the WAL's size per batch, so the scan state is
kept per file (`_FileScan`) and each call reads only bytes added since; a file that shrank or
whose first header changed is scanned again. The first scan of a file starts at the uploader's
resume point (`uploader.ckpt`) when the frame found there carries the offset after the last
uploaded one; otherwise at byte 0. A file holds one or more runs of consecutive offsets
(`_GrowingRun`): a real broker restarted without seal appends offsets from 0 again behind old
frames of the same `wal.log` (§6.6), which starts a new run.
"""

from __future__ import annotations

import logging
import posixpath
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from connectors.snapshot import WalRun, chain_wal_runs
from connectors.wal_root import BROKER_ID_FIELD, WAL_AUTO, parse_wal_map
from danube_core import keys
from danube_core.checkpoints import (
    UPLOADER_CHECKPOINT_NAME, WAL_CHECKPOINT_NAME, UploaderCheckpoint, WalCheckpoint,
)
from danube_core.errors import CheckpointError
from danube_core.metadata import MetadataStore
from danube_core.objectstore import normalize_url, translate_error
from danube_core.records import BrokerRegistration, BrokerState
from danube_core.topics import TopicName

logger = logging.getLogger(__name__)

SCAN_CHUNK_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class UnreachableWal:
    """Why the owner's WAL of a topic could not be read (for the warning and query progress)."""

    broker_id: int | None
    url: str | None
    reason: str


@dataclass
class ClusterView:
    """Assignments and registrations, read once per catalog call."""

    owners: dict[str, int]  # storage path -> owning broker id
    wal_urls: dict[int, str]  # registered broker id -> its WAL root URL ("" if none)

    @classmethod
    def read(cls, metadata: MetadataStore) -> "ClusterView":
        owners = {}
        wal_urls = {}
        for key, raw in metadata.get_prefix(keys.BROKERS_PREFIX):
            parsed = keys.parse_assignment_key(key)
            if parsed is not None:
                owners[parsed[1].storage_path] = parsed[0]
            elif key.endswith("/state"):
                # The state record outlives the broker's leased registration, so a dead
                # owner's WAL stays findable until the new owner has recovered it.
                broker_id = key[len(keys.BROKERS_PREFIX):-len("/state")]
                state = BrokerState.from_json(raw, key)
                if broker_id.isdigit() and state.wal_url:
                    wal_urls[int(broker_id)] = state.wal_url
        for key, raw in metadata.get_prefix(keys.REGISTER_PREFIX):
            broker_id = key[len(keys.REGISTER_PREFIX):]
            if broker_id.isdigit():
                registered = BrokerRegistration.from_json(raw, key).wal_url
                wal_urls[int(broker_id)] = registered or wal_urls.get(int(broker_id), "")
        return cls(owners, wal_urls)


class WalFinder:
    """The WAL chain of a topic, from the WAL root option (`auto`, a URL, a template or a map)."""

    def __init__(self, wal_root: str, storage_url: str, storage_options: dict) -> None:
        self.wal_root = wal_root
        self._map = parse_wal_map(wal_root)
        self._storage_scheme = normalize_url(storage_url).split("://", 1)[0]
        self._storage_options = storage_options
        self._scanner = WalDirScanner()
        self.unreachable: dict[str, UnreachableWal] = {}  # topic -> why its owner's WAL is unread
        self.stale_runs: dict[str, list[WalRun]] = {}  # topic -> runs of the last call not chained
        self._unreadable_others: set[str] = set()  # other brokers' WAL dirs already warned about

    @property
    def per_broker(self) -> bool:
        return self.wal_root == WAL_AUTO or BROKER_ID_FIELD in self.wal_root or self._map is not None

    def options_for(self, url: str) -> dict:
        """Storage options apply to WAL URLs on the storage URL's protocol only."""
        same = normalize_url(url).split("://", 1)[0] == self._storage_scheme
        return self._storage_options if same else {}

    def chain(self, topic: TopicName, needed_from: int, cluster: ClusterView | None,
              sealed_broker: int | None) -> list[WalRun]:
        """Runs leading without a gap to the WAL head, reaching back to `needed_from` if they can.

        Also records why the owner's WAL could not be read (`unreachable`) and every scanned run
        that does not lead to the head (`stale_runs`), for the catalog's run audit.
        """
        owner, owner_dir, other_dirs = self._dirs(topic, cluster, sealed_broker)
        self.unreachable.pop(str(topic), None)
        runs, head = [], None
        if owner_dir is None:
            if owner is not None:
                self.unreachable[str(topic)] = UnreachableWal(owner, None, self._no_url_reason(owner))
        else:
            scan = self._runs(owner_dir, needed_from)
            runs, head = scan.runs, scan.head
            if not scan.exists:
                self.unreachable[str(topic)] = UnreachableWal(
                    owner, owner_dir, "its WAL directory does not exist (or holds no WAL files)")
        if head is None or head.first_offset > needed_from:
            others = [run for d in other_dirs for run in self._other_runs(d, needed_from)]
            if head is None:
                head = max((r for r in others if r.first_offset <= needed_from < r.stop_offset),
                           key=lambda r: r.stop_offset, default=None)
            runs = others + runs  # the owner's runs last: preferred when chaining
        chain = chain_wal_runs(head, runs, needed_from) if head is not None else []
        self.stale_runs[str(topic)] = _not_leading_to(chain, runs, needed_from)
        return chain

    def _other_runs(self, dir_url: str, needed_from: int) -> list[WalRun]:
        """Runs of another broker's WAL dir, best effort: it is only consulted for frames a
        previous owner may still hold, and a dead broker's WAL server may be gone for good. If
        frames were needed from it, the planner reports them missing (data loss), loudly."""
        from danube_core.errors import ObjectStoreError

        try:
            return self._runs(dir_url, needed_from).runs
        except ObjectStoreError as exc:
            if dir_url not in self._unreadable_others:
                self._unreadable_others.add(dir_url)
                logger.warning("skipping the WAL of a previous owner: %s", exc)
            return []

    def _no_url_reason(self, broker_id: int) -> str:
        if self._map is not None:
            return "walRoot maps no WAL URL for it"
        return ("it registers no wal_url (real Danube brokers never do), so walRoot=auto cannot "
                "find its WAL")

    def _runs(self, dir_url: str, needed_from: int) -> "DirScan":
        from danube_core.errors import ObjectStoreError

        try:
            return self._scanner.runs(dir_url, needed_from, self.options_for(dir_url))
        except ObjectStoreError as exc:
            raise type(exc)(f"the WAL directory {dir_url} (from option walRoot={self.wal_root!r}) "
                            f"cannot be read: {exc}. Check that the URL is reachable from the Spark "
                            "driver and executors, or set walRoot to one that is") from exc

    def _dirs(self, topic: TopicName, cluster: ClusterView | None,
              sealed_broker: int | None) -> tuple[int | None, str | None, list[str]]:
        """(owner id, the owner's WAL dir, other brokers' dirs where earlier owners may have written)."""
        path = topic.storage_path
        if not self.per_broker or cluster is None:
            return None, _join(self.wal_root, path), []
        owner = cluster.owners.get(path)
        candidates = (sealed_broker, *sorted(cluster.wal_urls), *sorted(self._map or ()))
        others = dict.fromkeys(b for b in candidates if b not in (None, owner))
        other_dirs = [self._broker_dir(b, path, cluster) for b in others]
        return owner, self._broker_dir(owner, path, cluster), [d for d in other_dirs if d]

    def _broker_dir(self, broker_id: int | None, path: str, cluster: ClusterView) -> str | None:
        if broker_id is None:
            return None
        if self._map is not None:
            root = self._map.get(broker_id)
            return _join(root, path) if root else None
        if self.wal_root == WAL_AUTO:
            root = cluster.wal_urls.get(broker_id)
            return _join(root, path) if root else None
        return _join(self.wal_root.replace(BROKER_ID_FIELD, str(broker_id)), path)


def _not_leading_to(chain: list[WalRun], runs: list[WalRun], needed_from: int) -> list[WalRun]:
    """Scanned runs not part of the chain with frames the chain could hold: at or above
    `needed_from`, or above the chain's start when the head went back below it (a restart)."""
    chained = {r.identity for r in chain}
    floor = min(needed_from, chain[0].first_offset) if chain else needed_from
    return [r for r in runs if r.stop_offset > max(r.first_offset, floor) and r.identity not in chained]


def _join(root: str, path: str) -> str:
    return normalize_url(root).rstrip("/") + "/" + path


@dataclass(frozen=True)
class DirScan:
    """What one scan of a WAL directory found. `exists`: the directory holds WAL files."""

    runs: list[WalRun]
    head: WalRun | None
    exists: bool


class WalDirScanner:
    """Incremental header scans of WAL files, kept per file URL between catalog calls."""

    def __init__(self) -> None:
        self._files: dict[str, _FileScan] = {}

    def runs(self, dir_url: str, needed_from: int, options: dict) -> DirScan:
        """Runs of the dir's files that may hold offsets >= needed_from, and the head run (the
        last run of the active file named by `wal.ckpt`, else of the newest file).

        An active file with no frame yet, after files whose frames all lie below `needed_from`
        (the uploads' end), is a broker that has just loaded the topic again at the next offset
        over its old WAL files, others having uploaded past them (the soak's defect 4): its head
        is a marker at `needed_from` in that file, not the old frames' last run, which would sit
        below the uploads and read as a restart. A restart writes frames: once the new file
        holds one, its run is the head again and is judged as any other.

        The file list comes from `wal.ckpt` and a listing, so a directory without checkpoint
        is read too; empty files (the real broker leaves many) hold no runs; the checkpoint's
        recorded first offsets are never trusted, only frame headers (spec §3.2).
        """
        from fsspec.core import url_to_fs

        from danube_core.wal_files import list_segments

        try:
            fs, path = url_to_fs(normalize_url(dir_url), **options)
            ckpt = _read_ckpt(fs, path, WAL_CHECKPOINT_NAME, WalCheckpoint)
            uploader = _read_ckpt(fs, path, UPLOADER_CHECKPOINT_NAME, UploaderCheckpoint)
            segments = list_segments(path, ckpt, fs)
        except FileNotFoundError:
            return DirScan([], None, False)
        except (OSError, ValueError) as exc:
            raise translate_error(exc, dir_url, "list WAL directory") from exc
        active = _active_segment(segments, ckpt)
        runs, head = [], None
        for i, seg in enumerate(segments):
            nxt = segments[i + 1].first_offset if i + 1 < len(segments) else None
            if seg is not active and nxt is not None and nxt <= needed_from:
                continue  # entirely uploaded
            hint: tuple[int, int] | None = None
            uploaded_to: int | None = None
            if uploader is not None and uploader.last_read_file_seq == seg.seq:
                uploaded_to = uploader.last_read_byte_position
                if uploaded_to:
                    hint = (uploaded_to, uploader.last_committed_offset + 1)
            seg_runs = self._scan(fs, seg.path, hint, uploaded_to)
            runs.extend(seg_runs)
            if seg is active and seg_runs:
                head = seg_runs[-1]
        if head is None and active is not None and runs and runs[-1].stop_offset <= needed_from:
            head = WalRun(fs.unstrip_protocol(active.path), needed_from, (0,))
        return DirScan(runs, head if head is not None else (runs[-1] if runs else None), bool(segments))

    def _scan(self, fs, path: str, hint: tuple[int, int] | None, uploaded_to: int | None) -> list[WalRun]:
        url = fs.unstrip_protocol(path)
        try:
            fs.invalidate_cache(path)
            size = fs.size(path)
            first_header = fs.cat_file(path, start=0, end=min(size, 16))
            scan = self._files.get(url)
            if scan is None or size < scan.safe_end or scan.first_header != first_header:
                start, expect = hint if hint is not None and hint[0] <= size else (0, None)
                scan = self._files[url] = _FileScan(first_header, start, expect)
            if not scan.advance(fs, path, size):  # the uploader's resume point was not a frame
                scan = self._files[url] = _FileScan(first_header, 0, None)
                scan.advance(fs, path, size)
        except FileNotFoundError:
            self._files.pop(url, None)
            return []  # deleted by retention after listing
        except OSError as exc:
            raise translate_error(exc, url, "scan WAL file") from exc
        # A run whose offsets went back at or past the byte the uploader had read to was
        # written after the last upload (`WalRun.restarted_after_upload`).
        return [WalRun(url, run.first_offset, run.view(),
                       run.went_back and uploaded_to is not None and run.first_pos >= uploaded_to)
                for run in scan.runs]


def scan_file_runs(url: str, options: dict) -> list[WalRun]:
    """Every run of consecutive offsets in one WAL file or object, by a header-only scan.

    For files no catalog state describes: an object no descriptor references, a WAL file
    named for salvage. Reading stops at a torn tail or a CRC mismatch (logged).
    """
    from fsspec.core import url_to_fs

    try:
        fs, path = url_to_fs(normalize_url(url), **options)
        scan = _FileScan(b"", 0, None)
        scan.advance(fs, path, fs.size(path))
    except OSError as exc:
        raise translate_error(exc, url, "scan frames of") from exc
    return [WalRun(url, run.first_offset, run.view()) for run in scan.runs]


class _GrowingRun:
    """Header positions of consecutive offsets; append-only, so earlier views stay valid."""

    def __init__(self, first_offset: int, positions: np.ndarray, end_pos: int, went_back: bool = False) -> None:
        self.first_offset = first_offset
        self.went_back = went_back  # its first offset is below the frame before it in the file
        self._buf = np.empty(max(64, 2 * (len(positions) + 1)), dtype=np.uint64)
        self._n = 0
        self._put(positions, end_pos)

    @property
    def stop_offset(self) -> int:
        return self.first_offset + self._n - 1

    @property
    def end_pos(self) -> int:
        return int(self._buf[self._n - 1])

    @property
    def first_pos(self) -> int:
        return int(self._buf[0])

    def _put(self, positions: np.ndarray, end_pos: int) -> None:
        need = self._n + len(positions) + 1
        if need > len(self._buf):
            grown = np.empty(2 * need, dtype=np.uint64)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown  # views handed out keep the old buffer, unchanged
        self._buf[self._n : self._n + len(positions)] = positions
        self._buf[self._n + len(positions)] = end_pos
        self._n = need

    def extend(self, positions: np.ndarray, end_pos: int) -> None:
        """Add frames starting at the old end position (which becomes a header position)."""
        self._n -= 1
        self._put(positions, end_pos)

    def view(self) -> Sequence[int]:
        # an int64 array: sized, indexable and bisectable as the planner needs
        return self._buf[: self._n]  # type: ignore[return-value]


class _FileScan:
    """How far one WAL file has been scanned, and the runs found so far."""

    def __init__(self, first_header: bytes, safe_end: int, expect: int | None) -> None:
        self.first_header = first_header
        self.safe_end = safe_end
        self.expect = expect  # offset the first frame must carry when starting at a hint
        # Starting at the uploader's resume point, the run begins there even before a frame
        # follows: it says the file's head is the last uploaded offset.
        empty = np.empty(0, dtype=np.uint64)
        self.runs: list[_GrowingRun] = [] if expect is None else [_GrowingRun(expect, empty, safe_end)]

    def advance(self, fs, path: str, size: int) -> bool:
        """Scan the bytes added since the last call; False if the start position was not a frame."""
        from danube_core.arrow_decode import scan_frame_offsets

        carry, pos = b"", self.safe_end
        while pos < size:
            data = fs.cat_file(path, start=pos, end=min(size, pos + SCAN_CHUNK_BYTES))
            if not data:
                break
            buf, base = carry + data, pos - len(carry)
            pos += len(data)
            offsets, positions, consumed, stop = scan_frame_offsets(buf, base)
            if self.expect is not None:
                if len(offsets) == 0 and stop == "crc":
                    return False
                if len(offsets):
                    if int(offsets[0]) != self.expect:
                        return False
                    self.expect = None
            self._add(offsets, positions, base + consumed)
            self.safe_end = base + consumed
            if stop == "crc":
                logger.warning("WAL file %s: CRC mismatch at byte %d; its readable part ends there",
                               path, self.safe_end)
                break
            carry = buf[consumed:]
        return True

    def _add(self, offsets: np.ndarray, positions: np.ndarray, end_pos: int) -> None:
        if len(offsets) == 0:
            return
        breaks = np.flatnonzero(np.diff(offsets) != 1) + 1
        bounds = [0, *breaks.tolist(), len(offsets)]
        for a, b in zip(bounds, bounds[1:]):
            group_end = int(positions[b]) if b < len(offsets) else end_pos
            last = self.runs[-1] if self.runs else None
            if last is not None and last.stop_offset == int(offsets[a]) and last.end_pos == int(positions[a]):
                last.extend(positions[a:b], group_end)
            else:
                went_back = last is not None and int(offsets[a]) < last.stop_offset
                self.runs.append(_GrowingRun(int(offsets[a]), positions[a:b], group_end, went_back))


def _read_ckpt(fs, dir_path: str, name: str, cls):
    path = posixpath.join(dir_path, name)
    try:
        return cls.decode(fs.cat_file(path), fs.unstrip_protocol(path))
    except FileNotFoundError:
        return None
    except CheckpointError as exc:
        logger.warning("ignoring %s: %s", path, exc)
        return None


def _active_segment(segments, ckpt: WalCheckpoint | None):
    if ckpt is not None:
        name = posixpath.basename(ckpt.file_path) or (ckpt.active_file_name or "")
        for seg in segments:
            if posixpath.basename(seg.path) == name:
                return seg
    return segments[-1] if segments else None
