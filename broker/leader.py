"""Leader election and the leader's work: placing topics and failing over dead brokers (§5.5, §6).

Election (`danube_core.election`, shared with the speed layer's masters): `/cluster/leader` =
this broker's id (a JSON number) under a lease (TTL `leader_ttl_seconds`, Danube: 14 s)
refreshed every half TTL, created only if absent. Every broker checks the key every
`leader_check_interval_seconds` and also watches it, so when a leader dies another broker
takes over as soon as the lease expires.

While leading, `TopicAssigner` watches `/cluster/unassigned/` and `/cluster/register/`:
* a marker is assigned to the active registered broker with the fewest assignments (round-
  robin among equals), excluding `from_broker` for an unload, and then deleted;
* for an **unload** of a reliable topic the assignment waits until the old owner has written
  its sealed state, marked the marker `"released": true` (an extension field), or is gone, so
  the new owner starts after the sealed offset. Danube assigns at once and the new owner may
  load before the seal exists;
* when a registration disappears, the broker's assignments are deleted and each topic gets a
  `null` marker (failover). A reliable topic first gets an unsealed state naming the dead
  broker (`record_failover`), so its next owner uploads what that broker's WAL holds beyond
  the objects before handing out offsets. On taking over, the leader also sweeps for brokers
  that died while nobody led.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

from danube_core.election import LeaseElection
from danube_core.errors import DanubeError
from danube_core.keys import (
    BROKERS_PREFIX,
    LEADER_KEY,
    REGISTER_PREFIX,
    UNASSIGNED_PREFIX,
    StorageKeys,
    assignment_key,
    broker_state_key,
    delivery_key,
    namespace_topic_key,
    parse_assignment_key,
    register_key,
    topic_from_unassigned_key,
    unassigned_key,
)
from danube_core.metadata import MetadataStore, WatchEvent, WatchHandle
from danube_core.records import (
    NON_RELIABLE,
    NULL_JSON,
    RELIABLE,
    BrokerState,
    SealedState,
    UnassignedMarker,
    dump_json,
    dump_u64,
    load_json,
    parse_delivery,
)
from danube_core.topics import TopicName

logger = logging.getLogger(__name__)

RELEASED_FIELD = "released"  # extension field of an unload marker; Danube ignores unknown fields
SEAL_WAIT_S = 30.0
INDEX_WAIT_S = 5.0
RETRY_DELAY_S = 0.05


def released_marker(raw: bytes, key: str) -> bytes:
    """The unload marker `raw` with `"released": true`: the old owner finished unloading.

    An empty topic is unloaded without a sealed state, so the seal alone cannot tell the leader
    that the old owner is done.
    """
    return dump_json({**load_json(raw, key), RELEASED_FIELD: True})


def is_released(raw: bytes, key: str) -> bool:
    value = load_json(raw, key)
    return isinstance(value, dict) and value.get(RELEASED_FIELD) is True


def record_failover(
    metadata: MetadataStore, storage_keys: StorageKeys, topic: TopicName, broker_id: int, now_s: float
) -> bool:
    """Name dead `broker_id` as the last owner of reliable `topic`: True if recorded.

    The record is the topic's state key with `sealed: false` (every reader of the sealed offset
    ignores it, §5.2; `last_committed_offset` is 0 and means nothing). The next owner reads
    `broker_id`, recovers that broker's WAL tail and deletes the record before serving. An
    existing state is kept: a sealed one already says where to continue, and an earlier dead
    owner's record still unconsumed means no later owner served (or wrote) the topic.
    """
    key = delivery_key(topic)
    raw = metadata.get(key)
    if raw is None or parse_delivery(raw, key) != RELIABLE:
        return False
    record = SealedState(broker_id=broker_id, last_committed_offset=0, sealed=False, timestamp=int(now_s))
    return metadata.put_if_absent(storage_keys.state_key(topic), record.to_json())


def broker_election(
    metadata: MetadataStore,
    broker_id: int,
    ttl_s: int,
    check_interval_s: float,
    on_elected: Callable[[], None],
    on_deposed: Callable[[], None],
) -> LeaseElection:
    """The broker's campaign for `/cluster/leader`, in the real Danube v0.7.3 broker's terms.

    The value is the broker id as a JSON number (`dump_u64`) and the lease is kept alive every
    half TTL, as Danube does, so our brokers and real ones elect one leader among themselves.
    """
    return LeaseElection(
        metadata, LEADER_KEY, dump_u64(broker_id), ttl_s=ttl_s, check_interval_s=check_interval_s,
        keep_alive_interval_s=ttl_s / 2.0, label=f"broker {broker_id}",
        on_elected=on_elected, on_deposed=on_deposed)


class TopicAssigner:
    """The leader's placement and failover loop; `start` when elected, `stop` when deposed."""

    def __init__(self, metadata: MetadataStore, storage_keys: StorageKeys, seal_wait_s: float = SEAL_WAIT_S) -> None:
        self._metadata = metadata
        self._storage_keys = storage_keys
        self._seal_wait_s = seal_wait_s
        self._jobs: list[tuple[float, int, str, str]] = []  # (due, seq, kind, key)
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._running = False
        self._watches: list[WatchHandle] = []
        self._thread: threading.Thread | None = None
        self._last_choice: int | None = None
        self._first_seen: dict[tuple[str, str], float] = {}

    def start(self) -> None:
        with self._cond:
            if self._running:
                return
            self._running = True
            self._jobs.clear()
        self._watches = [
            self._metadata.watch_prefix(UNASSIGNED_PREFIX, self._on_unassigned_event),
            self._metadata.watch_prefix(REGISTER_PREFIX, self._on_register_event),
        ]
        self._thread = threading.Thread(target=self._run, name="topic-assigner", daemon=True)
        self._thread.start()
        self._schedule("sweep", "")
        for key, _ in self._metadata.get_prefix(UNASSIGNED_PREFIX, keys_only=True):
            self._schedule("assign", key)

    def stop(self) -> None:
        with self._cond:
            self._running = False
            self._cond.notify_all()
        for watch in self._watches:
            watch.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10.0)

    def _on_unassigned_event(self, event: WatchEvent) -> None:
        if event.kind == "put":
            self._schedule("assign", event.key)

    def _on_register_event(self, event: WatchEvent) -> None:
        if event.kind == "delete":
            self._schedule("failover", event.key[len(REGISTER_PREFIX):])

    def _schedule(self, kind: str, key: str, delay_s: float = 0.0) -> None:
        with self._cond:
            heapq.heappush(self._jobs, (time.monotonic() + delay_s, next(self._seq), kind, key))
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._running and (not self._jobs or self._jobs[0][0] > time.monotonic()):
                    self._cond.wait(self._jobs[0][0] - time.monotonic() if self._jobs else None)
                if not self._running:
                    return
                _, _, kind, key = heapq.heappop(self._jobs)
            try:
                self._do(kind, key)
            except DanubeError as exc:
                logger.warning("leader job %s %s failed, retrying: %s", kind, key, exc)
                self._schedule(kind, key, delay_s=0.5)

    def _do(self, kind: str, key: str) -> None:
        if kind == "assign":
            self._assign(key)
        elif kind == "failover" and key.isdigit():
            self._failover(int(key))
        elif kind == "sweep":
            self._sweep()

    # ---- placement ----------------------------------------------------------------------------

    def _assign(self, key: str) -> None:
        raw = self._metadata.get(key)
        if raw is None:
            return  # already handled
        topic = topic_from_unassigned_key(key)
        if self._metadata.get(namespace_topic_key(topic)) is None:
            # A new topic's marker is written before its namespace index entry (§6.1): wait a
            # little before deciding the topic was deleted meanwhile.
            if self._waited(("index", key)) < INDEX_WAIT_S:
                self._schedule("assign", key, delay_s=RETRY_DELAY_S)
                return
            logger.info("topic %s is not in its namespace index; dropping %s", topic, key)
            self._forget(key)
            self._metadata.delete(key)
            return
        marker = UnassignedMarker.from_json(raw, key)
        if marker.reason == "unload" and marker.from_broker is not None and not self._released(topic, marker.from_broker, key, raw):
            self._schedule("assign", key, delay_s=RETRY_DELAY_S)
            return
        self._forget(key)
        exclude = marker.from_broker if marker.reason in ("unload", "rebalance", "drain_redirect") else None
        target = self._choose(exclude, preferred=marker.to_broker)
        if target is None:
            logger.warning("no active broker can take %s yet; retrying", topic)
            self._schedule("assign", key, delay_s=0.5)
            return
        self._metadata.put(assignment_key(target, topic), NULL_JSON)
        self._metadata.delete(key)
        logger.info("topic %s assigned to broker %d", topic, target)

    def _released(self, topic: TopicName, from_broker: int, key: str, raw: bytes) -> bool:
        """True once the old owner `from_broker` sealed the topic, is gone, or the wait timed out."""
        if is_released(raw, key) or not self._registered(from_broker):
            return True
        delivery_raw = self._metadata.get(delivery_key(topic))
        if delivery_raw is not None and parse_delivery(delivery_raw, delivery_key(topic)) == NON_RELIABLE:
            return True
        state_key = self._storage_keys.state_key(topic)
        state_raw = self._metadata.get(state_key)
        if state_raw is not None:
            state = SealedState.from_json(state_raw, state_key)
            if state.sealed and state.broker_id == from_broker:
                return True
        if self._waited(("seal", key)) > self._seal_wait_s:
            # As for a dead owner: the next owner recovers what `from_broker`'s WAL holds beyond
            # the uploads and continues after it, rather than after the last upload (offsets the
            # old owner acknowledged would be handed out again).
            recorded = record_failover(self._metadata, self._storage_keys, topic, from_broker, time.time())
            logger.warning("broker %d did not seal %s within %.0fs; assigning anyway%s", from_broker, topic,
                           self._seal_wait_s, ", naming it as the owner whose WAL to recover" if recorded else "")
            return True
        return False

    def _waited(self, what: tuple[str, str]) -> float:
        """Seconds since this wait (kind, marker key) started."""
        return time.monotonic() - self._first_seen.setdefault(what, time.monotonic())

    def _forget(self, key: str) -> None:
        for kind in ("index", "seal"):
            self._first_seen.pop((kind, key), None)

    def _registered(self, broker_id: int) -> bool:
        return self._metadata.get(register_key(broker_id)) is not None

    def _choose(self, exclude: int | None, preferred: int | None) -> int | None:
        """Least-assigned active broker; the excluded one only if it is the last one standing."""
        active = [b for b in self._registered_ids() if self._is_active(b)]
        if preferred in active and preferred != exclude:
            return preferred
        candidates = [b for b in active if b != exclude] or active
        if not candidates:
            return None
        counts = self._assignment_counts()
        least = min(counts.get(b, 0) for b in candidates)
        tied = sorted(b for b in candidates if counts.get(b, 0) == least)
        after = [b for b in tied if self._last_choice is not None and b > self._last_choice]
        self._last_choice = (after or tied)[0]
        return self._last_choice

    def _registered_ids(self) -> list[int]:
        rows = self._metadata.get_prefix(REGISTER_PREFIX, keys_only=True)
        return [int(k[len(REGISTER_PREFIX):]) for k, _ in rows if k[len(REGISTER_PREFIX):].isdigit()]

    def _is_active(self, broker_id: int) -> bool:
        key = broker_state_key(broker_id)
        raw = self._metadata.get(key)
        return raw is None or BrokerState.from_json(raw, key).mode == "active"

    def _assignment_counts(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for key, _ in self._metadata.get_prefix(BROKERS_PREFIX, keys_only=True):
            parsed = parse_assignment_key(key)
            if parsed is not None:
                counts[parsed[0]] = counts.get(parsed[0], 0) + 1
        return counts

    # ---- failover -----------------------------------------------------------------------------

    def _failover(self, broker_id: int) -> None:
        """Move every topic of a broker whose registration is gone back to unassigned."""
        if self._registered(broker_id):
            return  # it registered again (lease renewed after a blip)
        moved = 0
        for key, _ in self._metadata.get_prefix(f"{BROKERS_PREFIX}{broker_id}/", keys_only=True):
            parsed = parse_assignment_key(key)
            if parsed is None:
                continue
            record_failover(self._metadata, self._storage_keys, parsed[1], broker_id, time.time())
            self._metadata.delete(key)
            self._metadata.put(unassigned_key(parsed[1]), NULL_JSON)
            moved += 1
        if moved:
            logger.warning("broker %d is gone: %d topic(s) put back for assignment", broker_id, moved)

    def _sweep(self) -> None:
        registered = set(self._registered_ids())
        owners = {parsed[0] for key, _ in self._metadata.get_prefix(BROKERS_PREFIX, keys_only=True)
                  if (parsed := parse_assignment_key(key)) is not None}
        for broker_id in sorted(owners - registered):
            self._failover(broker_id)
