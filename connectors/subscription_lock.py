"""The subscription lock: one live query per subscription, and cursor commits guarded by it.

A stream holds an etcd lease on `danube_core.keys.subscription_lock_key`; a second query on
the subscription waits one lease TTL, then is refused. Holding the lock at the start is not
enough: the lease can be lost mid-query (revoked by an operator, or expired while the driver
was stalled or cut off from etcd), and another query may take the subscription over. A cursor
commit made after that would move the new owner's cursor. So every cursor commit that knows
which lock planned its batch is one etcd transaction comparing the lock key too
(`MetadataStore.guarded_put`): the cursor moves only while that lock is held by the query
or by nobody (a query that ended released it before its last batch's progress was handled),
never while another query holds it.

Which lock planned a batch travels with the batch's end offset (`LockToken`, the `lock` field
of `SourceOffset`), so each committing path (the stream, the progress listener, a
`foreachBatch` sink reading Spark's offsets log) can compare without talking to the source's
process. A restarted query replays its last batch with the offset its previous run planned,
i.e. the previous run's lease: the new holder *adopts* such a token when Spark hands it that
offset (`partitions`, `commit`). Only this query's checkpoint can hand it an offset carrying
the token, so an adopted token is this query's own past, never another query's.

The lock key's value: `{"host", "pid", "since", "lease": "<hex>", "adopted": ["<hex>", ...]}`.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass

from danube_core.errors import DanubeError, MetadataError, SubscriptionBusyError, SubscriptionLockLostError
from danube_core.keys import subscription_lock_key
from danube_core.metadata import Lease, MetadataStore
from danube_core.records import dump_json, load_json

logger = logging.getLogger(__name__)

LOCK_TTL_S = 10
LOCK_GRACE_S = 2
_LOCK_POLL_S = 0.25
_ADOPTED_KEPT = 8  # tokens of earlier runs a holder accepts (one is needed per restart)


@dataclass(frozen=True)
class LockToken:
    """Which lock planned a batch: the lock key and the hex id of the lease that held it."""

    key: str
    lease: str

    def to_json_dict(self) -> dict[str, str]:
        return {"key": self.key, "lease": self.lease}

    @classmethod
    def from_json_dict(cls, value: object) -> LockToken | None:
        """None for offsets written without a lock (older checkpoints, batch reads)."""
        if value is None:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("key"), str) or not isinstance(value.get("lease"), str):
            raise ValueError(f"danube source offset: bad 'lock' {value!r} (expected {{'key': str, 'lease': str}})")
        return cls(value["key"], value["lease"])


def release_after_stop(metadata: MetadataStore, token: LockToken) -> None:
    """Release the lock `token` names, from the driver, once its query has stopped.

    The lock is held by the stream's source process, which Spark ends with SIGTERM when the
    query stops (its handler releases the lock) or which sees its connection close (its
    `stop()` releases it). A source process that ends any other way while the JVM shuts down
    leaves the lease to expire, and a restart then waits up to a lease TTL; revoking the token's
    own lease here (never an adopted one) makes the release independent of how that process
    ends. The query has stopped, so nothing of it relies on the lock any more; a lease already
    gone is fine."""
    metadata.revoke_lease(int(token.lease, 16))


def holder_accepts(raw: bytes | None, token: LockToken) -> bool:
    """Whether the lock value `raw` says `token`'s lease (or a run it adopted) holds the lock."""
    if raw is None:
        return False
    try:
        value = load_json(raw, token.key)
    except MetadataError:
        return False
    if not isinstance(value, dict):
        return False
    return value.get("lease") == token.lease or token.lease in (value.get("adopted") or [])


def describe_holder(raw: bytes | None) -> str:
    return raw.decode(errors="replace") if raw is not None else "nobody"


def lock_lost(subscription: str, token: LockToken, raw: bytes | None, what: str) -> SubscriptionLockLostError:
    """The error a query stops with when its lock is no longer its own."""
    return SubscriptionLockLostError(
        f"subscription {subscription!r}: lost the subscription lock {token.key!r} (this query's etcd lease "
        f"{token.lease} no longer holds it; it is held by {describe_holder(raw)}). Another query may "
        f"consume the subscription now, so this query stops and {what}. Restart it once no other query "
        "uses the subscription, or give it its own subscription"
    )


class SubscriptionLock:
    """The etcd lease that makes a query the only live consumer of its subscription."""

    def __init__(self, metadata: MetadataStore, root_prefix: str, subscription: str) -> None:
        self.key = subscription_lock_key(root_prefix, subscription)
        self.subscription = subscription
        self.lost: DanubeError | None = None
        self._metadata = metadata
        # A query restarted right after a stop may find its predecessor's lock: Spark stops the
        # old source process asynchronously, and a killed one leaves its lease to expire. So the
        # lock is awaited for one lease TTL before a second live query is refused.
        deadline = time.monotonic() + LOCK_TTL_S + LOCK_GRACE_S
        while (taken := self._try_take()) is None:
            if time.monotonic() >= deadline:
                current = metadata.get(self.key)
                raise SubscriptionBusyError(
                    f"subscription {subscription!r} is already consumed by a live query (etcd key "
                    f"{self.key!r} held by {current.decode() if current else 'a query that just ended'} "
                    f"for more than {LOCK_TTL_S + LOCK_GRACE_S}s); stop that query or use another "
                    "subscription"
                )
            time.sleep(_LOCK_POLL_S)
        self._lease, self._value = taken
        self.token = LockToken(self.key, f"{self._lease.id:x}")
        self._keep_alive = self._lease.keep_alive(on_lost=self._on_lost)
        logger.info("holding subscription lock %s (lease %x)", self.key, self._lease.id)

    def _try_take(self) -> tuple[Lease, bytes] | None:
        if self._metadata.get(self.key) is not None:
            return None
        lease = self._metadata.grant_lease(LOCK_TTL_S)
        value = dump_json({"host": socket.gethostname(), "pid": os.getpid(), "since": int(time.time()),
                           "lease": f"{lease.id:x}", "adopted": []})
        if self._metadata.put_if_absent(self.key, value, lease=lease):
            return lease, value
        lease.revoke()
        return None

    def _on_lost(self, error: DanubeError) -> None:
        self.lost = error

    def check(self) -> None:
        """Raise if the lease was lost (another query may now own the subscription)."""
        if self.lost is not None:
            raise lock_lost(self.subscription, self.token, self._metadata.get(self.key),
                            f"moves no cursor further ({self.lost})") from self.lost

    def adopt(self, token: LockToken | None) -> None:
        """Accept `token` (an earlier run of this query, found in an offset Spark replays) as
        this holder's own, so that run's batches can still commit their cursors."""
        if token is None or token == self.token or token.key != self.key:
            return
        value = load_json(self._value, self.key)
        adopted = list(value.get("adopted") or [])
        if token.lease in adopted:
            return
        value["adopted"] = (adopted + [token.lease])[-_ADOPTED_KEPT:]
        new = dump_json(value)
        if self._metadata.guarded_put(self.key, self._value, new, guard=(self.key, self._value),
                                      lease=self._lease) is None:
            raise lock_lost(self.subscription, self.token, self._metadata.get(self.key),
                            "replays no batch of its earlier run")
        self._value = new
        logger.info("subscription lock %s: adopted lease %s of this query's earlier run", self.key, token.lease)

    def value_if_holding(self, token: LockToken | None) -> bytes | None:
        """The lock key's value as this holder last wrote it, if `token` is this holder's own
        or one it adopted, else None. This process is the key's only writer while its lease
        lives, so a commit compares against this without reading etcd (if the lease was lost
        meanwhile, the transaction's comparison fails and the commit finds out)."""
        if token is None or token.key != self.key or not holder_accepts(self._value, token):
            return None
        return self._value

    def release(self) -> None:
        self._lease.release(self._keep_alive, f"subscription lock {self.key}")
