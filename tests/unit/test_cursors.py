"""Subscription cursors: JSON-number values, monotonic acks, flush every N acks or T seconds."""

from __future__ import annotations

import pytest

from broker.cursors import SubscriptionCursor
from danube_core.errors import MetadataError
from danube_core.metadata_memory import MemoryMetadataStore

TOPIC = "/default/orders"
KEY = "/topics/default/orders/subscriptions/subs_reliable/cursor"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def metadata():
    store = MemoryMetadataStore()
    yield store
    store.close()


def cursor(metadata, clock=None, **kw) -> SubscriptionCursor:
    return SubscriptionCursor(metadata, TOPIC, "subs_reliable", clock=clock or Clock(), **kw)


def test_cursor_key_and_value_are_a_bare_json_number(metadata):
    c = cursor(metadata)
    assert c.key == KEY
    c.ack(13)
    c.flush()
    assert metadata.get(KEY) == b"13"


def test_load_reads_the_cursor_and_resume_is_one_past_it(metadata):
    metadata.put(KEY, b"13")
    c = cursor(metadata)
    assert c.load() == 13
    assert c.resume_offset() == 14


def test_without_a_cursor_resume_is_latest(metadata):
    c = cursor(metadata)
    assert c.load() is None
    assert c.resume_offset() is None


def test_flushes_every_n_acks(metadata):
    c = cursor(metadata, flush_every_acks=3, flush_interval_s=3600)
    c.ack(0)
    c.ack(1)
    assert metadata.get(KEY) is None
    c.ack(2)
    assert metadata.get(KEY) == b"2"
    c.ack(3)
    c.ack(4)
    assert metadata.get(KEY) == b"2"


def test_flushes_when_the_interval_has_passed_at_the_next_ack(metadata):
    clock = Clock()
    c = cursor(metadata, clock, flush_every_acks=1000, flush_interval_s=5.0)
    c.ack(0)
    clock.now += 4.9
    c.ack(1)
    assert metadata.get(KEY) is None
    clock.now += 0.1
    assert metadata.get(KEY) is None  # no background timer: only an ack (or flush) writes
    c.ack(2)
    assert metadata.get(KEY) == b"2"


def test_seed_defaults_are_1000_acks_or_5_seconds(metadata):
    clock = Clock()
    c = cursor(metadata, clock)
    for offset in range(999):
        c.ack(offset)
    assert metadata.get(KEY) is None
    c.ack(999)
    assert metadata.get(KEY) == b"999"
    clock.now += 5.0
    c.ack(1000)
    assert metadata.get(KEY) == b"1000"


def test_acks_never_move_the_cursor_backwards(metadata):
    metadata.put(KEY, b"20")
    c = cursor(metadata, flush_every_acks=1)
    c.load()
    c.ack(15)
    c.ack(20)
    c.flush()
    assert metadata.get(KEY) == b"20"
    c.ack(21)
    assert metadata.get(KEY) == b"21"
    assert c.acked_offset == 21


def test_load_does_not_undo_newer_local_acks(metadata):
    c = cursor(metadata, flush_every_acks=1000, flush_interval_s=3600)
    c.ack(30)
    metadata.put(KEY, b"10")
    assert c.load() == 10
    assert c.resume_offset() == 31


def test_flush_without_new_acks_writes_nothing(metadata):
    c = cursor(metadata)
    c.flush()
    assert metadata.get(KEY) is None


def test_a_failed_flush_is_retried_at_the_next_ack(metadata):
    class FailOnce:
        def __init__(self, inner):
            self.inner, self.fail = inner, True

        def put(self, key, value, lease=None):
            if self.fail:
                self.fail = False
                raise MetadataError("injected")
            self.inner.put(key, value)

    c = SubscriptionCursor(FailOnce(metadata), TOPIC, "subs_reliable", flush_every_acks=1, clock=Clock())
    with pytest.raises(MetadataError):
        c.ack(5)
    c.ack(6)
    assert metadata.get(KEY) == b"6"


def test_bad_settings_are_rejected(metadata):
    with pytest.raises(ValueError, match="flush_every_acks"):
        cursor(metadata, flush_every_acks=0)
    with pytest.raises(ValueError, match="ack offset"):
        cursor(metadata).ack(-1)


def test_record_never_writes_and_says_when_a_flush_is_due(metadata):
    c = cursor(metadata, flush_every_acks=3)
    assert [c.record(n) for n in (1, 2)] == [False, False]
    assert c.record(2) is False  # not newer: ignored, not counted
    assert c.record(3) is True and metadata.get(KEY) is None  # due, but only flush() writes
    c.flush()
    assert metadata.get(KEY) == b"3" and c.resume_offset() == 4
