"""The metadata store contract, written once and run against the in-memory store and real etcd.

Every test works under its own key prefix, so tests never see each other's keys.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from danube_core.embedded_etcd import EXTRA_FLAGS_ENV, EmbeddedEtcd
from danube_core.errors import ConfigError, MetadataError, MetadataUnavailableError
from danube_core.keys import padded_offset
from danube_core.metadata import MetadataStore, WatchEvent
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.metadata_memory import MemoryMetadataStore
from danube_core.ports import free_port
from danube_core.records import dump_json, load_json
from tests.rig import eventually

U64_MAX = (1 << 64) - 1


class MetadataStoreContract:
    """Subclasses provide the `store` fixture; every test here must hold for each backend."""

    @pytest.fixture
    def prefix(self, unique_name) -> str:
        return f"/contract/{unique_name('md')}/"

    def test_get_put_delete(self, store: MetadataStore, prefix: str):
        key = prefix + "k"
        assert store.get(key) is None
        store.put(key, b"one")
        assert store.get(key) == b"one"
        store.put(key, b"two")
        assert store.get(key) == b"two"
        assert store.delete(key) is True
        assert store.get(key) is None
        assert store.delete(key) is False

    def test_values_must_be_bytes(self, store: MetadataStore, prefix: str):
        with pytest.raises(TypeError, match="must be bytes"):
            store.put(prefix + "k", "text")  # type: ignore[arg-type]

    def test_prefix_read_is_sorted_and_exact(self, store: MetadataStore, prefix: str):
        for name in ("b", "a/2", "c", "a/1"):
            store.put(prefix + "objects/" + name, name.encode())
        store.put(prefix + "objectsX", b"sibling outside the prefix")
        found = store.get_prefix(prefix + "objects/")
        assert found == [(prefix + "objects/" + n, n.encode()) for n in ("a/1", "a/2", "b", "c")]
        keys_only = store.get_prefix(prefix + "objects/", keys_only=True)
        assert keys_only == [(k, b"") for k, _ in found]
        assert store.get_prefix(prefix + "nothing/") == []

    def test_delete_prefix_counts_and_spares_other_keys(self, store: MetadataStore, prefix: str):
        for n in range(3):
            store.put(f"{prefix}gone/{n}", b"x")
        store.put(prefix + "kept", b"y")
        assert store.delete_prefix(prefix + "gone/") == 3
        assert store.get_prefix(prefix) == [(prefix + "kept", b"y")]
        with pytest.raises(ValueError, match="empty"):
            store.delete_prefix("")

    def test_range_read_from_padded_start_key_with_limit(self, store: MetadataStore, prefix: str):
        objects = prefix + "objects/"
        for start in (0, 100, 200, 300, 10**12):
            store.put(objects + padded_offset(start), dump_json({"start_offset": start}))
        store.put(objects + "cur", dump_json({"start": padded_offset(300)}))
        tail = store.get_range(objects + padded_offset(100), objects + "cur", limit=2)
        assert [k.rsplit("/", 1)[1] for k, _ in tail] == [padded_offset(100), padded_offset(200)]
        # half-open: the end key itself is excluded; no limit returns everything in range
        middle = store.get_range(objects + padded_offset(150), objects + padded_offset(300))
        assert [load_json(v, k)["start_offset"] for k, v in middle] == [200]
        all_from_start = store.get_range(objects + padded_offset(101), objects + "cur")
        assert [load_json(v, k)["start_offset"] for k, v in all_from_start] == [200, 300, 10**12]
        with pytest.raises(ValueError, match="limit"):
            store.get_range(objects, objects + "cur", limit=0)

    def test_reads_larger_than_etcds_4_mib_response_cap_come_back_whole(self, store: MetadataStore, prefix: str):
        # 2,500 values of 2 KiB = 5 MiB: one etcd response would be refused (RESOURCE_EXHAUSTED)
        value = b"x" * 2048
        for n in range(2500):
            store.put(prefix + padded_offset(n), value)
        everything = store.get_prefix(prefix)
        assert [k for k, _ in everything] == [prefix + padded_offset(n) for n in range(2500)]
        assert all(v == value for _, v in everything)
        ranged = store.get_range(prefix + padded_offset(700), prefix + padded_offset(2400), limit=1500)
        assert [k for k, _ in ranged] == [prefix + padded_offset(n) for n in range(700, 2200)]

    def test_put_if_absent_has_exactly_one_winner_under_a_race(self, store: MetadataStore, prefix: str):
        key = prefix + "leader"
        contenders = 8
        barrier = threading.Barrier(contenders)
        results: dict[int, bool] = {}

        def contend(i: int) -> None:
            barrier.wait()
            results[i] = store.put_if_absent(key, str(i).encode())

        threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        winners = [i for i, won in results.items() if won]
        assert len(results) == contenders and len(winners) == 1
        assert store.get(key) == str(winners[0]).encode()
        assert store.put_if_absent(key, b"late") is False

    def test_compare_and_put(self, store: MetadataStore, prefix: str):
        key = prefix + "cursor"
        assert store.compare_and_put(key, None, b"1") is True
        assert store.compare_and_put(key, None, b"x") is False
        assert store.compare_and_put(key, b"0", b"x") is False
        assert store.get(key) == b"1"
        assert store.compare_and_put(key, b"1", b"2") is True
        assert store.get(key) == b"2"
        assert store.compare_and_put(prefix + "missing", b"1", b"x") is False
        assert store.get(prefix + "missing") is None

    def test_guarded_put_writes_only_while_the_guard_key_holds_its_value(self, store: MetadataStore, prefix: str):
        guard, key = prefix + "lock", prefix + "cursor"
        lease = store.grant_lease(5)
        store.put(guard, b"mine", lease=lease)
        assert store.guarded_put(key, None, b"1", guard=(guard, b"theirs")) is None
        assert store.guarded_put(key, None, b"1", guard=(guard, b"mine")) is not None
        assert store.guarded_put(key, b"0", b"2", guard=(guard, b"mine")) is None
        assert store.guarded_put(guard, b"mine", b"mine+", guard=(guard, b"mine"), lease=lease) is not None
        lease.revoke()  # the guard went with its lease: nothing passes any more
        assert store.get(guard) is None
        assert store.guarded_put(key, b"1", b"2", guard=(guard, b"mine+")) is None
        assert store.get(key) == b"1"
        assert store.guarded_put(key, b"1", b"2", guard=(guard, None)) is not None  # None: absent
        store.put(guard, b"theirs")
        assert store.guarded_put(key, b"2", b"3", guard=(guard, None)) is None
        assert store.get(key) == b"2"

    def test_writes_return_their_revision_and_range_at_reads_at_one(self, store: MetadataStore, prefix: str):
        first = store.put(prefix + "a", b"1")
        second = store.put(prefix + "a", b"2")
        assert second > first and store.current_revision() >= second
        swapped = store.compare_and_put_revision(prefix + "a", b"2", b"3")
        assert swapped is not None and swapped > second
        assert store.compare_and_put_revision(prefix + "a", b"2", b"x") is None
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        assert store.range_at(prefix, end, first).kvs == [(prefix + "a", b"1")]
        now = store.range_at(prefix, end)
        assert now.kvs == [(prefix + "a", b"3")] and now.revision >= swapped

    def test_watch_from_a_revision_replays_what_followed_it(self, store: MetadataStore, prefix: str):
        first = store.put(prefix + "a", b"1")
        store.put(prefix + "b", b"2")
        store.delete(prefix + "a")
        events: list[WatchEvent] = []
        handle = store.watch_prefix(prefix, events.append, start_revision=first + 1, on_lost=lambda e: None)
        last = store.put(prefix + "c", b"3")
        eventually(lambda: len(events) == 3, deadline_s=10)
        assert [(e.kind, e.key) for e in events] == [("put", prefix + "b"), ("delete", prefix + "a"),
                                                      ("put", prefix + "c")]
        assert events[-1].revision == last and events[0].revision > first
        handle.cancel()

    def test_exact_u64_json_bytes_round_trip(self, store: MetadataStore, prefix: str):
        sealed = {
            "broker_id": U64_MAX, "last_committed_offset": 2**53 + 1, "sealed": True, "timestamp": 1700000100
        }
        value = dump_json(sealed)
        key = prefix + "state"
        store.put(key, value)
        raw = store.get(key)
        assert raw == (
            b'{"broker_id":18446744073709551615,"last_committed_offset":9007199254740993,'
            b'"sealed":true,"timestamp":1700000100}'
        )
        assert load_json(raw, key)["broker_id"] == U64_MAX
        assert store.get_prefix(prefix) == [(key, value)]

    def test_non_ascii_keys_round_trip(self, store: MetadataStore, prefix: str):
        key = prefix + "topics/ns/zürich-part-0"
        store.put(key, b"null")
        assert store.get_prefix(prefix + "topics/") == [(key, b"null")]

    def test_lease_expiry_deletes_keys_and_notifies_watchers(self, store: MetadataStore, prefix: str):
        events: list[WatchEvent] = []
        handle = store.watch_prefix(prefix, events.append)
        lease = store.grant_lease(1)
        assert lease.ttl_s >= 1
        key = prefix + "register/1"
        store.put(key, b"{}", lease=lease)
        assert store.get(key) == b"{}"
        eventually(lambda: store.get(key) is None, deadline_s=15)
        eventually(lambda: WatchEvent("delete", key, None) in events, deadline_s=5)
        with pytest.raises(MetadataError, match="expired"):
            lease.refresh()
        with pytest.raises(MetadataError):
            store.put(prefix + "late", b"x", lease=lease)
        handle.cancel()

    def test_keep_alive_outlives_the_ttl(self, store: MetadataStore, prefix: str):
        kept, dropped = store.grant_lease(1), store.grant_lease(1)
        keep_alive = kept.keep_alive(interval_s=0.3)
        store.put(prefix + "kept", b"k", lease=kept)
        store.put(prefix + "dropped", b"d", lease=dropped)
        eventually(lambda: store.get(prefix + "dropped") is None, deadline_s=15)
        assert store.get(prefix + "kept") == b"k"
        assert keep_alive.alive
        keep_alive.stop()
        assert not keep_alive.alive
        kept.revoke()
        assert store.get(prefix + "kept") is None
        kept.revoke()  # revoking again is harmless

    def test_compare_and_put_with_writes_the_companion_keys_only_with_the_swap(self, store: MetadataStore,
                                                                               prefix: str):
        record, plan = prefix + "record", prefix + "plan"
        assert store.compare_and_put_with(record, None, b"v1", [(plan, b"p1")])
        assert (store.get(record), store.get(plan)) == (b"v1", b"p1")
        assert store.compare_and_put_with(record, b"v1", b"v2", [(plan, b"p2"), (prefix + "other", b"o")])
        assert (store.get(record), store.get(plan), store.get(prefix + "other")) == (b"v2", b"p2", b"o")
        assert not store.compare_and_put_with(record, b"v1", b"v3", [(plan, b"p3")])  # stale: nothing written
        assert not store.compare_and_put_with(record, None, b"v3", [(plan, b"p3")])  # exists
        assert (store.get(record), store.get(plan)) == (b"v2", b"p2")

    def test_refresh_leases_refreshes_many_and_names_the_expired(self, store: MetadataStore, prefix: str):
        kept, gone, control = [store.grant_lease(2) for _ in range(3)], store.grant_lease(30), store.grant_lease(2)
        for index, lease in enumerate(kept):
            store.put(f"{prefix}kept{index}", b"k", lease=lease)
        store.put(prefix + "control", b"c", lease=control)  # same TTL, never refreshed
        gone.revoke()
        assert store.refresh_leases([]) == []

        def control_expired() -> bool:
            assert [lease.id for lease in store.refresh_leases([*kept, gone])] == [gone.id]
            return store.get(prefix + "control") is None

        eventually(control_expired, deadline_s=15, interval_s=0.3)
        assert all(store.get(f"{prefix}kept{index}") == b"k" for index in range(len(kept)))
        for lease in kept:
            lease.revoke()

    def test_a_lease_is_revoked_by_its_id_alone(self, store: MetadataStore, prefix: str):
        lease = store.grant_lease(30)  # granted by "another process": only its id is known here
        store.put(prefix + "locked", b"l", lease=lease)
        store.revoke_lease(lease.id)
        assert store.get(prefix + "locked") is None
        store.revoke_lease(lease.id)  # already gone: harmless

    def test_keep_alive_reports_a_lost_lease(self, store: MetadataStore, prefix: str):
        lease = store.grant_lease(5)
        lost: list[Exception] = []
        keep_alive = lease.keep_alive(interval_s=0.1, on_lost=lost.append)
        lease.revoke()
        eventually(lambda: len(lost) == 1, deadline_s=10)
        assert isinstance(lost[0], MetadataError) and not lost[0].retriable
        eventually(lambda: not keep_alive.alive, deadline_s=5)

    def test_watch_reports_puts_and_deletes_in_order_until_cancelled(self, store: MetadataStore, prefix):
        events: list[WatchEvent] = []
        handle = store.watch_prefix(prefix + "brokers/", events.append)
        store.put(prefix + "brokers/1/ns/a", b"null")
        store.put(prefix + "other", b"not watched")
        store.put(prefix + "brokers/1/ns/a", b"again")
        store.delete(prefix + "brokers/1/ns/a")
        expected = [
            WatchEvent("put", prefix + "brokers/1/ns/a", b"null"),
            WatchEvent("put", prefix + "brokers/1/ns/a", b"again"),
            WatchEvent("delete", prefix + "brokers/1/ns/a", None),
        ]
        eventually(lambda: events == expected, deadline_s=10)
        handle.cancel()
        witness: list[WatchEvent] = []
        witness_handle = store.watch_prefix(prefix + "brokers/", witness.append)
        store.put(prefix + "brokers/2", b"after cancel")
        eventually(lambda: len(witness) == 1, deadline_s=10)
        assert events == expected
        witness_handle.cancel()

    def test_callbacks_may_use_the_store(self, store: MetadataStore, prefix: str):
        copied: list[bytes | None] = []

        def copy(event: WatchEvent) -> None:
            copied.append(store.get(event.key))
            store.put(prefix + "copy/" + event.key.rsplit("/", 1)[1], event.value or b"")

        handle = store.watch_prefix(prefix + "src/", copy)
        store.put(prefix + "src/a", b"A")
        eventually(lambda: store.get(prefix + "copy/a") == b"A", deadline_s=10)
        assert copied == [b"A"]
        handle.cancel()

    def test_closed_store_refuses_use(self, store: MetadataStore, prefix: str):
        store.close()
        with pytest.raises(MetadataError, match="closed"):
            store.get(prefix + "k")
        store.close()  # closing twice is harmless


class TestMemoryMetadataStore(MetadataStoreContract):
    @pytest.fixture
    def store(self) -> Iterator[MetadataStore]:
        store = MemoryMetadataStore()
        yield store
        store.close()


class TestEtcdMetadataStore(MetadataStoreContract):
    @pytest.fixture
    def store(self, etcd_endpoint: str) -> Iterator[MetadataStore]:
        store = EtcdMetadataStore(etcd_endpoint, timeout_s=5.0)
        yield store
        store.close()

    def test_unreachable_etcd_fails_fast_naming_the_endpoint(self):
        dead = f"127.0.0.1:{free_port()}"
        started = time.monotonic()
        with pytest.raises(MetadataUnavailableError) as raised:
            EtcdMetadataStore(dead, timeout_s=2.0)
        assert time.monotonic() - started < 3.0
        assert dead in str(raised.value) and "connect" in str(raised.value)
        assert raised.value.retriable and raised.value.__cause__ is not None

    def test_fails_over_when_the_current_endpoint_dies(self, etcd_endpoint: str, prefix: str):
        with EmbeddedEtcd() as doomed:
            store = EtcdMetadataStore([doomed.endpoint, etcd_endpoint], timeout_s=2.0)
            store.put(prefix + "k", b"on the first cluster")
            assert store.get(prefix + "k") == b"on the first cluster"
            doomed.stop()
            # The second endpoint is the session's (separate) etcd: the key is absent there,
            # which shows the read was answered by it.
            assert store.get(prefix + "k") is None
            store.put(prefix + "k", b"on the second cluster")
            store.close()
        with EtcdMetadataStore(etcd_endpoint) as check:
            assert check.get(prefix + "k") == b"on the second cluster"

    def test_vanished_etcd_error_names_endpoint_operation_and_key(self, prefix: str):
        with EmbeddedEtcd() as doomed:
            store = EtcdMetadataStore(doomed.endpoint, timeout_s=2.0)
            store.put(prefix + "k", b"v")
            doomed.stop()
            started = time.monotonic()
            with pytest.raises(MetadataUnavailableError) as raised:
                store.get(prefix + "k")
            assert time.monotonic() - started < 8.0  # bounded by the read retry deadline
            message = str(raised.value)
            assert doomed.endpoint in message and "get" in message and prefix + "k" in message
            with pytest.raises(MetadataUnavailableError, match="put"):
                store.put(prefix + "k", b"w")
            store.close()

    @pytest.mark.parametrize("endpoints", ["", "localhost", "ftp://h:1", "h:notaport", "h:70000"])
    def test_malformed_endpoints_are_config_errors(self, endpoints: str):
        with pytest.raises(ConfigError, match="etcd endpoint"):
            EtcdMetadataStore(endpoints)



def _command_line(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def test_every_etcd_takes_the_flags_the_environment_adds(monkeypatch, etcd_server):
    """`DANUBE_ETCD_EXTRA_FLAGS` reaches the server's command line (the suite's own etcd runs
    with `--unsafe-no-fsync` through it), and a flag etcd refuses stops the start at once with
    etcd's words and the variable named, not after the port's 30 s wait."""
    assert "--unsafe-no-fsync" in _command_line(etcd_server.process.pid)
    monkeypatch.setenv(EXTRA_FLAGS_ENV, "--unsafe-no-fsync --snapshot-count 777")
    with EmbeddedEtcd() as added:
        assert _command_line(added.process.pid)[-3:] == ["--unsafe-no-fsync", "--snapshot-count", "777"]
        with EtcdMetadataStore(added.endpoint) as store:
            store.put("/k", b"v")
            assert store.get("/k") == b"v"
    monkeypatch.setenv(EXTRA_FLAGS_ENV, "--no-such-flag")
    started = time.monotonic()
    with pytest.raises(RuntimeError) as refused:
        EmbeddedEtcd()
    assert time.monotonic() - started < 10
    assert "etcd did not start" in str(refused.value) and "no-such-flag" in str(refused.value), refused.value
    assert f"{EXTRA_FLAGS_ENV}: ['--no-such-flag']" in str(refused.value)
