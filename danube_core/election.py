"""Leader election over one leased etcd key, for any cluster of processes that share a store.

A candidate campaigns by creating `key` = its id (bytes) under a lease of `ttl_s`, only if the
key is absent, and keeps the lease alive every `keep_alive_interval_s` (default `ttl_s / 3`).
Every candidate also watches the
key and re-checks every `check_interval_s`, so when a leader dies (its lease expires, etcd
deletes the key) a follower takes over within about one TTL. A leader that finds the key gone
or held by another id, or whose keep-alive reports the lease lost, steps down at once.

Two clusters use it:
* the broker (`broker.leader.broker_election`): `/cluster/leader` = `dump_u64(broker_id)`, the
  JSON number the real Danube v0.7.3 broker writes, TTL 14 s kept alive every half TTL, so our
  brokers and real ones can share one cluster's election;
* the speed layer's masters (`/election/master` = the master id).

The holder is compared as bytes: both writers encode an id one way only, and a value this
module cannot decode must not stop a candidate from following whoever holds the key.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from danube_core.errors import DanubeError
from danube_core.metadata import KeepAlive, Lease, MetadataStore
from danube_core.watched_thread import WatchedThread

logger = logging.getLogger(__name__)


class LeaseElection:
    """Campaigns for `key` with `candidate_id`; `on_elected` / `on_deposed` run on transitions.

    The callbacks run on the election's thread (`on_deposed` also on the keep-alive thread
    when the lease is lost); they should return quickly and hand long work to threads of
    their own.
    """

    def __init__(
        self,
        metadata: MetadataStore,
        key: str,
        candidate_id: bytes,
        *,
        ttl_s: int,
        check_interval_s: float = 1.0,
        keep_alive_interval_s: float | None = None,
        label: str | None = None,
        on_elected: Callable[[], None] = lambda: None,
        on_deposed: Callable[[], None] = lambda: None,
    ) -> None:
        if ttl_s < 1:
            raise ValueError(f"election ttl_s={ttl_s!r}: expected an integer number of seconds >= 1")
        if keep_alive_interval_s is not None and not 0 < keep_alive_interval_s < ttl_s:
            raise ValueError(f"election keep_alive_interval_s={keep_alive_interval_s!r}: "
                             f"expected seconds above 0 and below ttl_s={ttl_s}")
        self._metadata = metadata
        self._key = key
        self._id = candidate_id
        self._ttl_s = ttl_s
        self._check_interval_s = check_interval_s
        self._keep_alive_interval_s = keep_alive_interval_s if keep_alive_interval_s is not None else ttl_s / 3.0
        self._label = label if label is not None else repr(candidate_id)
        self._on_elected, self._on_deposed = on_elected, on_deposed
        self._lock = threading.Lock()
        self._lease: Lease | None = None
        self._keep_alive: KeepAlive | None = None
        self._leading = False
        self._loop = WatchedThread(f"election-{key}", self._run)
        self._wake, self._stop = self._loop.wake_event, self._loop.stop_event

    @property
    def is_leader(self) -> bool:
        return self._leading

    def leader_id(self) -> bytes | None:
        """The id in the key now (None: nobody leads)."""
        return self._metadata.get(self._key)

    def start(self) -> None:
        self._loop.start(self._metadata, self._key)

    def stop(self) -> None:
        """Stop campaigning; a leader gives the key up at once so a follower takes over."""
        self._loop.stop()
        self._step_down("shutting down")
        if self._lease is not None:
            self._lease.release(self._keep_alive, self._key)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._check()
            except DanubeError as exc:
                logger.warning("election check on %s failed: %s", self._key, exc)
            self._wake.wait(self._check_interval_s)
            self._wake.clear()

    def _check(self) -> None:
        holder = self._metadata.get(self._key)
        if holder is None:
            self._campaign()
        elif holder != self._id and self._leading:
            self._step_down(f"{holder!r} holds {self._key}")

    def _campaign(self) -> None:
        lease = self._metadata.grant_lease(self._ttl_s)
        if not self._metadata.put_if_absent(self._key, self._id, lease=lease):
            lease.revoke()
            return
        with self._lock:
            if self._keep_alive is not None:
                self._keep_alive.stop()
            if self._lease is not None and self._lease is not lease:
                old = self._lease
                threading.Thread(target=_revoke_quietly, args=(old,), daemon=True).start()
            self._lease = lease
            self._keep_alive = lease.keep_alive(self._keep_alive_interval_s, on_lost=self._lost)
            self._leading = True
        logger.info("%s leads %s (ttl %ds)", self._label, self._key, self._ttl_s)
        self._on_elected()

    def _lost(self, error: DanubeError) -> None:
        self._step_down(f"lease lost: {error}")
        self._wake.set()

    def _step_down(self, why: str) -> None:
        with self._lock:
            was_leading, self._leading = self._leading, False
        if was_leading:
            logger.warning("%s no longer leads %s (%s)", self._label, self._key, why)
            self._on_deposed()


def _revoke_quietly(lease: Lease) -> None:
    try:
        lease.revoke()
    except DanubeError as exc:
        logger.debug("revoking an old election lease failed: %s", exc)
