"""A prefix watch on etcd that survives losing its stream, for `danube_core.metadata_etcd`.

Kept apart from the store because it is its own state machine: a subscription generation that
makes a stale stream's callbacks inert, the next revision to resubscribe from, and the choice
between resubscribing past a loss and reporting it to an owner who re-reads (`on_lost`).
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import TYPE_CHECKING, Any

from pyetcd.events import PutEvent
from pyetcd.exceptions import RevisionCompactedError
from pyetcd.watch import WatchResponse

from danube_core.errors import DanubeError, MetadataCompactedError, MetadataUnavailableError
from danube_core.etcd_errors import CLIENT_ERRORS, describe, key_target
from danube_core.metadata import LostCallback, WatchEvent, WatchHandle

if TYPE_CHECKING:
    from danube_core.metadata_etcd import EtcdMetadataStore

logger = logging.getLogger(__name__)


class EtcdWatch:
    """A prefix watch that survives losing its stream (etcd restart, failover).

    It remembers the revision after the last event it passed on and resubscribes from there on
    the current endpoint, so events are neither lost nor repeated. Only if etcd has compacted
    those revisions are events lost; that is logged as an error. With `on_lost` it does neither:
    it stops and reports the loss to its owner, who re-reads.
    """

    def __init__(self, store: "EtcdMetadataStore", handle: WatchHandle,
                 on_lost: LostCallback | None = None) -> None:
        self._store = store
        self.handle = handle  # the caller's; the store cancels it on close
        self._prefix = handle.prefix
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._generation = 0  # bumped per (re)subscription; stale streams' callbacks are ignored
        self._next_revision = 0
        self._subscription: tuple[Any, int] | None = None  # (client, watch id)

    def start(self, start_revision: int | None = None) -> None:
        if start_revision is None:
            start_revision = self._store.current_revision() + 1
        self._next_revision = start_revision
        self._subscribe()

    def _subscribe(self) -> None:
        with self._lock:
            self._generation += 1
            callback = functools.partial(self._on_response, self._generation)

        def create(client: Any) -> tuple[Any, int]:
            def add() -> int:
                return client.add_watch_prefix_callback(
                    self._prefix, callback, start_revision=self._next_revision
                )

            try:
                return client, add()
            except RevisionCompactedError as exc:
                if self._on_lost is not None:
                    raise MetadataCompactedError(
                        f"watch on {self._prefix!r} from revision {self._next_revision}: compacted "
                        f"(oldest available {exc.compacted_revision})", exc.compacted_revision) from exc
                self._skip_compacted(exc.compacted_revision)
                return client, add()

        subscription = self._store._call("watch", key_target(self._prefix), create)
        with self._lock:
            if self.handle.cancelled or callback.args[0] != self._generation:
                stale = subscription
            else:
                self._subscription, stale = subscription, None
        if stale is not None:
            cancel_quietly(*stale)

    def _skip_compacted(self, compacted_revision: int) -> None:
        logger.error(
            "watch on %r lost events: revisions %d..%d were compacted by etcd",
            self._prefix, self._next_revision, compacted_revision - 1,
        )
        self._next_revision = compacted_revision

    def _on_response(self, generation: int, response: object) -> None:
        if self.handle.cancelled or generation != self._generation:
            return
        if isinstance(response, WatchResponse):
            events = []
            for raw in response.events:
                self._next_revision = raw.mod_revision + 1
                if isinstance(raw, PutEvent):
                    events.append(WatchEvent("put", raw.key.decode(), raw.value, raw.mod_revision))
                else:
                    events.append(WatchEvent("delete", raw.key.decode(), None, raw.mod_revision))
            if events:
                self._store._dispatcher.submit(self.handle, events)
            return
        if self._on_lost is not None:
            self._report_lost(response)
            return
        if isinstance(response, RevisionCompactedError):
            self._skip_compacted(response.compacted_revision)
        logger.warning(
            "watch on %r lost its stream (%s); resubscribing from revision %d",
            self._prefix, describe(response) if response is not None else "closed", self._next_revision,
        )
        # Not on this thread: it is pyetcd's stream thread, which a new subscription would join.
        name = f"etcd-rewatch-{self._prefix}"
        threading.Thread(target=self._resubscribe, name=name, daemon=True).start()

    def _report_lost(self, response: object) -> None:
        """Stop and tell the owner, after the events already passed on (on_lost mode)."""
        self.cancel()
        error: DanubeError
        if isinstance(response, RevisionCompactedError):
            error = MetadataCompactedError(
                f"watch on {self._prefix!r}: revisions before {response.compacted_revision} were "
                "compacted", response.compacted_revision)
        else:
            cause = describe(response) if response is not None else "closed"
            error = MetadataUnavailableError(f"watch on {self._prefix!r} lost its stream ({cause})")
        logger.warning("%s; its owner re-reads", error)
        assert self._on_lost is not None
        self._store._dispatcher.submit_lost(self.handle, self._on_lost, error)

    def _resubscribe(self) -> None:
        delay_s = 0.1
        while not self.handle.cancelled and not self._store.closed:
            try:
                self._subscribe()
                return
            except DanubeError as exc:
                logger.warning(
                    "resubscribing watch on %r failed, next try in %.1fs: %s", self._prefix, delay_s, exc
                )
            if self.handle.wait_cancelled(delay_s):
                return
            delay_s = min(delay_s * 2, 5.0)

    def cancel(self) -> None:
        """End the subscription; callbacks its stream still delivers are ignored (new generation)."""
        with self._lock:
            self._generation += 1
            subscription, self._subscription = self._subscription, None
        if subscription is not None:
            cancel_quietly(*subscription)
        self._store._forget_watch(self)


def cancel_quietly(client: Any, watch_id: int) -> None:
    try:
        client.cancel_watch(watch_id)
    except CLIENT_ERRORS as exc:  # the stream is gone anyway; nothing left to cancel
        logger.debug("cancelling etcd watch %s failed: %s", watch_id, describe(exc))
