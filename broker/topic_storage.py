"""The storage lifecycle of one reliable topic on one broker: load, append, read, unload, delete.

This is seed 003 ("reliable topic moves") done right. Differences from v0.7.3 (spec §6.2–6.7):

* **Unload** refuses new appends, flushes the WAL and *waits*, drains the uploader until every
  offset is in objects, and only then writes the sealed state; so its `last_committed_offset`
  (the last offset handed out, inclusive, §6.4) is also the last offset uploaded. Like the
  broker (§6.2 step 3) it deletes nothing locally: the WAL files, `wal.ckpt` and
  `uploader.ckpt` stay on disk, closed and readable, for a v0.7.3 broker that takes the topic
  over in a shared WAL directory (it appends there and reads the files its `wal.ckpt` lists),
  for tools, and for this broker if the topic comes back (it continues after them, and the
  uploader resumes from the kept `uploader.ckpt`). Retention cleans them up on a later load.
* **Load** starts the WAL after the sealed offset and seeds `uploader.ckpt`; without a sealed
  state (the previous owner crashed) it continues after the last descriptor's end and after
  any local WAL, never at 0 (the broker restarts at 0 and overwrites history, §6.6).
* **Failover**: the leader names a dead owner in an unsealed state (`leader.record_failover`).
  Its producers were told offsets past the last descriptor are stored, and they are only in
  its WAL; so before opening its own WAL the new owner reads that WAL (through the `wal_url`
  the dead broker left in its broker state), uploads the frames beyond the descriptors with the
  ordinary uploader, and continues after the largest offset found there. An object the dead
  broker uploaded without writing its descriptor, now a byte-for-byte copy of the recovered
  frames, is deleted (`broker.repeated_uploads`). If that WAL cannot be read, an error names
  the broker, the URL and the offsets at risk, and the topic continues after the descriptors
  (readers then report the gap as data loss).
* **Empty topics**: the sealed offset is "last offset handed out". A topic that never handed
  one out (WAL head still 0) writes **no** marker, so the next owner starts at 0 like a new
  topic; the broker would write 0 and make the next owner skip offset 0. A topic that started
  at `s > 0` and got nothing new writes `s - 1`, carrying the previous owner's value on.
* **Delete** erases the storage keys and cursors (§6.7) and the local WAL; uploading what is
  about to lose its descriptors would be wasted, so it does not drain first. Cloud objects are
  kept, as in the broker.

Limitation: the sealed marker is deleted at load. If the new owner then crashes before any
upload, the next owner recovers from descriptors; a marker written by a real v0.7.3 broker
can count offsets that were never uploaded (§6.4), and those would then be handed out again.
Markers written here never do, since unload uploads everything first.
"""

from __future__ import annotations

import logging
import os
import posixpath
import threading
import time
from typing import Any, Callable, Iterator

from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from danube_core.checkpoints import (
    UPLOADER_CHECKPOINT_NAME,
    WAL_CHECKPOINT_NAME,
    UploaderCheckpoint,
    temp_path_for,
    write_checkpoint,
)
from danube_core.errors import CorruptFrameError, DanubeError, DataLossError
from danube_core.keys import StorageKeys, assignment_key, parse_subscription_key, subscriptions_prefix
from danube_core.message import StreamMessage
from danube_core.metadata import MetadataStore
from danube_core.objectstore import ObjectStore
from danube_core.records import SealedState
from danube_core.topics import TopicName
from danube_core.wal_files import segment_seq

from broker.cursors import SubscriptionCursor
from broker.repeated_uploads import delete_repeated_uploads
from broker.retention import WalRetention
from broker.tiered_reader import TieredReader
from danube_core.descriptor_catalog import DescriptorCatalog
from broker.uploader import ReadOnlyWal, Uploader, uploader_checkpoint_path
from broker.wal import Wal, WalConfig

logger = logging.getLogger(__name__)

WalLocator = Callable[[int], tuple[str, dict[str, Any]] | None]
"""Broker id -> (fsspec URL of that broker's WAL root, storage options); None if unknown."""


class TopicClosedError(DanubeError):
    """The topic is unloading, unloaded or deleted on this broker; look it up again and retry."""

    retriable = True


def read_state(metadata: MetadataStore, keys: StorageKeys, topic: TopicName) -> SealedState | None:
    """The state marker: sealed (unload) or not (a failover record naming the dead owner)."""
    key = keys.state_key(topic)
    raw = metadata.get(key)
    return None if raw is None else SealedState.from_json(raw, key)


def read_sealed_state(
    metadata: MetadataStore, keys: StorageKeys, topic: TopicName
) -> SealedState | None:
    """The sealed marker if present and `sealed` (a marker with `sealed: false` is ignored)."""
    state = read_state(metadata, keys, topic)
    return state if state is not None and state.sealed else None


def delete_topic_keys(metadata: MetadataStore, keys: StorageKeys, topic: TopicName) -> None:
    """Delete `<root>/storage/topics/ns/t/` (descriptors, cur, state) and the cursor keys (§6.7)."""
    removed = metadata.delete_prefix(keys.topic_prefix(topic))
    cursors = 0
    for key, _ in metadata.get_prefix(subscriptions_prefix(topic), keys_only=True):
        if parse_subscription_key(topic, key)[1]:
            cursors += metadata.delete(key)
    logger.info("deleted %d storage key(s) and %d cursor(s) of %s", removed, cursors, topic)


def delete_local_wal(directory: str, file_name: str) -> None:
    """Remove a topic's WAL segments, checkpoints and their temp files, then the directory."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    owned = {WAL_CHECKPOINT_NAME, UPLOADER_CHECKPOINT_NAME}
    owned |= {os.path.basename(temp_path_for(name)) for name in tuple(owned)}
    for name in names:
        if name in owned or segment_seq(name, file_name) is not None:
            os.remove(os.path.join(directory, name))
    try:
        os.rmdir(directory)
    except OSError as exc:  # something we do not own is still there: leave it
        logger.warning("WAL directory %s not removed: %s", directory, exc)


class ReliableTopicStorage:
    """WAL + uploader + retention + reader of one reliable topic; create it with `load`."""

    def __init__(
        self,
        topic: TopicName,
        wal: Wal,
        uploader: Uploader,
        retention: WalRetention,
        *,
        store: ObjectStore,
        metadata: MetadataStore,
        keys: StorageKeys,
        wal_floor: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.topic = topic
        self.wal = wal
        self.uploader = uploader
        self.retention = retention
        self._store = store
        self._metadata = metadata
        self._keys = keys
        self._wal_floor = wal_floor
        self._clock = clock
        self._lock = threading.Lock()
        self._accepting = True
        self._closed = False
        self._closed_event = threading.Event()
        self._cursors: dict[str, SubscriptionCursor] = {}

    @classmethod
    def load(
        cls,
        topic: TopicName | str,
        *,
        broker_id: int,
        wal_config: WalConfig,
        store: ObjectStore,
        metadata: MetadataStore,
        keys: StorageKeys,
        uploader_interval_s: float = 30.0,
        max_object_bytes: int | None = None,
        retention_max_age_s: float | None = None,
        retention_max_total_bytes: int | None = None,
        retention_check_interval_s: float = 300.0,
        locate_wal: WalLocator | None = None,
        clock: Callable[[], float] = time.time,
    ) -> "ReliableTopicStorage":
        """Open the topic on broker `broker_id` and start its uploader and retention threads.

        After a failover, `locate_wal` finds the dead owner's WAL (see the module docstring).
        """
        topic = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        state = read_state(metadata, keys, topic)
        sealed = state if state is not None and state.sealed else None
        recovered_floor = 0
        if state is not None and not state.sealed and state.broker_id != broker_id:
            recovered_floor = recover_previous_wal(
                topic, state.broker_id, locate_wal, os.path.join(wal_config.root, topic.namespace, topic.topic),
                store=store, metadata=metadata, keys=keys, file_name=wal_config.file_name,
                max_object_bytes=max_object_bytes, clock=clock,
            )
        initial = max(_first_offset(metadata, keys, topic, sealed), recovered_floor)
        wal = Wal.open(topic, wal_config, initial_offset=initial)
        try:
            if sealed is not None:
                _seed_uploader_checkpoint(wal, sealed, wal_config.durable, clock)
            uploader = Uploader(
                topic, wal, store, metadata, keys, interval_s=uploader_interval_s,
                max_object_bytes=max_object_bytes, clock=clock, durable=wal_config.durable,
                owns=_assigned_to(metadata, broker_id, topic),
            )
            retention = WalRetention(
                wal, uploader_checkpoint_path=uploader_checkpoint_path(wal),
                max_age_s=retention_max_age_s, max_total_bytes=retention_max_total_bytes, clock=clock,
            )
            if state is not None:  # consumed: a later failover may name this broker instead
                metadata.delete(keys.state_key(topic))
        except BaseException:
            wal.close()
            raise
        logger.info("%s loaded on broker %d: next offset %d (sealed: %s)", topic, broker_id,
                    wal.next_offset, sealed is not None)
        uploader.start()
        retention.start(retention_check_interval_s)
        return cls(topic, wal, uploader, retention, store=store, metadata=metadata, keys=keys,
                   wal_floor=initial, clock=clock)

    # ---- serving ------------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """Offset the next append gets; a subscription without a cursor starts here (Latest)."""
        return self.wal.next_offset

    def append(self, msg: StreamMessage) -> int:
        """Store `msg` at the next offset; TopicClosedError once unloading/closed."""
        with self._lock:
            if not self._accepting:
                raise TopicClosedError(f"topic {self.topic} is not accepting messages on this broker")
            return self.wal.append(msg)

    def reader(
        self, from_offset: int, *, follow: bool = False, stop_event: threading.Event | None = None
    ) -> Iterator[StreamMessage]:
        """Messages from `from_offset` (objects, then WAL, then live with `follow`): a TieredReader.

        Offsets the topic had before this load come from objects, never from local WAL files
        of an earlier incarnation. A following read ends when the topic is unloaded, deleted
        or closed here.
        """
        tiered = TieredReader(self.topic, self._metadata, self._keys, self._store, self.wal,
                              wal_floor=self._wal_floor, closed_event=self._closed_event)
        return tiered.read(from_offset, follow=follow, stop_event=stop_event)

    def subscription_cursor(self, subscription: str) -> SubscriptionCursor:
        """The cursor of `subscription` (loaded from etcd once); flushed on unload and close."""
        with self._lock:
            cursor = self._cursors.get(subscription)
            if cursor is None:
                cursor = SubscriptionCursor(self._metadata, self.topic, subscription)
                cursor.load()
                self._cursors[subscription] = cursor
            return cursor

    # ---- lifecycle ----------------------------------------------------------------------

    def _quiesce(self) -> None:
        """Refuse appends and stop the background threads; TopicClosedError if already closed."""
        with self._lock:
            if self._closed:
                raise TopicClosedError(f"topic {self.topic} is already unloaded, deleted or closed here")
            self._accepting = False
        self.uploader.stop()
        self.retention.stop()

    def _finish(self, flush_cursors: bool) -> None:
        try:
            if flush_cursors:
                for cursor in list(self._cursors.values()):
                    cursor.flush()
        finally:
            self.wal.close()
            with self._lock:
                self._closed = True
            self._closed_event.set()

    def unload(self, broker_id: int) -> SealedState | None:
        """Hand the topic over: upload everything, seal, close the WAL (its files stay, §6.2).

        Returns the sealed state written (None for a topic that never handed out an offset).
        Cursors are flushed first; subscriptions, cursors, descriptors and objects are kept.
        If the drain fails (object store down, a corrupt WAL frame) nothing is sealed, appends
        stay refused, and `unload` may be called again.
        """
        self._quiesce()
        for cursor in list(self._cursors.values()):
            cursor.flush()
        self.uploader.drain()
        head = self.wal.next_offset
        state = None
        if head > 0:
            state = SealedState(broker_id=broker_id, last_committed_offset=head - 1, sealed=True,
                                timestamp=int(self._clock()))
            self._metadata.put(self._keys.state_key(self.topic), state.to_json())
        self._finish(flush_cursors=False)
        logger.info("%s unloaded by broker %d: sealed at %s; WAL kept in %s", self.topic, broker_id,
                    state.last_committed_offset if state else "nothing (empty topic)", self.wal.directory)
        return state

    def delete(self) -> None:
        """Delete the topic's storage keys, cursors and local WAL (§6.7; objects are kept)."""
        self._quiesce()
        self._cursors.clear()  # flushing them now would recreate the cursor keys
        self._finish(flush_cursors=False)
        delete_topic_keys(self._metadata, self._keys, self.topic)
        delete_local_wal(self.wal.directory, self.wal.config.file_name)

    def close(self) -> None:
        """Stop here as a crash would, but cleanly: flush, no seal, local files kept. Idempotent."""
        with self._lock:
            if self._closed:
                return
        self._quiesce()
        self._finish(flush_cursors=True)


def _first_offset(
    metadata: MetadataStore, keys: StorageKeys, topic: TopicName, sealed: SealedState | None
) -> int:
    """The lowest offset the new WAL may hand out: after the sealed offset and after every
    descriptor (the WAL adds its local files)."""
    last = DescriptorCatalog(metadata, keys, topic).last()
    initial = max(
        sealed.last_committed_offset + 1 if sealed is not None else 0,
        last.end_offset + 1 if last is not None else 0,
    )
    if sealed is None and last is not None:
        logger.warning(
            "%s has no sealed state but objects up to offset %d (its previous owner did not "
            "unload); continuing at %d or after the local WAL, never at 0", topic, last.end_offset, initial,
        )
    return initial


def _assigned_to(metadata: MetadataStore, broker_id: int, topic: TopicName) -> Callable[[], bool]:
    """Whether the leader's assignment of `topic` still names `broker_id` (False when etcd cannot
    say: deleting an undescribed object is never needed for a correct read, keeping it is safe)."""
    def owns() -> bool:
        try:
            return metadata.get(assignment_key(broker_id, topic)) is not None
        except DanubeError:
            return False
    return owns


def recover_previous_wal(
    topic: TopicName,
    previous: int,
    locate_wal: WalLocator | None,
    own_directory: str,
    *,
    store: ObjectStore,
    metadata: MetadataStore,
    keys: StorageKeys,
    file_name: str,
    max_object_bytes: int | None,
    clock: Callable[[], float],
) -> int:
    """Upload what dead broker `previous` holds of `topic` beyond the descriptors; the lowest
    offset the new WAL may hand out (after every whole frame found there, recovered or not).

    Errors of this broker's object store or etcd propagate (the load fails and can be retried);
    an unreadable WAL of `previous` is logged with the offsets at risk.
    """
    last = DescriptorCatalog(metadata, keys, topic).last()
    uploaded = last.end_offset if last is not None else -1
    location = locate_wal(previous) if locate_wal is not None else None
    url = location[0] if location is not None else "(no wal_url recorded)"
    try:
        source = _previous_wal(topic, previous, location, own_directory, file_name)
    except (OSError, ValueError) as exc:  # fsspec: unreachable, unknown protocol, bad URL
        logger.error("%s: the WAL of its previous owner, broker %d, at %s cannot be read (%s): offsets "
                     "from %d on that it acknowledged but did not upload may be lost; continuing after "
                     "the last uploaded offset %d", topic, previous, url, exc, uploaded + 1, uploaded)
        return 0
    if source is None:
        return 0
    uploader = Uploader(topic, source, store, metadata, keys, max_object_bytes=max_object_bytes,
                        clock=clock, durable=False)
    try:
        uploader.drain()
    except (CorruptFrameError, DataLossError, OSError) as exc:
        committed = uploader.last_committed_offset
        logger.error("%s: offsets %d..%d in the WAL of broker %d at %s cannot be recovered (%s); they are "
                     "skipped, never reused", topic, max(uploaded, -1 if committed is None else committed) + 1,
                     source.last_offset, previous, url, exc)
    recovered = uploader.last_committed_offset
    if recovered is not None and recovered > uploaded:
        logger.warning("%s: recovered offsets %d..%d from the WAL of dead broker %d at %s",
                       topic, uploaded + 1, recovered, previous, url)
        # The dead broker may have uploaded some of them and died before the descriptor put.
        delete_repeated_uploads(topic, store, metadata, keys, uploaded + 1, recovered)
    return max(x for x in (recovered, source.last_offset, -1) if x is not None) + 1


def _previous_wal(
    topic: TopicName, previous: int, location: tuple[str, dict[str, Any]] | None, own_directory: str,
    file_name: str,
) -> ReadOnlyWal | None:
    """`previous`'s WAL directory of `topic`, scanned; None if it is this broker's own (the
    local WAL recovers itself) or was never created. OSError if it cannot be read."""
    if location is None:
        raise FileNotFoundError(f"broker {previous} left no wal_url in its broker state")
    url, options = location
    fs, root = url_to_fs(url, **options)
    directory = posixpath.join(root, topic.namespace, topic.topic)
    if isinstance(fs, LocalFileSystem) and os.path.abspath(directory) == os.path.abspath(own_directory):
        return None
    if not fs.isdir(root):
        raise FileNotFoundError(f"WAL root {root} does not exist on this host")
    if not fs.isdir(directory):
        logger.info("%s: broker %d never wrote a WAL for it under %s", topic, previous, url)
        return None
    return ReadOnlyWal.open(directory, fs, file_name)


def _seed_uploader_checkpoint(
    wal: Wal, sealed: SealedState, durable: bool, clock: Callable[[], float]
) -> None:
    """Record the sealed offset as the uploader's starting point (seed 003), unless this host
    already has an `uploader.ckpt` for the topic: that one knows what its WAL files hold.

    No object id is written: nothing was uploaded from this WAL yet, which is also how the
    retention reads it. The uploader reconciles this with etcd's descriptors at its start.
    """
    path = uploader_checkpoint_path(wal)
    if os.path.exists(path):
        return
    ckpt = UploaderCheckpoint(last_committed_offset=sealed.last_committed_offset, last_read_file_seq=0,
                              last_read_byte_position=0, last_object_id=None,
                              updated_at=int(clock()))
    write_checkpoint(path, ckpt.encode(), fsync=durable)
