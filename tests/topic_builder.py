"""Hand-built topics in the real Danube v0.7.3 broker's layout, for connector tests.

`TopicBuilder` plays one reliable topic's broker side without running a broker: it appends
frames to `<wal_root>/{ns}/{topic}/wal.log` / `wal.<n>.log` and rewrites `wal.ckpt` after every
append (one flush), uploads the not-yet-uploaded WAL bytes as one `.dnb1` object (spanning
rotated files, with the 1-in-1000 offset index), puts the descriptor, `cur` and
`uploader.ckpt`, and writes the etcd keys a broker writes (namespace index, delivery,
assignment, registration with our `wal_url` extension, sealed state). It reproduces the quirks
readers must survive (spec §3, §4, §6):

* `wal.ckpt` paths relative to the broker's working directory (`./danube-data/wal/...`);
* attributes in arbitrary (non-sorted) order;
* `seal()` counts offsets that were never uploaded (§6.4);
* `crash_restart()` starts offsets at 0 again in the same `wal.log`, so the next `upload()`
  overwrites descriptor 0 (§6.6);
* `move_to()` loads the topic on another broker with its own WAL root (§6.3).

Typical use::

    b = TopicBuilder(metadata, store, str(tmp_path / "wal"), "/default/orders")
    sent = b.append(1500)            # -> list[StreamMessage], offsets 0..1499
    b.rotate(); sent += b.append(10)
    b.upload()                       # one object data-0-<secs>.dnb1 spanning both files
    b.seal()

`b.messages` is every message of the current offset generation, by offset.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Callable, ClassVar

from danube_core import keys
from danube_core.checkpoints import UploaderCheckpoint, WalCheckpoint, write_checkpoint
from danube_core.frames import FRAME_HEADER_SIZE, encode_frame
from danube_core.message import MessageID, StreamMessage, encode_message
from danube_core.metadata import MetadataStore
from danube_core.objectstore import ObjectStore, object_id_for
from danube_core.records import (
    NULL_JSON, BrokerRegistration, CurPointer, ObjectDescriptor, Policies, SealedState,
    dump_delivery, RELIABLE,
)
from danube_core.topics import TopicName

INDEX_EVERY = 1000
BROKER_ADDR = "http://127.0.0.1:6650/"
BIG_PRODUCER_ID = 0xF123456789ABCDEF  # > 2^63: must survive as an exact u64
BASE_PUBLISH_MS = 1_700_000_000_000


@dataclass
class _Frame:
    offset: int
    seq: int  # WAL file holding it
    pos: int  # header position in that file
    size: int  # header + payload


@dataclass
class _Generation:
    """One writer process on one WAL dir: its files, frames and upload progress."""

    wal_dir: str
    next_offset: int
    file_seq: int = 0
    rotated: list[tuple[int, str, int]] = field(default_factory=list)
    frames: list[_Frame] = field(default_factory=list)
    uploaded: int = 0  # frames of this generation already in objects


class TopicBuilder:
    """Writes one topic's WAL, objects and etcd keys the way the broker does (see module doc)."""

    # Builders whose fake broker registrations are still in etcd; the conftest removes them
    # after each test module, so a real broker's leader never assigns a later test's topic to them.
    unclosed: "ClassVar[list[TopicBuilder]]" = []

    def __init__(
        self,
        metadata: MetadataStore,
        store: ObjectStore,
        wal_root: str,
        topic: str,
        *,
        root_prefix: str = keys.DEFAULT_ROOT_PREFIX,
        broker_id: int | None = None,
        ckpt_prefix: str | None = "./danube-data/wal",
        register: bool = True,
    ) -> None:
        """`broker_id` defaults to a random u64 (as a broker picks at start; unique in a shared
        etcd). `ckpt_prefix` is the WAL root as the broker's config names it, used for the paths
        inside `wal.ckpt` (None: the real absolute paths)."""
        self.metadata, self.store = metadata, store
        self.topic = TopicName.parse(topic)
        self.name = self.topic.broker_name
        self.storage_keys = keys.StorageKeys(root_prefix)
        self.ckpt_prefix = ckpt_prefix
        self.broker_id = broker_id
        self.messages: dict[int, StreamMessage] = {}
        self.descriptors: list[ObjectDescriptor] = []
        self.registered: set[int] = set()
        TopicBuilder.unclosed.append(self)
        self._request_id = 0
        self._clock = int(time.time())
        self._put_topic_keys()
        self._start(wal_root, broker_id if broker_id is not None else secrets.randbits(64), 0, register)

    # ---- etcd keys a broker writes -------------------------------------------------------

    def _put_topic_keys(self) -> None:
        ns = self.topic.namespace
        self.metadata.put_if_absent(keys.namespace_policy_key(ns), Policies().to_json())
        self.metadata.put(keys.namespace_topic_key(self.topic), NULL_JSON)
        self.metadata.put(keys.delivery_key(self.topic), dump_delivery(RELIABLE))

    def _start(self, wal_root: str, broker_id: int, first_offset: int, register: bool) -> None:
        self.wal_root = os.path.abspath(wal_root)
        self.broker_id = broker_id
        wal_dir = os.path.join(self.wal_root, self.topic.namespace, self.topic.topic)
        os.makedirs(wal_dir, exist_ok=True)
        self.gen = _Generation(wal_dir, first_offset)
        if register:
            self.registered.add(broker_id)
            self.metadata.put(keys.register_key(broker_id), BrokerRegistration(
                admin_addr="http://127.0.0.1:50051", broker_url=BROKER_ADDR,
                connect_url=BROKER_ADDR, wal_url="file://" + self.wal_root,
            ).to_json())
        self.metadata.put(keys.assignment_key(broker_id, self.topic), NULL_JSON)

    @classmethod
    def with_backlog(cls, metadata: MetadataStore, store: ObjectStore, wal_root: str, topic: str,
                     uploaded: int, in_wal: int) -> "TopicBuilder":
        """A topic on its own random broker: `uploaded` messages in objects, then `in_wal` more
        only in the WAL (the shape a live topic has)."""
        builder = cls(metadata, store, wal_root, topic, broker_id=secrets.randbits(63))
        builder.append(uploaded)
        builder.upload()
        builder.append(in_wal)
        return builder

    @property
    def wal_dir(self) -> str:
        return self.gen.wal_dir

    def file_path(self, seq: int) -> str:
        name = "wal.log" if seq == 0 else f"wal.{seq}.log"
        return os.path.join(self.gen.wal_dir, name)

    def _ckpt_path(self, seq: int) -> str:
        if self.ckpt_prefix is None:
            return self.file_path(seq)
        name = os.path.basename(self.file_path(seq))
        return f"{self.ckpt_prefix}/{self.topic.storage_path}/{name}"

    # ---- producing ----------------------------------------------------------------------

    def append(
        self,
        n: int,
        *,
        payload: Callable[[int], bytes] | None = None,
        attributes: Callable[[int], dict[str, str]] | None = None,
        publish_time: Callable[[int], int] | None = None,
    ) -> list[StreamMessage]:
        """Append `n` messages (one flush) and return them; callables get the offset."""
        gen, out, chunks = self.gen, [], []
        path = self.file_path(gen.file_seq)
        pos = os.path.getsize(path) if os.path.exists(path) else 0
        for _ in range(n):
            offset = gen.next_offset
            msg = self._message(offset, payload, attributes, publish_time)
            frame = encode_frame(offset, encode_message(msg))
            gen.frames.append(_Frame(offset, gen.file_seq, pos, len(frame)))
            chunks.append(frame)
            pos += len(frame)
            gen.next_offset += 1
            self.messages[offset] = msg
            out.append(msg)
        with open(path, "ab") as fh:
            fh.write(b"".join(chunks))
        self._write_wal_ckpt()
        return out

    def _message(self, offset: int, payload, attributes, publish_time) -> StreamMessage:
        self._request_id += 1
        return StreamMessage(
            request_id=self._request_id,
            msg_id=MessageID(BIG_PRODUCER_ID, self.name, BROKER_ADDR, offset),
            payload=payload(offset) if payload else f"{self.name}#{offset}".encode(),
            publish_time=publish_time(offset) if publish_time else BASE_PUBLISH_MS + offset,
            producer_name="p1",
            subscription_name="",
            attributes=attributes(offset) if attributes else {"zone": "b", "app": "x", "k": str(offset)},
            schema_id=None if offset % 2 else 5,
            schema_version=None if offset % 2 else 1,
        )

    def rotate(self) -> None:
        """Close the active file and continue in `wal.<seq+1>.log` (§3.2)."""
        gen = self.gen
        gen.rotated.append((gen.file_seq, self._ckpt_path(gen.file_seq), self._first_in(gen.file_seq)))
        gen.file_seq += 1
        open(self.file_path(gen.file_seq), "ab").close()
        self._write_wal_ckpt()

    def _first_in(self, seq: int) -> int:
        return next((f.offset for f in self.gen.frames if f.seq == seq), self.gen.next_offset)

    def _write_wal_ckpt(self) -> None:
        gen = self.gen
        active = [f for f in gen.frames if f.seq == gen.file_seq]
        ckpt = WalCheckpoint(
            start_offset=0,
            last_offset=max(gen.next_offset - 1, 0),
            file_seq=gen.file_seq,
            file_path=self._ckpt_path(gen.file_seq),
            rotated_files=list(gen.rotated),
            active_file_name=os.path.basename(self.file_path(gen.file_seq)),
            last_rotation_at=None,
            active_file_first_offset=active[0].offset if active else None,
        )
        write_checkpoint(os.path.join(gen.wal_dir, "wal.ckpt"), ckpt.encode(), fsync=False)

    # ---- uploading ----------------------------------------------------------------------

    def upload(self, max_frames: int | None = None) -> ObjectDescriptor | None:
        """Upload the WAL bytes not yet uploaded (at most `max_frames` frames) as one object."""
        gen = self.gen
        frames = gen.frames[gen.uploaded:]
        frames = frames[:max_frames] if max_frames is not None else frames
        if not frames:
            return None
        self._clock = max(self._clock + 1, int(time.time()))
        object_id = object_id_for(frames[0].offset, self._clock)
        index, size = [], 0
        with self.store.open_writer(self.topic, object_id) as writer:
            for i, frame in enumerate(frames):
                if i % INDEX_EVERY == 0:
                    index.append((frame.offset, size))
                with open(self.file_path(frame.seq), "rb") as fh:
                    fh.seek(frame.pos)
                    writer.write(fh.read(frame.size))
                size += frame.size
        descriptor = ObjectDescriptor(
            object_id=object_id, start_offset=frames[0].offset, end_offset=frames[-1].offset,
            size=size, etag=writer.etag, created_at=self._clock, completed=True, offset_index=index,
        )
        self.metadata.put(self.storage_keys.object_key(self.topic, descriptor.start_offset), descriptor.to_json())
        self.metadata.put(self.storage_keys.cur_key(self.topic), CurPointer.for_offset(descriptor.start_offset).to_json())
        gen.uploaded += len(frames)
        last = frames[-1]
        write_checkpoint(os.path.join(gen.wal_dir, "uploader.ckpt"), UploaderCheckpoint(
            last.offset, last.seq, last.pos + last.size, object_id, self._clock).encode(), fsync=False)
        self.descriptors.append(descriptor)
        return descriptor

    # ---- lifecycle ----------------------------------------------------------------------

    def seal(self) -> SealedState:
        """Unload: sealed state = last offset handed out (uploaded or not), assignment removed."""
        state = SealedState(self.broker_id, max(self.gen.next_offset - 1, 0), True, self._clock)
        self.metadata.put(self.storage_keys.state_key(self.topic), state.to_json())
        self.metadata.delete(keys.assignment_key(self.broker_id, self.topic))
        return state

    def move_to(self, broker_id: int, wal_root: str, *, register: bool = True) -> None:
        """Load the sealed topic on another broker: offsets continue at sealed + 1 (§6.3)."""
        raw = self.metadata.get(self.storage_keys.state_key(self.topic))
        if raw is None:
            raise RuntimeError(f"move_to: {self.name} is not sealed; call seal() first")
        sealed = SealedState.from_json(raw, self.storage_keys.state_key(self.topic))
        self.metadata.delete(self.storage_keys.state_key(self.topic))
        self._start(wal_root, broker_id, sealed.last_committed_offset + 1, register)

    def unregister(self, broker_id: int) -> None:
        """The broker's registration lease expired: its WAL root is no longer discoverable."""
        self.metadata.delete(keys.register_key(broker_id))
        self.registered.discard(broker_id)

    def close(self) -> None:
        """Remove the cluster-wide registrations this builder wrote (test hygiene)."""
        for broker_id in list(self.registered):
            self.unregister(broker_id)
        if self in TopicBuilder.unclosed:
            TopicBuilder.unclosed.remove(self)

    def crash_restart(self, broker_id: int) -> None:
        """A same-host restart without seal (§6.6): new broker id, offsets from 0 again, the
        writer back on `wal.log` appending behind the old frames, upload of the new frames only."""
        self.metadata.delete(keys.assignment_key(self.broker_id, self.topic))
        self.messages = {}
        self._start(self.wal_root, broker_id, 0, True)

    def frame_position(self, offset: int) -> tuple[str, int]:
        """(WAL file path, header position) of a frame of the current generation."""
        frame = next(f for f in self.gen.frames if f.offset == offset)
        return self.file_path(frame.seq), frame.pos

    def object_url(self, descriptor: ObjectDescriptor) -> str:
        return self.store.object_url(self.topic, descriptor.object_id)


def corrupt_byte(path: str, pos: int) -> None:
    """Flip one byte of a local file (e.g. inside a payload, to break its CRC)."""
    with open(path, "r+b") as fh:
        fh.seek(pos)
        value = fh.read(1)
        fh.seek(pos)
        fh.write(bytes([value[0] ^ 0xFF]))


PAYLOAD_OFFSET_IN_FRAME = FRAME_HEADER_SIZE + 1  # a byte inside every frame's payload


def messages_of(batches) -> list[StreamMessage]:
    """Arrow batches in `MESSAGE_ARROW_SCHEMA` back to messages, for equality checks.

    `topic_offset` is taken from the frame header offset, as the broker's WAL reader does.
    """
    out = []
    for batch in batches:
        for row in batch.to_pylist():
            out.append(StreamMessage(
                request_id=row["request_id"],
                msg_id=MessageID(row["producer_id"], row["topic_name"], row["broker_addr"], row["offset"]),
                payload=row["payload"], publish_time=row["publish_time"],
                producer_name=row["producer_name"], subscription_name=row["subscription_name"],
                attributes=dict(row["attributes"]), schema_id=row["schema_id"],
                schema_version=row["schema_version"],
            ))
    return out
