"""This broker's membership in the cluster (spec §5.5, §6): registration, state, assignments.

* Registration: `/cluster/register/{id}` under a lease (TTL `register_ttl_seconds`, Danube: 32 s)
  refreshed every third of the TTL. The value carries the extension field `wal_url`. If the
  lease is lost (etcd unreachable longer than the TTL) the broker registers again. A broker
  restarted on its own data resumes the previous process's lease when it is still alive
  (`broker.identity`), so its assignments stay and its topics load at once.
* State: `/cluster/brokers/{id}/state` = `{"mode":"active","reason":"boot"}` at start, plus
  `wal_url`: unlike the registration it outlives the broker, so whoever takes over a dead
  broker's topics can still read the WAL tail it acknowledged but did not upload.
* Assignments: the leader puts `/cluster/brokers/{id}/{ns}/{topic}`; a put loads the topic, a
  delete releases it. A release is an **unload** (seal, keep storage keys) when the unassigned
  marker says so *or* the topic is still in its namespace index; otherwise it is a **delete**.
  Danube looks only at the marker, which the leader may already have removed (§6.8). After an
  unload the marker is rewritten with `"released": true`, which lets the leader reassign.
* Load reports: `/cluster/load/{id}` every `load_report_interval_seconds`.

Watch callbacks only queue events; one worker thread applies them in order, so loading a
topic never holds up the metadata store's watch thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from functools import partial
from typing import Callable, Protocol

from danube_core.errors import DanubeError
from danube_core.keys import (
    assignment_key,
    broker_assignments_prefix,
    broker_state_key,
    cluster_name_key,
    load_key,
    namespace_topic_key,
    parse_assignment_key,
    register_key,
    UNASSIGNED_PREFIX,
    topic_from_unassigned_key,
    unassigned_key,
)
from danube_core.metadata import KeepAlive, Lease, MetadataStore, WatchEvent, WatchHandle
from danube_core.records import NULL_JSON, BrokerRegistration, BrokerState, UnassignedMarker
from danube_core.topics import TopicName

from broker.config import CoordinationConfig
from broker.leader import is_released, released_marker
from broker.load_report import LoadReporter, TopicLoad

logger = logging.getLogger(__name__)

UNLOAD_REASONS = ("unload", "rebalance", "drain_redirect")


LOAD_RETRY_FIRST_S = 0.5  # a topic that failed to load is loaded again after this, doubling
LOAD_RETRY_MAX_S = 5.0     # up to this




class AssignmentListener(Protocol):
    """What the membership drives; the topic calls may block until the topic is (un)loaded."""

    def on_assigned(self, topic: TopicName) -> None: ...

    def on_released(self, topic: TopicName, unload: bool) -> None: ...

    def on_unload_asked(self, topic: TopicName) -> None:
        """Hand over `topic`, whose unload was asked while a previous process of this broker
        was down: seal what this broker's WAL holds of it (it does not serve it)."""

    def on_registration_lapsed(self) -> None:
        """The registration lease has expired: take no message until it is renewed. Called on
        the keep-alive's thread, at once: it must not block."""

    def on_registration_renewed(self, assigned: set[TopicName]) -> None:
        """Registered again: serve again the topics still `assigned` here; the others were
        failed over meanwhile (their next owner recovers this broker's WAL): stop them."""

    def topic_loads(self) -> list[TopicLoad]: ...


class ClusterMembership:
    """Registers this broker, follows its assignments and publishes its load."""

    def __init__(
        self,
        metadata: MetadataStore,
        broker_id: int,
        registration: BrokerRegistration,
        cluster_name: str,
        coordination: CoordinationConfig,
        *,
        resumed_lease: Lease | None = None,
        on_registered: Callable[[int], None] | None = None,
    ) -> None:
        self._metadata = metadata
        self._resumed_lease = resumed_lease
        self._on_registered = on_registered
        self.broker_id = broker_id
        self._registration = registration
        self._cluster_name = cluster_name
        self._coordination = coordination
        self._events: queue.SimpleQueue[tuple[str, TopicName | None] | None] = queue.SimpleQueue()
        self._load_retry_s: dict[str, float] = {}  # topic -> the backoff of its next load retry
        self._stop = threading.Event()
        self._lease: Lease | None = None
        self._keep_alive: KeepAlive | None = None
        self._watch: WatchHandle | None = None
        self._threads: list[threading.Thread] = []
        self._listener: AssignmentListener | None = None

    # ---- lifecycle ----------------------------------------------------------------------------

    def join(self, listener: AssignmentListener) -> None:
        """Register, mark active, start following assignments and reporting load."""
        self._listener = listener
        self._metadata.put_if_absent(cluster_name_key(self._cluster_name), NULL_JSON)
        self._register()
        state = BrokerState("active", "boot", wal_url=self._registration.wal_url)
        self._metadata.put(broker_state_key(self.broker_id), state.to_json())
        self._watch = self._metadata.watch_prefix(broker_assignments_prefix(self.broker_id), self._on_event)
        for key, _ in self._metadata.get_prefix(broker_assignments_prefix(self.broker_id), keys_only=True):
            parsed = parse_assignment_key(key)
            if parsed is not None:
                self._events.put(("put", parsed[1]))
        for topic in self._unloads_asked_of_me():
            self._events.put(("seal", topic))
        self._start_thread("assignments", partial(self._apply_events, listener))
        self._start_thread("load-report", partial(self._report_load, listener))
        logger.info("broker %d joined cluster %s as %s", self.broker_id, self._cluster_name,
                    self._registration.broker_url)

    def leave(self) -> None:
        """Stop following assignments and end the registration lease (deletes the key)."""
        self._stop.set()
        if self._watch is not None:
            self._watch.cancel()
        self._events.put(None)
        for thread in self._threads:
            thread.join(timeout=10.0)
        if self._lease is not None:
            self._lease.release(self._keep_alive, f"broker {self.broker_id}'s registration")
        logger.info("broker %d left the cluster", self.broker_id)

    def _start_thread(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=f"{name}-{self.broker_id}", daemon=True)
        thread.start()
        self._threads.append(thread)

    # ---- registration -------------------------------------------------------------------------

    def _register(self) -> None:
        ttl = self._coordination.register_ttl_seconds
        lease, self._resumed_lease = self._resumed_lease, None
        lease = lease or self._metadata.grant_lease(ttl)
        self._metadata.put(register_key(self.broker_id), self._registration.to_json(), lease=lease)
        self._lease = lease
        self._keep_alive = lease.keep_alive(ttl / 3.0, on_lost=self._on_lease_lost)
        if self._on_registered is not None:
            self._on_registered(lease.id)

    def registration_held(self, margin_s: float = 0.0) -> bool:
        """Whether etcd surely still holds this broker's registration `margin_s` from now: a
        broker whose lease may have expired takes and acknowledges no message, since the leader
        may be moving its topics (found by the soak, issue 43: a broker cut off from etcd for
        5 s took messages for 20 s more at offsets its topic's next owner handed out again)."""
        keep_alive = self._keep_alive
        return keep_alive is not None and keep_alive.held_for_s() > margin_s

    def _on_lease_lost(self, error: DanubeError) -> None:
        if self._stop.is_set():
            return
        logger.error("registration of broker %d expired (%s); registering again", self.broker_id, error)
        if self._listener is not None:
            self._listener.on_registration_lapsed()  # at once, not behind queued assignment events
        threading.Thread(target=self._register_again, name=f"reregister-{self.broker_id}", daemon=True).start()

    def _register_again(self) -> None:
        delay_s = 0.2
        while not self._stop.is_set():
            try:
                self._register()
                self._events.put(("renewed", None))
                return
            except DanubeError as exc:
                logger.warning("registering broker %d again failed, retrying in %.1fs: %s",
                               self.broker_id, delay_s, exc)
            self._stop.wait(delay_s)
            delay_s = min(delay_s * 2, 5.0)

    # ---- assignments --------------------------------------------------------------------------

    def _on_event(self, event: WatchEvent) -> None:
        parsed = parse_assignment_key(event.key)
        if parsed is not None and parsed[0] == self.broker_id:
            self._events.put((event.kind, parsed[1]))

    def _apply_events(self, listener: AssignmentListener) -> None:
        while (item := self._events.get()) is not None:
            kind, topic = item
            try:
                if kind == "renewed":
                    listener.on_registration_renewed(self._assigned_here())
                elif topic is None:
                    continue
                elif kind == "put":
                    listener.on_assigned(topic)
                    self._load_retry_s.pop(str(topic), None)
                elif kind == "seal":
                    self._release(listener, topic, asked_while_down=True)
                else:
                    self._release(listener, topic)
            except Exception:  # one bad topic must not stop the others
                logger.exception("broker %d could not apply assignment %s of %s", self.broker_id, kind, topic)
                if kind == "put" and topic is not None:
                    self._retry_load(topic)

    def _retry_load(self, topic: TopicName) -> None:
        """Load `topic` again after a capped backoff, while it is still assigned here.

        A load can fail for a while (the WAL's disk full, etcd or storage unreachable); the
        assignment stays, so nobody else serves the topic, and without a retry it stayed
        unserved until this broker restarted (found by the soak, issue 43: a partition that
        met a full WAL disk as it moved here took no message for the rest of the run)."""
        delay_s = min(self._load_retry_s.get(str(topic), LOAD_RETRY_FIRST_S / 2) * 2, LOAD_RETRY_MAX_S)
        self._load_retry_s[str(topic)] = delay_s
        logger.warning("broker %d loads %s again in %.1fs", self.broker_id, topic, delay_s)

        def again() -> None:
            if self._stop.is_set():
                return
            try:
                assigned = self._metadata.get(assignment_key(self.broker_id, topic)) is not None
            except DanubeError:
                assigned = True  # etcd unreachable: the load itself fails again and is retried
            if assigned:
                self._events.put(("put", topic))
            else:
                self._load_retry_s.pop(str(topic), None)

        timer = threading.Timer(delay_s, again)
        timer.daemon = True
        timer.start()

    def _unloads_asked_of_me(self) -> list[TopicName]:
        """Topics the leader waits for this broker to hand over (an unload marker naming it,
        not yet released): asked while a previous process of this broker was down, whose
        assignment deletion it never saw. A broker restarting on its own data seals them."""
        asked = []
        for key, raw in self._metadata.get_prefix(UNASSIGNED_PREFIX):
            if raw == NULL_JSON or is_released(raw, key):
                continue
            marker = UnassignedMarker.from_json(raw, key)
            if marker.reason in UNLOAD_REASONS and marker.from_broker == self.broker_id:
                asked.append(topic_from_unassigned_key(key))
        return asked

    def _assigned_here(self) -> set[TopicName]:
        """The topics etcd assigns to this broker now (not as a cache last saw them)."""
        self._metadata.sync_reads()
        return {parsed[1] for key, _ in self._metadata.get_prefix(broker_assignments_prefix(self.broker_id),
                                                                   keys_only=True)
                if (parsed := parse_assignment_key(key)) is not None}

    def _release(self, listener: AssignmentListener, topic: TopicName, asked_while_down: bool = False) -> None:
        key = unassigned_key(topic)
        marker_raw = self._metadata.get(key)
        unload_marker = (  # the marker's bytes if it asks for an unload, else None
            marker_raw
            if marker_raw is not None and marker_raw != NULL_JSON
            and UnassignedMarker.from_json(marker_raw, key).reason in UNLOAD_REASONS
            else None
        )
        if asked_while_down:
            if unload_marker is None:
                return  # the leader moved on meanwhile (it waited no longer, or assigned it)
            listener.on_unload_asked(topic)
        else:
            unload = unload_marker is not None or self._metadata.get(namespace_topic_key(topic)) is not None
            listener.on_released(topic, unload=unload)
        if unload_marker is not None:
            # Tell the leader we are done, unless it already moved on (the marker changed).
            self._metadata.compare_and_put(key, unload_marker, released_marker(unload_marker, key))

    # ---- load reports -------------------------------------------------------------------------

    def _report_load(self, listener: AssignmentListener) -> None:
        reporter = LoadReporter(self.broker_id)
        interval_s = self._coordination.load_report_interval_seconds
        while True:
            try:
                self._metadata.put(load_key(self.broker_id), reporter.report(listener.topic_loads()))
            except DanubeError as exc:
                logger.warning("load report of broker %d failed: %s", self.broker_id, exc)
            if self._stop.wait(interval_s):
                return
