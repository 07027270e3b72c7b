"""A topic's object descriptors in etcd, looked up by offset: the broker's tiered reader and
uploader, and the console's topic browser (`message_page`), find "the object holding offset N"
the same way, in O(log distance) one-row range reads whatever the topic's history.

`metadata` is anything with the metadata store's `get`/`get_range`: the store itself, or a
`LocalCache` holding the topic's storage keys.
"""

from __future__ import annotations

import logging
from typing import Iterator, Protocol

from danube_core.errors import MetadataError
from danube_core.keys import StorageKeys, parse_object_key
from danube_core.metadata import KeyValues
from danube_core.records import CurPointer, ObjectDescriptor
from danube_core.topics import TopicName

logger = logging.getLogger(__name__)

_PAGE = 64


class KeyReader(Protocol):
    """The reads a catalog makes (`MetadataStore` and `LocalCache` both have them)."""

    def get(self, key: str) -> bytes | None: ...

    def get_range(self, start_key: str, end_key: str, limit: int | None = None) -> KeyValues: ...


class DescriptorCatalog:
    """A topic's object descriptors in etcd, looked up by offset.

    Keys are `<root>/storage/topics/ns/t/objects/<start:020>`, so etcd's key order is offset
    order and `objects/cur` sorts after every descriptor; a range ending at the `cur` key holds
    descriptors only.
    """

    def __init__(self, metadata: KeyReader, keys: StorageKeys, topic: TopicName) -> None:
        self._metadata = metadata
        self._keys = keys
        self._topic = topic
        self._end_key = keys.cur_key(topic)

    def _parse(self, key: str, raw: bytes) -> ObjectDescriptor:
        descriptor = ObjectDescriptor.from_json(raw, key)
        if parse_object_key(key) != descriptor.start_offset:
            raise MetadataError(
                f"etcd key {key!r} holds a descriptor with start_offset "
                f"{descriptor.start_offset}; expected the offset in the key"
            )
        return descriptor

    def _first_in(self, start_offset: int, end_offset_exclusive: int) -> ObjectDescriptor | None:
        rows = self._metadata.get_range(
            self._keys.object_key(self._topic, start_offset),
            self._keys.object_key(self._topic, end_offset_exclusive),
            limit=1,
        )
        return self._parse(*rows[0]) if rows else None

    def get(self, start_offset: int) -> ObjectDescriptor | None:
        """The descriptor whose key is exactly `start_offset`."""
        key = self._keys.object_key(self._topic, start_offset)
        raw = self._metadata.get(key)
        return None if raw is None else self._parse(key, raw)

    def cur_start(self) -> int | None:
        """Start offset named by `objects/cur` (the last object uploaded), None if absent."""
        key = self._keys.cur_key(self._topic)
        raw = self._metadata.get(key)
        if raw is None:
            return None
        start = CurPointer.from_json(raw, key).start
        if not (start.isascii() and start.isdigit()):
            raise MetadataError(f"etcd key {key!r}: 'start' must be a zero-padded offset, got {start!r}")
        return int(start)

    def iter_from(self, start_offset: int) -> Iterator[ObjectDescriptor]:
        """Descriptors whose start offset is >= `start_offset`, ascending, read in pages."""
        start_key = self._keys.object_key(self._topic, start_offset)
        while True:
            rows = self._metadata.get_range(start_key, self._end_key, limit=_PAGE)
            for key, raw in rows:
                yield self._parse(key, raw)
            if len(rows) < _PAGE:
                return
            start_key = rows[-1][0] + "\0"

    def at_or_before(self, offset: int) -> ObjectDescriptor | None:
        """The descriptor with the greatest start offset <= `offset` (None if there is none).

        Readers near the head are answered from `cur`. Otherwise a backward gallop finds a
        window holding a key, then a binary search narrows it to the last key <= `offset`:
        O(log distance) range reads of at most one row each.
        """
        cur = self.cur_start()
        if cur is not None and cur <= offset:
            found = None
            for descriptor in self.iter_from(cur):
                if descriptor.start_offset > offset:
                    break
                found = descriptor
            if found is not None:
                return found
        return self._search_back(offset)

    def _search_back(self, offset: int) -> ObjectDescriptor | None:
        step = 1
        while True:
            low = max(0, offset + 1 - step)
            found = self._first_in(low, offset + 1)
            if found is not None:
                break
            if low == 0:
                return None
            step *= 4
        lo, hi = found.start_offset + 1, offset
        while lo <= hi:
            mid = (lo + hi + 1) // 2
            candidate = self._first_in(mid, offset + 1)
            if candidate is None:
                hi = mid - 1
            else:
                found, lo = candidate, candidate.start_offset + 1
        return found

    def last(self) -> ObjectDescriptor | None:
        """The descriptor with the greatest start offset (reads from `cur` on; a stale or
        missing `cur`, left by a crash between the descriptor and `cur` puts, is tolerated)."""
        cur = self.cur_start()
        found = None
        for descriptor in self.iter_from(cur if cur is not None else 0):
            found = descriptor
        if found is None and cur is not None:
            logger.warning("%s points at a missing descriptor; searching back",
                           self._keys.cur_key(self._topic))
            found = self._search_back(cur)
        return found
