"""One page of a topic's messages, for a person looking at a topic (the console's topic browser).

A page is at most `limit` messages from `from_offset` on: first from the uploaded objects (the
descriptor holding the offset, found with a few one-row key range reads, then the ones after
it), then from the WAL files of the topic's owner. It reads what one page needs and stops:
ranged object reads from the sparse index entry at or before the offset, and the WAL only for
what the objects do not hold. Unlike the broker's tiered reader it never waits for appends, and
a gap (a missing object, a WAL that cannot be reached) ends the page with the reason said in
`stopped`, instead of raising: someone browsing wants what can be read, and why the rest cannot.
Offsets are inclusive as in etcd; `next_offset` is where the following page starts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterator

from fsspec.core import url_to_fs

from danube_core.descriptor_catalog import DescriptorCatalog
from danube_core.errors import DanubeError, ObjectMissingError, PayloadDecodeError
from danube_core.frames import STOP_CRC, scan_frames
from danube_core.keys import StorageKeys
from danube_core.message import StreamMessage, decode_message, with_offset
from danube_core.local_cache import LocalCache
from danube_core.metadata import MetadataStore
from danube_core.objectstore import ObjectStore
from danube_core.records import ObjectDescriptor
from danube_core.topics import TopicName
from danube_core.wal_files import list_segments, read_segments

logger = logging.getLogger(__name__)

MAX_PAGE_MESSAGES = 500
READ_CHUNK_BYTES = 256 * 1024  # a few index intervals of frames per ranged read


@dataclass(frozen=True)
class MessagePage:
    """What one page read found. `sources`: the objects and WAL directory it read from."""

    topic: str
    from_offset: int
    messages: list[StreamMessage]
    next_offset: int
    sources: list[str] = field(default_factory=list)
    stopped: str | None = None  # why the page ended before `limit` for a reason other than the head


def read_message_page(metadata: MetadataStore | LocalCache, store: ObjectStore, keys: StorageKeys, topic: str,
                      from_offset: int, limit: int, wal_dir: str | None = None,
                      wal_options: dict | None = None) -> MessagePage:
    """At most `limit` (capped at `MAX_PAGE_MESSAGES`) messages of `topic` from `from_offset`.

    `metadata` may be a `LocalCache` holding the topic's storage keys; `wal_dir` is the fsspec
    URL of the topic's WAL directory on its owner (None: objects only)."""
    name = TopicName.parse(topic)
    limit = max(0, min(limit, MAX_PAGE_MESSAGES))
    messages: list[StreamMessage] = []
    sources: list[str] = []
    pos, stopped = from_offset, None
    try:
        for descriptor in _descriptors_from(metadata, keys, name, pos):
            if len(messages) >= limit:
                break
            if descriptor.start_offset > pos:
                stopped = f"offsets {pos}..{descriptor.start_offset - 1} are in no object"
                break
            sources.append(descriptor.object_id)
            for msg in _object_messages(store, name, descriptor, pos):
                messages.append(msg)
                pos = msg.msg_id.topic_offset + 1
                if len(messages) >= limit:
                    break
    except ObjectMissingError as exc:
        stopped = f"object missing: {exc}"
    except DanubeError as exc:
        stopped = f"object unreadable: {exc}"
    if stopped is None and len(messages) < limit and wal_dir is not None:
        try:
            fs, path = url_to_fs(wal_dir, **(wal_options or {}))
            for msg in read_segments(list_segments(path, fs=fs), pos, fs=fs):
                if not sources or sources[-1] != wal_dir:
                    sources.append(wal_dir)
                messages.append(msg)
                pos = msg.msg_id.topic_offset + 1
                if len(messages) >= limit:
                    break
        except (OSError, DanubeError, ValueError) as exc:
            stopped = f"WAL {wal_dir} unreadable: {exc}"
    return MessagePage(str(name), from_offset, messages, pos, sources, stopped)


def _descriptors_from(metadata: MetadataStore | LocalCache, keys: StorageKeys, topic: TopicName,
                      offset: int) -> Iterator[ObjectDescriptor]:
    """The descriptor holding `offset` (or the first after it), then the following ones."""
    catalog = DescriptorCatalog(metadata, keys, topic)
    first = catalog.at_or_before(offset)
    return catalog.iter_from(first.start_offset if first is not None and first.end_offset >= offset else offset)


def _object_messages(store: ObjectStore, topic: TopicName, descriptor: ObjectDescriptor,
                     pos: int) -> Iterator[StreamMessage]:
    """Messages at or after `pos` of one object, read in ranged chunks from the index entry
    at or before `pos` (frames CRC-checked by the scan)."""
    path = store.object_path(topic, descriptor.object_id)
    size = store.size(path)
    read_pos = max((byte for off, byte in descriptor.offset_index or () if off <= pos), default=0)
    carry = b""
    while read_pos < size:
        chunk = store.read_range(path, read_pos, min(size, read_pos + READ_CHUNK_BYTES))
        if not chunk:
            return
        buf = carry + chunk
        read_pos += len(chunk)
        scan = scan_frames(buf)
        for ref in scan.frames:
            if ref.offset < pos:
                continue
            try:
                msg = decode_message(buf[ref.payload_pos:ref.end_pos])
            except PayloadDecodeError as exc:
                logger.warning("object %s: offset %d undecodable: %s", descriptor.object_id, ref.offset, exc)
                return
            yield msg if msg.msg_id.topic_offset == ref.offset else with_offset(msg, ref.offset)
        carry = buf[scan.safe_end:]
        if scan.stop_reason == STOP_CRC:
            logger.warning("object %s stops at byte %s (%s)", descriptor.object_id, scan.stop_pos, scan.stop_reason)
            return
