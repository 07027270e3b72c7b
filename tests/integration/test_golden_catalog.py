"""The connector's driver and readers against topics the REAL Danube v0.7.3 broker wrote.

Every scenario of `../shared/golden` is replayed into an etcd of its own and read in place:
with the WAL root given, every message of the current run comes back exactly once; with the
defaults, what cannot be reached is named; offset reuse (`moved`) is data loss, reported with
the reused offsets and the orphaned objects, and salvageable. Bad WAL roots get clear errors.
"""

from __future__ import annotations

import io
import json
import logging
import shutil

import pytest

from broker.wal_http import WalHttpServer
from connectors import __main__ as connectors_cli
from connectors.catalog import TopicCatalog
from connectors.planner import plan_tasks
from connectors.salvage import salvage_tasks
from connectors.task_reader import read_task
from danube_core.errors import DataLossError, ObjectStoreError
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.ports import free_port
from tests.golden import (
    GOLDEN_DIR, MOVED_OLD_OWNER_SUBSCRIPTION, MOVED_ORPHAN, MOVED_STALE_DESCRIPTOR_OBJECT, SCENARIOS,
    broker_ids, expected, message_key, received,
)

pytestmark = pytest.mark.integration


def catalog(scenario, wal_root: str, fail: bool = True) -> tuple[TopicCatalog, EtcdMetadataStore]:
    store = EtcdMetadataStore(scenario.etcd_endpoint)
    return TopicCatalog(store, root_prefix="/danube-data", storage_url=scenario.storage_url, storage_options={},
                        wal_root=wal_root, fail_on_data_loss=fail), store


def read_all(cat: TopicCatalog, topics: list[str], fail: bool = True):
    """Every message from earliest to latest of each topic: ({(topic, offset): message}, rows, plan)."""
    start, end = cat.earliest_offsets(topics), cat.latest_offsets(topics)
    plan = plan_tasks(cat.snapshots(start, end), start, end, max_partition_bytes=256 * 1024,
                      fail_on_data_loss=fail)
    found, rows = {}, 0
    for task in plan.tasks:
        for batch in read_task(task):
            for row in batch.to_pylist():
                key, message = message_key(task.topic, row)
                found[key] = message
                rows += 1
    return found, rows, plan


def topics_of(scenario) -> list[str]:
    return sorted({t for t, _ in expected(scenario.name)})


@pytest.mark.parametrize("name", SCENARIOS)
def test_with_the_wal_root_every_message_of_the_current_run_comes_back_once(golden, name):
    scenario = golden(name)
    cat, store = catalog(scenario, scenario.wal_map(), fail=name != "moved")
    with store:
        found, rows, plan = read_all(cat, topics_of(scenario), fail=name != "moved")
    assert found == expected(name)
    assert rows == len(found)  # no duplicates
    if name == "moved":  # broker B restarted at 0: A's 0..599 are lost to the offset space
        assert plan.lost_offsets == {"/default/moved": 600}


def test_defaults_read_what_is_uploaded_and_name_the_wal_they_cannot_reach(golden, caplog):
    scenario = golden("normal")
    owner = broker_ids("normal")["wal"]
    cat, store = catalog(scenario, "auto")
    with store, caplog.at_level(logging.WARNING, logger="connectors.unread_tail"):
        found, _, _ = read_all(cat, [scenario.topic])
        tail = cat.snapshot(scenario.topic, 0, 0).unread_tail  # a second look does not warn again
    assert found == {k: v for k, v in expected("normal").items() if k[1] < 1600}
    warnings = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(warnings) == 1
    assert str(owner) in warnings[0] and "walRoot" in warnings[0] and "1600..1600" in warnings[0]
    assert (tail["broker"], tail["fromOffset"], tail["atLeastThrough"]) == (owner, 1600, 1600)


def test_moved_offset_reuse_fails_naming_topic_offsets_and_orphan(golden):
    scenario = golden("moved")
    cat, store = catalog(scenario, "auto")
    with store:
        with pytest.raises(DataLossError) as failure:
            read_all(cat, [scenario.topic])
        # The sealed state broker A wrote at 799 is stale: it does not make 600..799 readable.
        assert cat.latest_offsets([scenario.topic]) == {scenario.topic: 600}
    message = str(failure.value)
    for part in ("/default/moved", "[0, 600)", MOVED_ORPHAN, "reused", "salvage="):
        assert part in message


def test_moved_without_fail_on_data_loss_reads_only_the_current_run(golden):
    scenario = golden("moved")
    cat, store = catalog(scenario, "auto", fail=False)
    with store:
        found, rows, plan = read_all(cat, [scenario.topic], fail=False)
        audit = cat.audit(scenario.topic)
    assert found == expected("moved") and rows == 600
    assert plan.lost_offsets == {scenario.topic: 600}
    assert {(s.name, s.first_offset, s.last_offset, s.referenced) for s in audit.stale_sources if s.url} == {
        (MOVED_ORPHAN, 0, 599, False), (MOVED_STALE_DESCRIPTOR_OBJECT, 600, 799, True)}
    assert audit.stale_seal is not None and audit.stale_seal.last_committed_offset == 799


def test_salvage_reads_the_old_owners_run_with_its_provenance(golden):
    scenario = golden("moved")
    cat, store = catalog(scenario, "auto")
    with store:
        tasks = salvage_tasks(cat, scenario.topic, [MOVED_ORPHAN, MOVED_STALE_DESCRIPTOR_OBJECT],
                              fail_on_data_loss=True)
    found = {}
    for task in tasks:
        for batch in read_task(task, ["offset", "payload", "attributes", "producer_name", "publish_time",
                                      "schema_id", "schema_version", "source"]):
            for row in batch.to_pylist():
                key, message = message_key(task.topic, row)
                found[key] = message
                assert row["source"] == (MOVED_ORPHAN if key[1] < 600 else MOVED_STALE_DESCRIPTOR_OBJECT)
    assert found == received("moved", MOVED_OLD_OWNER_SUBSCRIPTION)  # A's 0..799


def test_runs_command_lists_current_and_older_runs(golden):
    scenario = golden("moved")
    out, err = io.StringIO(), io.StringIO()
    code = connectors_cli.main(["runs", "--etcd", scenario.etcd_endpoint, "--storage-url", scenario.storage_url,
                                "--topic", scenario.topic], out, err)
    assert code == 0, err.getvalue()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    runs = {(r["run"], r["source"]): r for r in lines if "run" in r}
    assert {k for k in runs if k[0] == "current"} == {("current", "data-0-1795443015.dnb1"),
                                                      ("current", "data-400-1795443085.dnb1")}
    orphan = runs[("older", MOVED_ORPHAN)]
    assert (orphan["first_offset"], orphan["last_offset"], orphan["referenced"]) == (0, 599, False)
    assert orphan["first_publish_ms"] <= orphan["last_publish_ms"]
    assert lines[-1] == {"salvage": f"{MOVED_STALE_DESCRIPTOR_OBJECT},{MOVED_ORPHAN}"}
    out = io.StringIO()
    assert connectors_cli.main(["tail", "--etcd", scenario.etcd_endpoint, "--storage-url",
                                scenario.storage_url, "--topic", scenario.topic], out, err) == 0
    assert json.loads(out.getvalue())["unreadTail"]["broker"] == broker_ids("moved")["wal-b"]


# ---- where the WAL is, and bad WAL roots --------------------------------------------------


def test_wal_served_over_http_beside_the_broker(golden):
    scenario = golden("normal")
    server = WalHttpServer(str(GOLDEN_DIR / "normal" / "wal")).start()
    try:
        cat, store = catalog(scenario, json.dumps({str(broker_ids("normal")["wal"]): server.url()}))
        with store:
            found, _, plan = read_all(cat, [scenario.topic])
    finally:
        server.stop()
    assert found == expected("normal")
    assert any(t.url.startswith(server.url()) for t in plan.tasks)


def test_wal_directory_without_checkpoints_is_read_from_a_listing(golden, tmp_path):
    scenario = golden("normal")
    copy = tmp_path / "wal"
    shutil.copytree(GOLDEN_DIR / "normal" / "wal", copy)
    for name in ("wal.ckpt", "uploader.ckpt"):
        (copy / "default" / "normal" / name).unlink()
    cat, store = catalog(scenario, copy.as_uri())
    with store:
        found, _, _ = read_all(cat, [scenario.topic])
    assert found == expected("normal")


def test_unreachable_wal_url_is_an_error_naming_it(golden):
    scenario = golden("normal")
    url = f"http://127.0.0.1:{free_port()}/"
    cat, store = catalog(scenario, json.dumps({str(broker_ids("normal")["wal"]): url}))
    with store, pytest.raises(ObjectStoreError, match=r"WAL directory http://127\.0\.0\.1:\d+/default/normal .*walRoot"):
        cat.latest_offsets([scenario.topic])


@pytest.mark.parametrize("wal_root, reason", [
    (json.dumps({"42": "file:///nowhere"}), "walRoot maps no WAL URL for it"),
    ("file:///nonexistent-wal-root-{broker_id}", "WAL directory does not exist"),
])
def test_wal_root_that_misses_the_owner_names_the_tail(golden, wal_root, reason):
    scenario = golden("normal")
    cat, store = catalog(scenario, wal_root)
    with store:
        assert cat.latest_offsets([scenario.topic]) == {scenario.topic: 1600}
        tail = cat.snapshot(scenario.topic, 0, 0).unread_tail
    assert reason in tail["reason"] and tail["broker"] == broker_ids("normal")["wal"]


def test_a_dead_brokers_unreachable_wal_server_does_not_fail_reads(golden):
    """Regression: a broker that served its WAL over HTTP and died leaves its state record
    (with that wal_url) behind; other topics' reads must not fail on its dead server."""
    from danube_core.keys import broker_state_key
    from danube_core.records import BrokerState

    scenario = golden("normal")
    cat, store = catalog(scenario, "auto")
    with store:
        store.put(broker_state_key(42), BrokerState("active", "boot", wal_url=f"http://127.0.0.1:{free_port()}/").to_json())
        found, _, _ = read_all(cat, [scenario.topic])
    assert found == {k: v for k, v in expected("normal").items() if k[1] < 1600}
