"""Key spans of a metadata cache and the index that finds the spans around a key by bisection.

A `Span` is a range of keys `[start, end)` a `danube_core.local_cache.LocalCache` holds (only
the keys a filter accepts, when given); `SpanIndex` orders a cache's spans so that a watch event
or a read finds the spans concerned in O(log spans): a broker caching thousands of topics' keys
does not scan every span per event.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from danube_core.metadata import WatchEvent

KeyFilter = Callable[[str], bool]


@dataclass
class Span:
    """Keys in `[start, end)` the cache holds (only those `keep` accepts, when given).

    `loaded_at`: the revision its listing reflects; the watch's events up to it are ignored for
    keys only this span holds. `pending`: events that arrived while a `cover` was listing it.
    """

    start: str
    end: str
    keep: KeyFilter | None = None
    loaded_at: int = 0
    pending: list[WatchEvent] | None = field(default=None, repr=False)

    def holds(self, key: str) -> bool:
        return self.start <= key < self.end and (self.keep is None or self.keep(key))


class SpanIndex:
    """Spans ordered by start, with the running maximum of their ends, so the spans around a key
    are found by bisection: a cache of many spans (a broker's served topics) pays O(log spans)
    per watch event and per `covers`, not a scan of every span. Built anew when the spans
    change; a span's `pending` and `loaded_at` may change in place."""

    def __init__(self, spans: Iterable[Span]) -> None:
        self._spans = sorted(spans, key=lambda s: s.start)
        self._starts = [s.start for s in self._spans]
        self._reach = list(itertools.accumulate((s.end for s in self._spans), max))

    def around(self, key: str) -> Iterator[Span]:
        """The spans whose range holds `key` (`start <= key < end`), whatever they keep."""
        i = bisect.bisect_right(self._starts, key) - 1
        while i >= 0 and self._reach[i] > key:  # no span at or before i reaches past `key`
            span = self._spans[i]
            if key < span.end:
                yield span
            i -= 1

    def covered(self, start_key: str, end_key: str) -> bool:
        """Whether listed spans (no `cover` under way) hold `[start_key, end_key)`: one of them,
        or unfiltered ones end to end."""
        if end_key <= start_key:  # an empty range: any listed span reaching its place holds it
            return any(s.pending is None and s.start <= start_key and end_key <= s.end for s in self._spans)
        if any(s.pending is None and end_key <= s.end for s in self.around(start_key)):
            return True
        reached = start_key
        while True:
            ends = [s.end for s in self.around(reached) if s.pending is None and s.keep is None]
            if not ends:
                return False
            reached = max(ends)
            if end_key <= reached:
                return True
