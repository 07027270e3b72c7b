"""The subscription lock guards cursor commits: a query that lost its lock moves no cursor."""

from __future__ import annotations

import pytest

from connectors.cursor_commit import CursorWriter, commit_cursors
from connectors.offsets import SourceOffset
from connectors.subscription_lock import LockToken, SubscriptionLock, holder_accepts, release_after_stop
from danube_core.errors import SubscriptionLockLostError
from danube_core.keys import cursor_key
from danube_core.metadata_memory import MemoryMetadataStore

ROOT, SUB, TOPIC = "/danube-data", "orders-sub", "/default/orders"
CURSOR = cursor_key(TOPIC, SUB)


@pytest.fixture
def metadata():
    store = MemoryMetadataStore()
    yield store
    store.close()


def take(metadata) -> SubscriptionLock:
    return SubscriptionLock(metadata, ROOT, SUB)


def revoke(lock: SubscriptionLock) -> None:
    lock._keep_alive.stop()
    lock._lease.revoke()  # what an operator's `etcdctl lease revoke` or an expiry does


def test_a_commit_under_the_held_lock_moves_the_cursor(metadata) -> None:
    lock = take(metadata)
    assert CursorWriter(metadata, SUB).commit({TOPIC: 10}, lock.token) == {TOPIC: 9}
    assert metadata.get(CURSOR) == b"9"
    lock.release()


def test_a_commit_after_the_lease_was_lost_to_another_query_moves_nothing_and_names_it(metadata) -> None:
    lock = take(metadata)
    writer = CursorWriter(metadata, SUB)
    writer.commit({TOPIC: 10}, lock.token)
    revoke(lock)
    other = take(metadata)
    with pytest.raises(SubscriptionLockLostError, match=r"subscription 'orders-sub': lost the subscription lock.*"
                       rf"held by .*{other.token.lease}.*Another query may consume the subscription now"):
        writer.commit({TOPIC: 20}, lock.token)
    assert metadata.get(CURSOR) == b"9"
    other.release()


def test_a_lock_nobody_holds_lets_the_last_batch_commit(metadata) -> None:
    """The query ended and released its lock before the progress listener committed its last
    batch (Spark posts progress asynchronously): the cursor still moves over what it wrote."""
    lock = take(metadata)
    writer = CursorWriter(metadata, SUB)
    lock.release()
    assert writer.commit({TOPIC: 12}, lock.token) == {TOPIC: 11}


def test_another_querys_cursor_is_never_overwritten(metadata) -> None:
    """The lease is lost, another query takes the subscription and commits a lower cursor (it
    started elsewhere): the first query's late commit must not move that cursor."""
    first = take(metadata)
    revoke(first)
    second = take(metadata)
    CursorWriter(metadata, SUB).commit({TOPIC: 5}, second.token)
    with pytest.raises(SubscriptionLockLostError, match=f"held by .*{second.token.lease}"):
        commit_cursors({"etcd.endpoints": "127.0.0.1:1", "subscription": SUB, "storage.url": "file:///x", "topic": TOPIC},
                       SourceOffset({TOPIC: 50}, SUB, lock=first.token), metadata=metadata)
    assert metadata.get(CURSOR) == b"4"
    second.release()


def test_a_lock_change_between_reading_the_cursor_and_writing_it_is_caught(metadata) -> None:
    """The guard read passes, then another query takes the lock before the transaction: the
    transaction's own comparison of the lock key refuses the write."""
    lock = take(metadata)
    writer = CursorWriter(metadata, SUB)
    guard = writer._guard(lock.token)
    revoke(lock)
    other = take(metadata)
    with pytest.raises(SubscriptionLockLostError):
        writer._advance(TOPIC, 30, lock.token, guard)
    assert metadata.get(CURSOR) is None
    other.release()


def test_a_restarted_query_adopts_its_earlier_runs_lock_for_replayed_batches(metadata) -> None:
    earlier = take(metadata)
    revoke(earlier)  # the earlier run was killed; its lease expired
    restarted = take(metadata)
    writer = CursorWriter(metadata, SUB)
    with pytest.raises(SubscriptionLockLostError):
        writer.commit({TOPIC: 7}, earlier.token)
    restarted.adopt(earlier.token)  # Spark replays the batch the earlier run planned
    assert writer.commit({TOPIC: 7}, earlier.token) == {TOPIC: 6}
    assert holder_accepts(metadata.get(restarted.key), restarted.token)
    restarted.adopt(earlier.token)  # idempotent
    restarted.release()
    assert metadata.get(restarted.key) is None


def test_adopting_after_the_lease_was_lost_refuses(metadata) -> None:
    earlier = take(metadata)
    revoke(earlier)
    restarted = take(metadata)
    revoke(restarted)
    with pytest.raises(SubscriptionLockLostError, match="replays no batch"):
        restarted.adopt(earlier.token)


def test_a_commit_without_a_lock_is_unconditional(metadata) -> None:
    """Bare positions (a user's foreachBatch with `end_offsets_of`) commit as before."""
    assert CursorWriter(metadata, SUB).commit({TOPIC: 3}) == {TOPIC: 2}


def test_the_lock_travels_in_the_offset_json() -> None:
    token = LockToken(f"{ROOT}/connectors/subscriptions/{SUB}/lock", "1a2b")
    offset = SourceOffset({TOPIC: 4}, SUB, "127.0.0.1:2379", lock=token)
    assert SourceOffset.from_json_dict(offset.to_json_dict()) == offset
    assert SourceOffset.from_json_dict({"offsets": {TOPIC: 4}}).lock is None
    with pytest.raises(ValueError, match="bad 'lock'"):
        SourceOffset.from_json_dict({"offsets": {TOPIC: 4}, "lock": "1a2b"})


def test_guarded_put_compares_both_keys(metadata) -> None:
    metadata.put("/g", b"held")
    assert metadata.guarded_put("/k", None, b"1", guard=("/g", b"other")) is None
    assert metadata.get("/k") is None
    assert metadata.guarded_put("/k", None, b"1", guard=("/g", b"held")) is not None
    assert metadata.guarded_put("/k", b"0", b"2", guard=("/g", b"held")) is None
    assert metadata.get("/k") == b"1"


def test_the_holder_commits_with_the_value_it_wrote_and_still_finds_a_lost_lease(metadata) -> None:
    lock = take(metadata)
    writer = CursorWriter(metadata, SUB)
    guard = lock.value_if_holding(lock.token)
    assert guard == metadata.get(lock.key)
    assert writer.commit({TOPIC: 4}, lock.token, guard=guard) == {TOPIC: 3}
    assert lock.value_if_holding(LockToken(lock.key, "ffff")) is None
    revoke(lock)
    other = take(metadata)
    with pytest.raises(SubscriptionLockLostError):
        writer.commit({TOPIC: 8}, lock.token, guard=guard)
    assert metadata.get(CURSOR) == b"3"
    other.release()


def test_the_driver_releases_a_stopped_querys_lock_by_its_token(metadata) -> None:
    """A source process that ended without releasing leaves the key until its lease expires;
    the driver revokes the token's lease after the query stopped, and again is harmless."""
    lock = take(metadata)
    lock._keep_alive.stop()  # the source process is gone, its lease not yet expired
    assert metadata.get(lock.key) is not None
    release_after_stop(metadata, lock.token)
    assert metadata.get(lock.key) is None
    release_after_stop(metadata, lock.token)
    assert take(metadata).token != lock.token  # the subscription is free at once
