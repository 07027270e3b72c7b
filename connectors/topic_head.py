"""Where a topic ends: its current run's newest descriptor, sealed state, WAL chain and latest offset.

The latest offset (end-exclusive) is the largest of: the current run's last object's end + 1,
the WAL head, the sealed offset + 1 (a seal the current run restarted below does not count). A
WAL head below the last object's end means a real broker restarted the topic at offset 0
(§6.6): the WAL head is then the latest offset. A head found to contradict the topic's run
audit (an older run's descriptor it has not seen, or `cur` gone back) has the topic audited
again, as has a WAL that restarted below the uploads since the audit (`restart_in_wal`); a
new run found either way is reported once (`TopicHead.restarted_at`). A stream works
out each head once per trigger (`TopicHeads.hold`). One driver thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from connectors.descriptor_reads import DescriptorReader
from connectors.snapshot import WalRun
from connectors.topic_runs import RunAudit, current_chain, restart_in_wal
from connectors.unread_tail import UnreadTails
from connectors.wal_scan import ClusterView, WalFinder
from danube_core import keys
from danube_core.metadata import MetadataStore
from danube_core.records import ObjectDescriptor, SealedState
from danube_core.topics import TopicName

logger = logging.getLogger(__name__)

# (topic, sealed state, WAL chain read before the audit, a fresh read of the chain for an uploaded stop)
RunAuditor = Callable[[TopicName, "SealedState | None", "list[WalRun]", "Callable[[int], list[WalRun]]"], RunAudit]


@dataclass(frozen=True)
class TopicHead:
    """Where a topic ends, worked out once per trigger (`TopicHeads.hold`): the newest descriptor
    of its current run, its sealed state, the WAL chain to its head, the latest offset
    (end-exclusive), the first offset of a new run found by this look (None if none) and the
    tail an unreachable WAL holds (None if every WAL is read)."""

    last: ObjectDescriptor | None
    sealed: SealedState | None
    wal: list[WalRun]
    latest: int
    restarted_at: int | None = None
    unread_tail: dict | None = None


class TopicHeads:
    """Works out topics' heads for a catalog, which owns the run audits (`audits`, filled by
    `run_audit`) this reads and invalidates."""

    def __init__(self, metadata: MetadataStore, storage_keys: keys.StorageKeys, descriptors: DescriptorReader,
                 wal: WalFinder | None, unread: UnreadTails, audits: dict[str, RunAudit],
                 run_audit: RunAuditor) -> None:
        self._metadata = metadata
        self._keys = storage_keys
        self._descriptors = descriptors
        self._wal = wal
        self._unread = unread
        self._audits = audits
        self._run_audit = run_audit
        self._restarted: set[str] = set()  # topics whose `cur` went back: a new run, once audited
        self._held: dict[str, TopicHead] | None = None  # this trigger's heads, once `hold` is called

    def hold(self) -> None:
        """Work out each topic's head at most once until the next call."""
        self._held = {}

    def head(self, topic: TopicName, cluster: ClusterView | None) -> TopicHead:
        if self._held is None:
            return self._read(topic, cluster)
        if str(topic) not in self._held:
            self._held[str(topic)] = self._read(topic, cluster)
        return self._held[str(topic)]

    def forget(self, topic: str) -> None:
        """Work the topic's head out again at its next look (its audit was dropped)."""
        if self._held is not None:
            self._held.pop(topic, None)

    def _read(self, topic: TopicName, cluster: ClusterView | None) -> TopicHead:
        cur, above = self._descriptors.above_cur(topic)
        raw = self._metadata.get(self._keys.state_key(topic))
        sealed = SealedState.from_json(raw, self._keys.state_key(topic)) if raw is not None else None
        sealed = sealed if sealed is not None and sealed.sealed else None
        audit = self._audits.get(str(topic))
        chain, stale_above = current_chain(above, cur)
        if audit is not None and chain and not audit.continues(chain[-1]):
            audit = None  # `cur` went back: a new run started since the audit
            self._restarted.add(str(topic))
        if audit is not None and any(d.object_id not in audit.stale_ids() for d in stale_above):
            audit = None  # an older run's descriptor the audit has not seen: audit again
        last = chain[-1] if chain else None
        if last is not None and audit is not None and last.object_id in audit.stale_ids():
            last = audit.current_descriptors[-1] if audit.current_descriptors else None  # an older run's
        wal = self._wal_chain(topic, last, sealed, cluster)
        restart = restart_in_wal(wal, last.end_offset + 1 if last is not None else None)
        if audit is not None and restart is not None and restart.identity != audit.wal_restart:
            audit = None  # the WAL restarted below the uploads since the audit: a new run
            self._restarted.add(str(topic))
        restarted_at = None
        if audit is None:
            audit = self._run_audit(topic, sealed, wal,
                                    lambda uploaded: self._wal_chain_from(topic, uploaded, sealed, cluster))
            if str(topic) in self._restarted and audit.current_first is not None:
                restarted_at = audit.current_first
                self._restarted.discard(str(topic))
            last = audit.current_descriptors[-1] if audit.current_descriptors else None
            wal = self._wal_chain(topic, last, sealed, cluster)
        uploaded = last.end_offset + 1 if last is not None else 0
        head = wal[-1].stop_offset if wal else None
        if head is not None and head < uploaded:
            logger.warning("WAL of %s ends at offset %d, below the uploaded offset %d: the topic was "
                           "restarted at offset 0 (spec §6.6); its offsets went backwards",
                           topic, head - 1, uploaded - 1)
            return TopicHead(last, sealed, wal, head, restarted_at)
        if audit.stale_seal is not None:
            sealed = None  # the current run restarted below it: not an offset it will reach
        candidates = [uploaded, head or 0, sealed.last_committed_offset + 1 if sealed else 0]
        latest = max(candidates)
        why = self._wal.unreachable.get(str(topic)) if self._wal is not None else None
        return TopicHead(last, sealed, wal, latest, restarted_at, self._unread.note(str(topic), why, latest, audit))

    def _wal_chain(self, topic: TopicName, last: ObjectDescriptor | None, sealed: SealedState | None,
                   cluster: ClusterView | None) -> list[WalRun]:
        return self._wal_chain_from(topic, last.end_offset + 1 if last is not None else 0, sealed, cluster)

    def _wal_chain_from(self, topic: TopicName, uploaded: int, sealed: SealedState | None,
                        cluster: ClusterView | None) -> list[WalRun]:
        if self._wal is None:
            return []
        return self._wal.chain(topic, uploaded, cluster, sealed.broker_id if sealed else None)
