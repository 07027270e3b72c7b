"""Freshness (issue 12): a followed Delta table's new versions become epochs on their own.

A real master process and a real etcd; one worker runs in the test process so that the epoch
its queries see (`WorkerAgent.served`) and the rows behind it can be read from its DuckDB
directly (pinning the served epoch as a query does) while epochs are swapped.
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from speedlayer.clients import delta_request
from speedlayer.errors import NotFoundError
from speedlayer.records import EVICTED, AssignmentRecord, GlobalConfig, TenantConfig
from speedlayer.worker.loader import quote
from tests.rig import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TENANT = "acme"


def append(path: str, start: int, rows: int) -> None:
    from deltalake import write_deltalake

    ids = range(start, start + rows)
    write_deltalake(path, pa.table({"id": pa.array(ids, pa.int64()), "day": [f"d{i % 3}" for i in ids]}),
                    partition_by=["day"], mode="append")


def records(cluster, dataset: str = "orders") -> list[AssignmentRecord]:
    found = cluster.metadata.get_prefix(cluster.keys.dataset_assignments_prefix(TENANT, dataset))
    return sorted((AssignmentRecord.from_json(v, k) for k, v in found), key=lambda r: r.order)


def served_rows(agent, dataset: str = "orders", key: str = "id") -> tuple[str, int, int] | None:
    """(epoch, source version, rows) of what the worker's queries of `dataset` see now; every
    row must be there once (`key` is unique)."""
    try:
        pin = agent.served.pin(dataset)  # as a query does: one epoch, held while it is read
    except NotFoundError:
        return None
    with pin as served:
        count = agent.loader.cursor().execute(
            f"SELECT count(*), count(DISTINCT {quote(key)}) FROM {quote(served.table)}").fetchone()
    assert count[0] == count[1], f"epoch {served.epoch} shows {count[0]} rows, {count[1]} distinct"
    return served.epoch, served.version, count[0]


@pytest.fixture
def followed(cluster_factory, tmp_path):
    """A cluster (one master, one worker in-process) following a 300-row table at version 0."""
    cluster = cluster_factory()
    cluster.set_global(GlobalConfig(reassign_delay_s=1.0, replication_factor=1, refresh_poll_interval_s=30.0,
                                    default_ttl_sec=3600))
    cluster.start_master("m1")
    agent = cluster.start_local_worker(TENANT, "w1")
    path = str(tmp_path / "orders")
    append(path, 0, 300)
    client = cluster.client()
    eventually(lambda: len(client.workers(TENANT).workers) == 1, deadline_s=30)
    reply = client.admit(delta_request(TENANT, "orders", path))
    assert reply.status == "ASSIGNED", reply
    eventually(lambda: served_rows(agent) == (reply.epoch_id, 0, 300), deadline_s=60)
    return cluster, agent, path


def announce(cluster, path: str, version: int) -> None:
    from speedlayer.records import Announcement

    cluster.metadata.put(cluster.keys.announce(TENANT, "orders"), Announcement(path, version, "test").to_json())


def test_appends_become_incremental_epochs_and_the_served_epoch_moves_forward(followed):
    cluster, agent, path = followed
    rows = 300
    for version in range(1, 4):
        append(path, rows, 100)
        rows += 100
        announce(cluster, path, version)
        found = eventually(lambda v=version: (s := served_rows(agent)) and s[1] == v and s, deadline_s=30)
        assert found[2] == rows
        head = eventually(lambda: (r := records(cluster)[-1]) and r.replicas["w1"].state == "READY" and r,
                          deadline_s=10)  # the worker swaps before the master hears it is READY
        assert (head.version, head.kind, head.total_rows, head.replicas["w1"].rows) == (
            version, "incremental", rows, rows)
        assert head.base_epoch == records(cluster)[-2].epoch
    # Three increments share the first epoch's table: four parts (one per load), no copies.
    assert sorted(agent.tables.parts_held().values(), reverse=True)[0] == 4


def test_unannounced_commits_are_found_by_polling(followed):
    cluster, agent, path = followed
    append(path, 300, 50)
    append(path, 350, 50)  # two versions before polling starts: one epoch for the latest
    cluster.set_global(GlobalConfig(reassign_delay_s=1.0, replication_factor=1, refresh_poll_interval_s=0.5,
                                    default_ttl_sec=3600))
    found = eventually(lambda: (s := served_rows(agent)) and s[1] == 2 and s, deadline_s=60)
    assert found[2] == 400
    assert [r.version for r in records(cluster)] == [0, 2]


def test_optimize_is_rebuilt_and_swapped_without_a_wrong_count(followed):
    from deltalake import DeltaTable

    cluster, agent, path = followed
    for version in (1, 2, 3):
        append(path, 200 + 100 * version, 100)
    announce(cluster, path, 3)
    eventually(lambda: (s := served_rows(agent)) and s[1] == 3, deadline_s=30)
    seen: list[tuple[str, int, int]] = []
    stop = threading.Event()

    errors: list[BaseException] = []

    def watch() -> None:
        try:
            while not stop.is_set():
                seen.append(served_rows(agent))
        except BaseException as exc:  # shown by the test, not lost in the thread
            errors.append(exc)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        DeltaTable(path).optimize.compact()
        announce(cluster, path, 4)
        eventually(lambda: (s := served_rows(agent)) and s[1] == 4, deadline_s=60)
        # The watcher samples in a thread of its own: wait until it has seen the swap too.
        eventually(lambda: any(s and s[1] == 4 for s in seen), deadline_s=30)
    finally:
        stop.set()
        watcher.join()
    assert not errors, errors
    rebuilt = records(cluster)[-1]
    assert (rebuilt.kind, rebuilt.base_epoch, rebuilt.total_rows) == ("full", "", 600)
    assert {rows for _, _, rows in seen} == {600}, "a query saw another row count while swapping"
    assert {version for _, version, _ in seen} == {3, 4}
    assert served_rows(agent)[2] == 600


def test_superseded_epochs_are_evicted_by_lru_and_ttl(followed):
    from deltalake import DeltaTable

    cluster, agent, path = followed
    client = cluster.client()
    append(path, 300, 100)
    announce(cluster, path, 1)  # v1: an increment on v0, sharing its table
    eventually(lambda: (s := served_rows(agent)) and s[1] == 1, deadline_s=30)
    DeltaTable(path).optimize.compact()
    announce(cluster, path, 2)  # v2: a rebuild; v0 and v1 are superseded
    eventually(lambda: (s := served_rows(agent)) and s[1] == 2, deadline_s=30)
    eventually(lambda: [r.status for r in records(cluster)] == ["ASSIGNED"] * 3 and records(cluster)[-1].ready_ms,
               deadline_s=10)

    # LRU within the quota: one byte over evicts the least recently served run, v0 with the
    # increment that reads its table (v0 alone would free nothing).
    used = client.quota(TENANT).memory_used_bytes
    served = records(cluster)[-1]
    cluster.set_tenant(TENANT, TenantConfig(memory_quota_bytes=used - 1))
    evicted = eventually(lambda: (e := [r for r in records(cluster) if r.status == EVICTED]) and len(e) >= 2 and e,
                         deadline_s=20)  # one record after the other
    assert [r.version for r in evicted] == [0, 1] and all("lru" in r.message for r in evicted)
    assert records(cluster)[-1].epoch == served.epoch and records(cluster)[-1].status == "ASSIGNED"
    eventually(lambda: set(agent.held) == {("orders", served.epoch)}, deadline_s=20)
    assert list(agent.tables.parts_held().values()) == [1]  # v0's and v1's tables are gone

    # TTL: v3 supersedes v2, which goes once the tenant's TTL has passed; v3 stays served.
    cluster.set_tenant(TENANT, TenantConfig(epoch_ttl_s=0.5))
    append(path, 400, 100)
    announce(cluster, path, 3)
    eventually(lambda: [r.status for r in records(cluster)] == [EVICTED] * 3 + ["ASSIGNED"], deadline_s=30)
    newest = records(cluster)[-1]
    assert "ttl" in records(cluster)[-2].message and newest.version == 3
    eventually(lambda: set(agent.held) == {("orders", newest.epoch)}, deadline_s=20)
    assert served_rows(agent) == (newest.epoch, 3, 500)
    audit = (cluster.root / "speedlayer-audit-m1.jsonl").read_text().replace(" ", "")
    assert '"reason":"lru"' in audit and '"reason":"ttl"' in audit


def test_a_version_with_deletion_vectors_is_refused_and_the_served_epoch_stays(followed):
    from deltalake import DeltaTable, TableFeatures

    cluster, agent, path = followed
    served = served_rows(agent)
    DeltaTable(path).alter.add_feature(TableFeatures.DeletionVectors, allow_protocol_versions_increase=True)
    announce(cluster, path, 1)
    audit = cluster.root / "speedlayer-audit-m1.jsonl"
    eventually(lambda: "refresh.refused" in audit.read_text(), deadline_s=30)
    assert "deletionVectors" in audit.read_text()
    assert [r.version for r in records(cluster)] == [0] and served_rows(agent) == served
