"""WAL → cloud uploader: runs of CRC-checked WAL frames become `.dnb1` objects (spec §4.4).

A cycle reads the WAL segments from the resume point in `uploader.ckpt`, streams the
CRC-checked safe prefix into **one** object `data-<first offset>-<secs>.dnb1` in bounded
chunks, builds the sparse offset index (§4.5), then: closes the object → puts the descriptor →
puts `cur` → writes `uploader.ckpt`. Deliberate differences from v0.7.3, formats unchanged:

* The resume point is the end of the last **whole** frame uploaded, never past a frame that
  was half-written when read (the broker skips such a frame: §4.4 step 6, §9.7).
* `max_object_bytes` is checked frame by frame, not only between files (§4.4 step 7), and an
  object never spans an offset gap, so a descriptor never claims offsets its object lacks.
* Descriptor keys are created, never overwritten (`put_if_absent`): the broker's unsealed
  restart at offset 0 overwrites history (§6.6); here that raises MetadataError.
* etcd is the authority on what is uploaded. At start-up and after a failed commit the
  uploader reconciles `uploader.ckpt` with the last descriptor: after a crash past the
  descriptor put it resumes after that descriptor; an object left by a crash before it is
  re-uploaded under a new id and deleted best-effort. Frames at or below the committed offset
  are never uploaded again, so no offset is in two descriptors.

The source is normally the topic's own `Wal`. When a broker died before uploading, the next
owner points an uploader at the dead broker's directory as a `ReadOnlyWal` (any fsspec
filesystem): the same cycles upload its tail, with no `uploader.ckpt` read or written there.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from itertools import chain
from typing import Callable, Iterator

import fsspec

from danube_core.checkpoints import UPLOADER_CHECKPOINT_NAME, UploaderCheckpoint, read_checkpoint, write_checkpoint
from danube_core.errors import CorruptFrameError, DanubeError, DataLossError, MetadataError
from danube_core.frames import FRAME_HEADER, FRAME_HEADER_SIZE, STOP_CRC, FrameRef, scan_frames
from danube_core.keys import StorageKeys
from danube_core.metadata import MetadataStore
from danube_core.objectstore import ObjectStore, object_id_for, parse_object_id
from danube_core.records import CurPointer, ObjectDescriptor
from danube_core.topics import TopicName
from danube_core.wal_files import DEFAULT_FILE_NAME, WalSegment, list_segments, scan_segment

from broker.tiered_reader import pending_frame_bytes
from danube_core.descriptor_catalog import DescriptorCatalog
from broker.periodic import PeriodicTask
from broker.wal import Wal

logger = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024
INDEX_EVERY_FRAMES = 1000  # the 1st, 1001st, 2001st, ... frame of an object is indexed (§4.5)


def uploader_checkpoint_path(wal: Wal) -> str:
    """`<wal dir>/uploader.ckpt`: the uploader's progress lives next to the WAL files (§3.1)."""
    return os.path.join(wal.directory, UPLOADER_CHECKPOINT_NAME)


class ReadOnlyWal:
    """A WAL directory another, dead, broker wrote, as an uploader's source (see the module
    docstring). It no longer grows, so it is scanned once, in `open`."""

    def __init__(self, directory: str, fs: fsspec.AbstractFileSystem, segments: list[WalSegment]) -> None:
        self.directory = directory
        self.fs = fs
        self._segments = segments

    @classmethod
    def open(
        cls, directory: str, fs: fsspec.AbstractFileSystem, file_name: str = DEFAULT_FILE_NAME
    ) -> "ReadOnlyWal":
        """Scan every WAL file's frame headers (CRC-checked); OSError if they cannot be read."""
        scans = [scan_segment(seg, fs) for seg in list_segments(directory, None, fs, file_name=file_name)]
        found = [scan.segment for scan in scans if scan.segment.last_offset is not None]
        return cls(directory, fs, sorted(found, key=lambda seg: (seg.first_offset, seg.seq)))

    @property
    def last_offset(self) -> int | None:
        """Largest offset of a whole frame in any file: the dead broker may have acked it."""
        return max((seg.last_offset for seg in self._segments if seg.last_offset is not None), default=None)

    def segments(self) -> list[WalSegment]:
        return list(self._segments)

    def flush(self) -> int | None:
        """Nothing to flush: the last offset on disk, which `Uploader.drain` must reach."""
        return self.last_offset


@dataclass
class _Progress:
    """What is uploaded (`committed`, inclusive; None: nothing) and where reading resumes."""

    committed: int | None
    seq: int
    pos: int
    last_object_id: str | None


@dataclass
class _Piece:
    """Whole frames, contiguous in WAL file `seq`, ending at file byte `resume_pos`."""

    data: memoryview
    first_offset: int
    seq: int
    resume_pos: int


class _CycleScan:
    """The frames one cycle uploads, read file by file in bounded chunks, and the object's
    offsets, size and sparse index (§4.5: the 1st, 1001st, ... frame, byte_pos from the
    object's start).

    Stops at the first partial frame of the newest file (the writer is still appending), at a
    CRC mismatch (`corrupt` is set), at an offset gap, or when the next frame would push the
    object past `max_bytes` (an object always takes at least one frame).
    """

    def __init__(
        self, topic: TopicName, progress: _Progress, chunk_bytes: int, max_bytes: int | None,
        fs: fsspec.AbstractFileSystem | None = None,
    ) -> None:
        self._topic = topic
        self._fs = fs
        self._progress = progress
        self._chunk_bytes = chunk_bytes
        self._max_bytes = max_bytes
        self.start_offset: int | None = None
        self.end_offset: int | None = None
        self.size = 0
        self.frames = 0
        self.index: list[tuple[int, int]] = []
        self.last_piece: _Piece | None = None
        self.stopped = False
        self.capped = False
        self.corrupt: CorruptFrameError | None = None

    def pieces(self, segments: list[WalSegment]) -> Iterator[_Piece]:
        for i, seg in enumerate(segments):
            if seg.seq < self._progress.seq:
                continue
            start = self._progress.pos if seg.seq == self._progress.seq else 0
            yield from self._file_pieces(seg, start, is_newest=i == len(segments) - 1)
            if self.stopped:
                return

    def _file_pieces(self, seg: WalSegment, start: int, is_newest: bool) -> Iterator[_Piece]:
        try:
            fh = open(seg.path, "rb") if self._fs is None else self._fs.open(seg.path, "rb")
        except FileNotFoundError:
            return  # retention deleted it between listing and opening: it was uploaded
        with fh:
            fh.seek(start)
            carry, carry_pos = b"", start
            while not self.stopped:
                data = fh.read(max(self._chunk_bytes, pending_frame_bytes(carry) - len(carry)))
                if not data:
                    break
                buf = carry + data
                scan = scan_frames(buf)
                piece = self._take(scan.frames, buf, seg.seq, carry_pos)
                if piece is not None:
                    yield piece
                if scan.stop_reason == STOP_CRC and not self.stopped:
                    assert scan.stop_pos is not None  # a scan that stopped says where
                    offset = FRAME_HEADER.unpack_from(buf, scan.stop_pos)[0]
                    self.corrupt = CorruptFrameError(seg.path, offset, carry_pos + scan.stop_pos,
                                                     "CRC mismatch")
                    logger.error("uploader for %s stops: %s; it stays on disk", self._topic, self.corrupt)
                    self.stopped = True
                carry, carry_pos = buf[scan.safe_end :], carry_pos + scan.safe_end
        if carry and not is_newest and not self.stopped:
            logger.warning(
                "WAL file %s ends in a torn frame at byte %d (%d bytes); it is not uploaded",
                seg.path, carry_pos, len(carry),
            )

    def _take(self, frames: list[FrameRef], buf: bytes, seq: int, buf_pos: int) -> _Piece | None:
        committed = self._progress.committed
        chosen: list[FrameRef] = []
        for ref in frames:
            if self.end_offset is None:
                if committed is not None and ref.offset <= committed:
                    continue  # uploaded already (or an older history): never referenced twice
                if committed is not None and ref.offset > committed + 1:
                    logger.warning(
                        "topic %s: offsets %d..%d are neither uploaded nor in the WAL; the next object "
                        "starts at %d", self._topic, committed + 1, ref.offset - 1, ref.offset,
                    )
            elif ref.offset != self.end_offset + 1:
                self.stopped = True  # an object never spans a gap; the next cycle starts a new one
                break
            length = ref.end_pos - ref.frame_pos
            if self._max_bytes is not None and self.size and self.size + length > self._max_bytes:
                self.stopped = self.capped = True
                break
            self._add(ref.offset, length)
            chosen.append(ref)
        if not chosen:
            return None
        first = chosen[0].frame_pos
        self.last_piece = _Piece(memoryview(buf)[first : chosen[-1].end_pos], chosen[0].offset, seq,
                                 buf_pos + chosen[-1].end_pos)
        return self.last_piece

    def _add(self, offset: int, length: int) -> None:
        if self.frames % INDEX_EVERY_FRAMES == 0:
            self.index.append((offset, self.size))
        if self.start_offset is None:
            self.start_offset = offset
        self.end_offset = offset
        self.frames += 1
        self.size += length


# How old (by its id's Unix seconds) an object no descriptor names must be before an uploader
# deletes it: an upload's descriptor follows it within seconds (an etcd request timeout and its
# retries), so an object younger than this may be one a new owner is about to describe.
ORPHAN_GRACE_S = 60.0


class Uploader:
    """Uploads one topic's WAL to the object store and records it in etcd (single writer).

    `clock` gives Unix seconds (object ids, `created_at`, `updated_at`); `durable` fsyncs
    `uploader.ckpt` (none for a `ReadOnlyWal`). `owns` says whether this broker is still the
    topic's owner (None: always, for a dead owner's WAL recovered by the new one); objects it
    finds undescribed are deleted only then, and only once `orphan_grace_s` older than their id
    (`_delete_orphans`). Thread-safe: cycles are serialised.
    """

    def __init__(
        self,
        topic: TopicName | str,
        wal: Wal | ReadOnlyWal,
        store: ObjectStore,
        metadata: MetadataStore,
        keys: StorageKeys,
        *,
        interval_s: float = 30,
        max_object_bytes: int | None = None,
        clock: Callable[[], float] = time.time,
        durable: bool = True,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        owns: Callable[[], bool] | None = None,
        orphan_grace_s: float = ORPHAN_GRACE_S,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"uploader interval_s={interval_s!r} must be > 0")
        if max_object_bytes is not None and max_object_bytes <= 0:
            raise ValueError(f"uploader max_object_bytes={max_object_bytes!r}: expected None (no cap) or > 0")
        if chunk_bytes < FRAME_HEADER_SIZE:
            raise ValueError(f"uploader chunk_bytes={chunk_bytes!r} must be >= {FRAME_HEADER_SIZE}")
        self._topic = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        self._wal = wal
        self._store = store
        self._metadata = metadata
        self._keys = keys
        self._catalog = DescriptorCatalog(metadata, keys, self._topic)
        self._interval_s = interval_s
        self._max_object_bytes = max_object_bytes
        self._clock = clock
        self._durable = durable
        self._chunk_bytes = chunk_bytes
        self._owns = owns
        self._orphan_grace_s = orphan_grace_s
        self._fs = wal.fs if isinstance(wal, ReadOnlyWal) else None
        self._ckpt_path = None if isinstance(wal, ReadOnlyWal) else uploader_checkpoint_path(wal)
        self._lock = threading.Lock()
        self._progress: _Progress | None = None  # None: reconcile before the next cycle
        self._taken_ids: set[str] = set()  # ids of objects that may exist without a descriptor
        self._kept_ids: set[str] = set()   # undescribed objects found, too young to delete
        self._corrupt: CorruptFrameError | None = None
        self._capped = False
        self._task = PeriodicTask(f"uploader-{self._topic}", self._logged_cycles)

    @property
    def last_committed_offset(self) -> int | None:
        """End offset (inclusive) of the last object recorded in etcd; None if none yet."""
        progress = self._progress
        return None if progress is None else progress.committed

    # ---- one cycle ----------------------------------------------------------------------

    def run_cycle(self) -> ObjectDescriptor | None:
        """Upload what the WAL holds beyond the committed offset; the descriptor, or None."""
        with self._lock:
            progress = self._progress if self._progress is not None else self._reconcile()
            scan = _CycleScan(self._topic, progress, self._chunk_bytes, self._max_object_bytes,
                              self._fs)
            pieces = scan.pieces(self._wal.segments())
            first = next(pieces, None)
            self._corrupt, self._capped = scan.corrupt, False
            if first is None:
                return None
            object_id = self._new_object_id(first.first_offset)
            with self._store.open_writer(self._topic, object_id) as writer:
                for piece in chain([first], pieces):
                    writer.write(piece.data)
            self._corrupt, self._capped = scan.corrupt, scan.capped
            # `first` came from the scan: it added at least one frame and kept its piece.
            assert scan.start_offset is not None and scan.end_offset is not None
            assert scan.last_piece is not None
            descriptor = ObjectDescriptor(
                object_id=object_id, start_offset=scan.start_offset, end_offset=scan.end_offset,
                size=writer.size, etag=writer.etag, created_at=int(self._clock()), completed=True,
                offset_index=scan.index,
            )
            try:
                self._commit(descriptor, scan.last_piece)
            except BaseException:
                self._taken_ids.add(object_id)
                self._progress = None  # etcd decides what landed, at the next cycle
                raise
            logger.info("uploaded %s: offsets %d..%d, %d bytes", writer.url, descriptor.start_offset,
                        descriptor.end_offset, descriptor.size)
            return descriptor

    def _new_object_id(self, start_offset: int) -> str:
        """A fresh id: never the name of an object left behind by a failed commit or kept undescribed."""
        secs = int(self._clock())
        while object_id_for(start_offset, secs) in self._taken_ids | self._kept_ids:
            secs += 1
        return object_id_for(start_offset, secs)

    def _commit(self, descriptor: ObjectDescriptor, last_piece: _Piece) -> None:
        """Descriptor (create-only) → cur → uploader.ckpt, the order of §4.4 step 8."""
        key = self._keys.object_key(self._topic, descriptor.start_offset)
        if not self._metadata.put_if_absent(key, descriptor.to_json()):
            raw = self._metadata.get(key)
            existing = None if raw is None else ObjectDescriptor.from_json(raw, key)
            if existing is None or existing.object_id != descriptor.object_id:
                self._delete_quietly(descriptor.object_id)
                raise MetadataError(
                    f"etcd key {key!r} already records object "
                    f"{existing.object_id if existing else '(deleted meanwhile)'}; refusing to "
                    f"overwrite it with {descriptor.object_id} (offsets {descriptor.start_offset}.."
                    f"{descriptor.end_offset}, now deleted): offsets must never be reused (spec §6.6)"
                )
        self._put_cur(descriptor.start_offset)
        progress = _Progress(descriptor.end_offset, last_piece.seq, last_piece.resume_pos,
                             descriptor.object_id)
        self._write_checkpoint(progress)
        self._progress = progress

    def _put_cur(self, start_offset: int) -> None:
        try:
            self._metadata.put(self._keys.cur_key(self._topic),
                               CurPointer.for_offset(start_offset).to_json())
        except DanubeError as exc:  # as in the broker: cur is a hint, readers tolerate a stale one
            logger.warning("could not point %s at %d: %s", self._keys.cur_key(self._topic), start_offset, exc)

    def _write_checkpoint(self, progress: _Progress) -> None:
        if self._ckpt_path is None:
            return
        committed = progress.committed if progress.committed is not None else 0
        ckpt = UploaderCheckpoint(committed, progress.seq, progress.pos, progress.last_object_id,
                                  int(self._clock()))
        write_checkpoint(self._ckpt_path, ckpt.encode(), fsync=self._durable)

    # ---- crash recovery -----------------------------------------------------------------

    def _reconcile(self) -> _Progress:
        """Align `uploader.ckpt` with etcd, and delete objects no descriptor can reference;
        returns the progress it also keeps as `_progress`."""
        ckpt = (read_checkpoint(self._ckpt_path, UploaderCheckpoint) if self._ckpt_path else None
                ) or UploaderCheckpoint()
        # Without an object id the checkpoint records no upload (the retention reads it so too).
        local = ckpt.last_committed_offset if ckpt.last_object_id else None
        progress = _Progress(local, ckpt.last_read_file_seq, ckpt.last_read_byte_position,
                             ckpt.last_object_id)
        last = self._catalog.last()
        remote = last.end_offset if last is not None else None
        if remote != local:
            behind = local is not None and (remote is None or remote < local)
            if local is not None:  # a crash after the descriptor put, or etcd lost descriptors
                logger.warning("%s records offsets up to %d uploaded, etcd up to %s: %s",
                               self._ckpt_path, local, remote,
                               "re-reading the local WAL" if behind else "resuming after etcd's")
            if behind:
                progress.seq = progress.pos = 0
            progress.committed = remote
            progress.last_object_id = last.object_id if last is not None else None
            if last is not None:
                self._put_cur(last.start_offset)
                self._write_checkpoint(progress)
        self._delete_orphans(local, remote)
        self._progress = progress
        return progress

    def _delete_orphans(self, local: int | None, remote: int | None) -> None:
        """Delete objects this uploader left without a descriptor (crash or failed commit).

        Only objects starting past both the local checkpoint and the last descriptor qualify,
        and the bucket is listed only if this host has uploaded for the topic before: objects
        of another history (or seen through a wrongly configured root prefix) are never
        touched. Without a local checkpoint only ids from failed commits of this process are.
        """
        known = [x for x in (local, remote) if x is not None]
        names = (self._store.list_objects(self._topic) if local is not None
                 else sorted(self._taken_ids))
        if names:
            # The descriptors again, read after the listing: an object another broker uploaded
            # and described since `remote` was read (a restarted broker loading a topic the
            # leader has just given another, with the listing slowed by storage) is named by
            # now and kept. Found by the soak: such a broker deleted four described objects.
            fresh = self._catalog.last()
            if fresh is not None:
                known.append(fresh.end_offset)
        floor = max(known) if known else None
        parsed = [(object_id, *parse_object_id(object_id)) for object_id in names]
        undescribed = [(object_id, secs) for object_id, start, secs in parsed if floor is None or start > floor]
        if not undescribed:
            return
        # Only the topic's owner deletes: a broker restarted with a stale view of its topics
        # (the soak's defect 5) may load one the leader has just given another broker, whose
        # uploads it would otherwise take for its own leftovers.
        if self._owns is not None and not self._owns():
            logger.warning("%s: %d object(s) no descriptor names (%s...) left in place: this broker "
                           "no longer owns the topic", self._topic, len(undescribed), undescribed[0][0])
            return
        now = self._clock()
        for object_id, secs in undescribed:
            if now - secs < self._orphan_grace_s and object_id not in self._taken_ids:
                # Uploaded moments ago, maybe by another broker about to describe it; if it stays
                # undescribed, a reader finds its frames repeated in the described objects
                # (danube_core.repeated_upload), so keeping it loses and duplicates nothing.
                logger.warning("object %s of %s: no descriptor names it yet; kept (uploaded %.0f s ago, "
                               "under the %.0f s grace)", object_id, self._topic, now - secs, self._orphan_grace_s)
                self._kept_ids.add(object_id)
                continue
            logger.warning("deleting object %s of %s: no descriptor names it", object_id, self._topic)
            self._taken_ids.add(object_id)
            self._delete_quietly(object_id)

    def _delete_quietly(self, object_id: str) -> None:
        try:
            self._store.delete(self._store.object_path(self._topic, object_id))
        except DanubeError as exc:  # best effort: an unreferenced object is garbage, not data
            logger.warning("could not delete unreferenced object %s of %s: %s",
                           object_id, self._topic, exc)

    # ---- draining and the background thread ---------------------------------------------

    def drain(self) -> None:
        """Flush the WAL and upload until everything it holds is in objects.

        Raises CorruptFrameError if a corrupt frame blocks the upload, DataLossError if
        flushed offsets cannot be found in the WAL files.
        """
        target = self._wal.flush()
        while self.run_cycle() is not None:
            pass
        committed = self.last_committed_offset
        if target is None or (committed is not None and committed >= target):
            return
        if self._corrupt is not None:
            raise self._corrupt
        raise DataLossError(
            f"topic {self._topic}: offsets {0 if committed is None else committed + 1}..{target} were "
            f"flushed but are not in the WAL files of {self._wal.directory}; they cannot be uploaded"
        )

    def start(self) -> None:
        """Run a cycle now, in the caller's thread, then one every `interval_s` on a daemon thread.

        The first cycle reconciles `uploader.ckpt` with etcd and uploads what the WAL holds;
        run before the topic is served (`ReliableTopicStorage.load`), it is done before any new
        message arrives, so what is published next waits for the next cycle (on its own thread,
        the first cycle raced the first publishes: a test keeping messages in the WAL found
        them uploaded under load). A failed cycle is logged, as on the thread, and the load
        goes on."""
        self._logged_cycles()
        self._task.start(self._interval_s, first_now=False)

    def stop(self) -> None:
        """Stop the thread after its current cycle (no drain: see `drain`)."""
        self._task.stop()

    def _logged_cycles(self) -> None:
        try:
            # A capped object leaves more to upload: go on without waiting for the timer.
            while self.run_cycle() is not None and self._capped and not self._task.stopping:
                pass
        except DanubeError as exc:
            log = logger.warning if exc.retriable else logger.error
            log("upload cycle for %s failed: %s", self._topic, exc)
        except Exception:  # keep the thread alive; the next cycle reconciles and retries
            logger.exception("upload cycle for %s failed", self._topic)
