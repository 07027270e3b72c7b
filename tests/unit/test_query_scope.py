"""`QueryScope`: a stream's cache holds its own topics' keys, from the query's position to the
head, whatever else etcd holds (on the in-memory store; the real-etcd stream tests are in
tests/integration/test_stream_metadata_cache.py)."""

from __future__ import annotations

import pytest

from connectors.options import parse_options
from connectors.query_scope import WINDOW_DESCRIPTORS, QueryScope
from danube_core import keys
from danube_core.metadata import MetadataStore
from danube_core.metadata_memory import MemoryMetadataStore
from danube_core.records import CurPointer
from danube_core.topics import TopicName
from tests.rig import CountingStore, eventually

pytestmark = pytest.mark.unit

STORAGE = keys.StorageKeys()
PER_DESCRIPTOR = 10  # offsets per descriptor


def put_topic(store: MemoryMetadataStore, topic: str, descriptors: int, broker: int = 7) -> None:
    name = TopicName.parse(topic)
    store.put(keys.namespace_topic_key(name), b"null")
    for k in range(descriptors):
        store.put(STORAGE.object_key(name, k * PER_DESCRIPTOR), b"{}")
    store.put(STORAGE.cur_key(name), CurPointer.for_offset((descriptors - 1) * PER_DESCRIPTOR).to_json())
    store.put(keys.assignment_key(broker, name), b"null")
    store.put(keys.subscription_key(name, "s"), b"{}")


def scope_of(store: MetadataStore, topic: str, **extra: str) -> QueryScope:
    options = parse_options({"etcd.endpoints": "127.0.0.1:1", "storage.url": "memory://scope", "topic": topic,
                             "subscription": "s", **extra})
    return QueryScope(store, options, name="test").start()


def descriptor_keys(scope: QueryScope, topic: str) -> list[int]:
    prefix = STORAGE.objects_prefix(TopicName.parse(topic))
    return [o for k in scope.cache._keys if k.startswith(prefix) and (o := keys.parse_object_key(k)) is not None]


def covering_start(topic: str, offset: int) -> int:
    return offset // PER_DESCRIPTOR * PER_DESCRIPTOR


def test_holds_its_topics_head_and_keys_and_nothing_of_the_others():
    with MemoryMetadataStore() as store:
        put_topic(store, "/default/mine", 50)
        for i in range(20):
            put_topic(store, f"/default/other-{i}", 50, broker=8)
        scope = scope_of(store, "/default/mine")
        try:
            scope.follow(["/default/mine"])
            held = scope.cache._keys
            assert all("other-" not in k for k in held), [k for k in held if "other-" in k]
            assert descriptor_keys(scope, "/default/mine") == [490]  # the head only
            assert keys.assignment_key(7, TopicName.parse("/default/mine")) in held
            assert scope.cache.covers(*_range(keys.subscriptions_prefix(TopicName.parse("/default/mine"))))
        finally:
            scope.close()


def test_the_window_reaches_down_to_the_query_and_moves_up_behind_it():
    with MemoryMetadataStore() as store:
        topic = "/default/window"
        put_topic(store, topic, 100)
        scope = scope_of(store, topic, walRoot="none")
        try:
            scope.follow([topic])
            scope.reach(topic, 955, covering_start)
            assert descriptor_keys(scope, topic) == list(range(950, 1000, 10))
            scope.advance({topic: 981})  # keeps the descriptor holding 980 (a lag read's)
            assert descriptor_keys(scope, topic) == [980, 990]
            scope.advance({topic: 2000})  # never above `cur`
            assert descriptor_keys(scope, topic) == [990]
        finally:
            scope.close()


def test_a_backlog_longer_than_the_window_is_not_cached_and_asked_about_once():
    with MemoryMetadataStore() as store:
        topic = "/default/long"
        put_topic(store, topic, WINDOW_DESCRIPTORS + 10)
        counted = CountingStore(store)
        scope = scope_of(counted, topic, walRoot="none")  # type: ignore[arg-type]
        try:
            scope.follow([topic])
            scope.reach(topic, 0, covering_start)
            assert descriptor_keys(scope, topic) == [(WINDOW_DESCRIPTORS + 9) * PER_DESCRIPTOR]
            asked = counted.calls.get("get_range", 0)
            for offset in (10, 500, 4000):  # later triggers, the query catching up
                scope.reach(topic, offset, covering_start)
            assert counted.calls.get("get_range", 0) == asked == 1
        finally:
            scope.close()


def test_a_run_restarting_below_the_floor_is_cached_again():
    with MemoryMetadataStore() as store:
        topic = "/default/restarted"
        name = TopicName.parse(topic)
        put_topic(store, topic, 10)
        scope = scope_of(store, topic, walRoot="none")
        try:
            scope.follow([topic])
            revision = store.put(STORAGE.cur_key(name), CurPointer.for_offset(0).to_json())  # the new run's
            scope.cache.wait_for_revision(revision, 10)
            scope.lower_to_restart()
            assert descriptor_keys(scope, topic) == list(range(0, 100, 10))
        finally:
            scope.close()


def test_a_topic_created_later_is_held_once_followed():
    with MemoryMetadataStore() as store:
        scope = scope_of(store, "/default/later")
        try:
            put_topic(store, "/default/later-part-0", 3)
            index = keys.namespace_topic_key(TopicName.parse("/default/later"))
            eventually(lambda: scope.cache.get_prefix(index) != [], deadline_s=10)
            scope.follow(["/default/later-part-0"])
            assert descriptor_keys(scope, "/default/later-part-0") == [20]
        finally:
            scope.close()


def _range(prefix: str) -> tuple[str, str]:
    from danube_core.metadata import prefix_end

    return prefix, prefix_end(prefix)
