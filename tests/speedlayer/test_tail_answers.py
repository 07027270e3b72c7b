"""A worker's answers over an epoch and its tail, through its real Flight surface and DuckDB: the
view counts each offset once, the metadata says what was counted, the committed epoch alone on
request, and a hand-over moves answers forward only. The topic is the unit tests' fake feed."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from speedlayer.clients.query_client import read_query
from speedlayer.protocol.query import QueryLimits, QueryRequest, call_options
from speedlayer.tail_spec import TailSpec
from speedlayer.worker.flight_server import WorkerFlightServer
from speedlayer.worker.loader import EpochLoader
from speedlayer.worker.serving import ServedDatasets
from speedlayer.worker.tails import WorkerTails
from tests.rig import eventually
from tests.unit.test_speedlayer_tail import P0, FakeFeed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def worker():
    loader = EpochLoader(memory_limit_bytes=256 * 1024 * 1024, threads=1)
    served = ServedDatasets(drop_table=loader.drop)
    feed = FakeFeed({P0: 0})
    tails = WorkerTails(lambda spec, dataset: feed, cursor=loader.cursor, poll_interval_s=0.005)
    server = WorkerFlightServer("grpc://127.0.0.1:0", tenant="acme", served=served, cursor=loader.cursor,
                                limits=QueryLimits(timeout_ms=5_000), tails=tails)
    client = flight.connect(f"grpc://127.0.0.1:{server.port}")
    con = loader.cursor()
    for version, held in ((1, 4), (2, 8)):  # epoch v holds offsets [0, held) of P0
        con.execute(f"CREATE TABLE orders__v{version} AS SELECT '{P0}' AS _topic, range::BIGINT AS _offset, "
                    f"'{P0}:' || range AS v FROM range({held})")
    yield loader, served, tails, feed, client
    client.close()
    tails.stop()
    server.shutdown()


def ask(client, **kwargs) -> pa.Table:
    sql = "SELECT count(*) AS n, count(DISTINCT _offset) AS d, max(_offset) AS hi FROM orders"
    return read_query(client, QueryRequest(dataset="orders", sql=sql, **kwargs), call_options("acme"))


def publish(served, tails, version: int, held: int) -> None:
    tails.publish_with_tail("orders", f"e{version}", TailSpec("name: orders", 1000, 0, {P0: held}),
                            lambda: served.publish("orders", f"e{version}", f"orders__v{version}", version=version))


def test_an_answer_is_its_epoch_plus_the_tail_above_it_and_says_so(worker):
    _, served, tails, feed, client = worker
    publish(served, tails, 1, 4)
    feed.produce(P0, 10)
    eventually(lambda: tails.datasets()["orders"].ends == {P0: 10})
    answer = ask(client)
    assert answer.to_pylist() == [{"n": 10, "d": 10, "hi": 9}]
    meta = answer.schema.metadata
    tail = json.loads(meta[b"speedlayer.tail"])
    assert meta[b"speedlayer.epoch"] == b"e1"
    assert (tail["state"], tail["last_offsets"], tail["rows"]) == ("following", {P0: 9}, 6)
    assert tail["age_ms"] >= 0

    committed = ask(client, committed_only=True)
    assert committed.to_pylist() == [{"n": 4, "d": 4, "hi": 3}]
    assert json.loads(committed.schema.metadata[b"speedlayer.tail"])["state"].startswith("off:")


def test_a_hand_over_counts_no_offset_twice_whichever_epoch_is_asked_for(worker):
    _, served, tails, feed, client = worker
    publish(served, tails, 1, 4)
    feed.produce(P0, 12)
    eventually(lambda: tails.datasets()["orders"].ends == {P0: 12})
    publish(served, tails, 2, 8)  # E+1 holds [0, 8): its rows leave the tail's part of its answers
    newest, older = ask(client), ask(client, epoch="e1")
    assert newest.to_pylist() == older.to_pylist() == [{"n": 12, "d": 12, "hi": 11}]
    assert json.loads(newest.schema.metadata[b"speedlayer.tail"])["rows"] == 4
    assert json.loads(older.schema.metadata[b"speedlayer.tail"])["rows"] == 8


def test_a_dataset_without_a_tail_answers_as_before(worker):
    _, served, _, _, client = worker
    served.publish("orders", "e1", "orders__v1", version=1)
    answer = ask(client)
    assert answer.to_pylist() == [{"n": 4, "d": 4, "hi": 3}]
    assert b"speedlayer.tail" not in (answer.schema.metadata or {})
