"""A worker's tables behind its epochs (real DuckDB, no servers): an increment is its base's
tables plus one of its own, read through a view; dropping epochs drops only unshared tables;
the served epoch moves forward only to an epoch held whole."""

from __future__ import annotations

import pyarrow as pa
import pytest

from speedlayer.api.v1 import control_plane_service_pb2 as cp
from speedlayer.config import WorkerConfig
from speedlayer.errors import NotFoundError
from speedlayer.sources.delta import DeltaTableSource
from speedlayer.sources.delta_changes import classify, incremental_source
from speedlayer.worker.agent import HeldEpoch, WorkerAgent
from speedlayer.worker.loader import quote

pytestmark = pytest.mark.unit

Status = cp.DataPullStatusUpdateEvent


def write(path: str, start: int, rows: int) -> None:
    from deltalake import write_deltalake

    write_deltalake(path, pa.table({"id": pa.array(range(start, start + rows), pa.int64())}), mode="append")


def plan_for(resolved, epoch: str, base: str = "", source=None) -> cp.DataAssignmentEvent:
    plan = cp.LoadPlan(plan_id=epoch, source=source or resolved.source, destination_table_name=f"orders__{epoch}",
                       arrow_schema=resolved.arrow_schema, base_epoch_id=base, version=resolved.version)
    return cp.DataAssignmentEvent(dataset_id="orders", epoch_id=epoch, load_plan=plan)


def load(agent: WorkerAgent, event: cp.DataAssignmentEvent) -> None:
    agent.held[(event.dataset_id, event.epoch_id)] = HeldEpoch(event.dataset_id, event.epoch_id,
                                                               event.load_plan.destination_table_name,
                                                               version=event.load_plan.version)
    agent._load(event)  # what the loader thread runs


def rows(agent: WorkerAgent) -> tuple[str, int]:
    with agent.served.pin("orders") as served:
        return served.epoch, agent.loader.cursor().execute(f"SELECT count(*) FROM {quote(served.table)}").fetchone()[0]


def test_increments_share_their_base_and_drops_free_only_unshared_tables(tmp_path):
    path = str(tmp_path / "t")
    write(path, 0, 100)
    connector = DeltaTableSource()
    agent = WorkerAgent(WorkerConfig(tenant="acme", worker_id="w1", masters=["127.0.0.1:1"], memory_bytes=256 << 20))
    v0 = connector.resolve_uri(path, None, [])
    load(agent, plan_for(v0, "v0"))
    assert rows(agent) == ("v0", 100)

    write(path, 100, 10)
    v1 = connector.resolve_uri(path, None, [])
    held_plan = cp.LoadPlan(source=v0.source, arrow_schema=v0.arrow_schema)
    load(agent, plan_for(v1, "v1", base="v0", source=incremental_source(v1, classify(held_plan, v1))))
    assert rows(agent) == ("v1", 110)
    assert agent.held[("orders", "v1")].rows == 110 and agent.held[("orders", "v1")].bytes < v1.total_bytes
    assert agent.tables.parts_held() == {"orders__v0": 2, "orders__v1__added": 1}

    # The base is evicted: its table stays (the increment reads it), the served epoch is unchanged.
    agent._unassigned(cp.DataUnassignmentEvent(dataset_id="orders", epoch_id="v0"))
    assert rows(agent) == ("v1", 110) and agent.tables.parts_held() == {"orders__v0": 1, "orders__v1__added": 1}

    # A worker without the base loads an increment's full list.
    fresh = WorkerAgent(WorkerConfig(tenant="acme", worker_id="w2", masters=["127.0.0.1:1"], memory_bytes=256 << 20))
    load(fresh, plan_for(v1, "v1", base="v0", source=incremental_source(v1, classify(held_plan, v1))))
    assert rows(fresh) == ("v1", 110) and fresh.tables.parts_held() == {"orders__v1": 1}

    agent._unassigned(cp.DataUnassignmentEvent(dataset_id="orders", epoch_id="v1"))
    with pytest.raises(NotFoundError):
        agent.served.resolve("orders")
    assert agent.tables.parts_held() == {}
    tables = agent.loader.cursor().execute("SELECT count(*) FROM duckdb_tables() WHERE NOT temporary").fetchone()[0]
    assert tables == 0


def test_a_retired_epoch_pinned_by_a_query_keeps_its_tables_until_the_query_ends(tmp_path):
    path = str(tmp_path / "t")
    write(path, 0, 5)
    v0 = DeltaTableSource().resolve_uri(path, None, [])
    agent = WorkerAgent(WorkerConfig(tenant="acme", worker_id="w1", masters=["127.0.0.1:1"], memory_bytes=256 << 20))
    load(agent, plan_for(v0, "v0"))
    pin = agent.served.pin("orders")
    agent._unassigned(cp.DataUnassignmentEvent(dataset_id="orders", epoch_id="v0"))
    assert agent.tables.parts_held() == {"orders__v0": 1}  # the query still reads it
    pin.release()
    assert agent.tables.parts_held() == {}


def test_an_older_epoch_arriving_late_does_not_take_the_served_place(tmp_path):
    path = str(tmp_path / "t")
    write(path, 0, 5)
    connector = DeltaTableSource()
    v0 = connector.resolve_uri(path, None, [])
    write(path, 5, 5)
    v1 = connector.resolve_uri(path, None, [])
    agent = WorkerAgent(WorkerConfig(tenant="acme", worker_id="w1", masters=["127.0.0.1:1"], memory_bytes=256 << 20))
    load(agent, plan_for(v1, "v1"))
    load(agent, plan_for(v0, "v0"))
    assert rows(agent) == ("v1", 10)
    agent._unassigned(cp.DataUnassignmentEvent(dataset_id="orders", epoch_id="v1"))
    assert rows(agent) == ("v0", 5)  # what is still held whole
