"""Messages a reader knows exist but cannot read: the tail in a WAL it cannot reach.

Real Danube brokers never say where their WAL is, so with `walRoot=auto` the newest, not yet
uploaded messages of their topics are out of reach. That must never look like "no more
messages": `UnreadTails` works out, per topic, the owner whose WAL is unreadable, the first
offset not read and the highest offset etcd proves exists (a subscription cursor past it),
warns once per topic and owner with the option to set, and the catalog hands the same facts
to query progress and the inspection command with each snapshot (`unread_tail`).
"""

from __future__ import annotations

import logging
from typing import Callable

from connectors.topic_runs import RunAudit
from connectors.wal_scan import UnreachableWal

logger = logging.getLogger(__name__)


class UnreadTails:
    """The tail an unreachable WAL holds, as far as etcd can tell, warned about once."""

    def __init__(self, cursors: Callable[[str], list[int]]) -> None:
        self._cursors = cursors  # topic -> every subscription cursor (inclusive offsets)
        self._warned: set[tuple[str, int | None]] = set()

    def note(self, topic: str, why: UnreachableWal | None, latest: int, audit: RunAudit | None) -> dict | None:
        """The tail past `latest` (end-exclusive) that `why` keeps from being read (None when
        `why` is None), warned about once per topic and owner."""
        if why is None:
            return None
        stale_top = max((s.last_offset for s in audit.stale_sources), default=-1) if audit else -1
        # A cursor at or below an older run's offsets may be that run's: no evidence of a tail.
        evidence = [c for c in self._cursors(topic) if c >= latest and c > stale_top]
        through = max(evidence) if evidence else None
        tail = {"broker": why.broker_id, "fromOffset": latest, "atLeastThrough": through, "reason": why.reason}
        if (topic, why.broker_id) not in self._warned:
            self._warned.add((topic, why.broker_id))
            self._warn(topic, why, latest, through)
        return tail

    @staticmethod
    def _warn(topic: str, why: UnreachableWal, latest: int, through: int | None) -> None:
        known = (f"Offsets {latest}..{through} at least (a subscription cursor is there)"
                 if through is not None else f"Any messages from offset {latest} on")
        logger.warning(
            "topic %s: the WAL of its owner, broker %s, cannot be read: %s. %s not uploaded yet "
            "are NOT read. Set option walRoot to a shared WAL root, a template with {broker_id}, "
            "or a JSON map {\"%s\": \"<url of that broker's wal_cloud.wal.dir>\"} (a shared "
            "volume or a read-only HTTP file server beside the broker).",
            topic, why.broker_id, why.reason, known, why.broker_id)
