"""A dataset's topic tail, end to end: every answer is a gap-free, duplicate-free prefix of the
topic (without the messages the pipeline quarantines: an expectation's failures and payloads that
do not decode, which the tail drops as the pipeline does), and no answer goes backwards, across
many Delta commits handed over under load and the tail's process killed -9 (the worker starts
another from where its tail stands).

Real parts: etcd and our broker (`devstack.EmbeddedStack`), the pipeline streaming into Delta as
a user runs it (`python -m pipelines run`, processingTime 500 ms, announcing each commit), a
master, a worker and a gateway as processes (`devstack.EmbeddedSpeedLayer`), the worker's tail
process reading the topic with the pipeline's own code, and a producer acknowledged by the broker.

The pipeline runs as a process, not in the suite's Spark session, so this test takes no turn of
that session's group; with the tail's split done without Spark (`pipelines.tail_split`), a few
seconds of load see the hand-overs it checks.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.schema_registry import register_schema
from devstack.broker_stack import EmbeddedStack
from devstack.pipeline_process import start_pipeline, stop_pipeline, tail_process
from devstack.speedlayer_stack import EmbeddedSpeedLayer
from speedlayer.clients.query_client import QueryClient
from tests.rig import eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

SCHEMA = {"type": "object", "required": ["order_id", "amount"],
          "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}, "currency": {"type": "string"}}}
RULES = [{"type": "expect_column_values_to_be_between", "kwargs": {"column": "amount", "min_value": 0}}]
HAND_OVERS = 6  # epochs answered beside the tail (each a Delta commit handed over)
CHECK_SQL = ("SELECT count(*) AS n, count(DISTINCT _offset) AS d, min(_offset) AS lo, max(_offset) AS hi "
             "FROM {dataset}")


def payload(offset: int, quarantined: bool) -> bytes:
    """Message `offset` (one producer sending one at a time: message k gets offset k); a
    quarantined one fails the expectation or, every other time, does not decode."""
    if quarantined and offset % 40 == 39:
        return b"this is not json"
    amount = -1.0 if quarantined else 1.0
    return json.dumps({"order_id": f"o{offset}", "amount": amount, "currency": "EUR"}).encode()


class Producer:
    """Sends order i = 0, 1, ... at `rate_per_s`, one at a time; `acked` counts the acknowledged ones."""

    def __init__(self, url: str, topic: str, rate_per_s: float) -> None:
        self.url, self.topic, self.rate_per_s = url, topic, rate_per_s
        self.sent = self.acked = 0
        self.quarantined: set[int] = set()  # offsets of the messages the pipeline quarantines
        self._poison_until = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self, limit: int | None = None) -> "Producer":
        self.limit = limit
        self._thread.start()
        return self

    def poison(self, count: int) -> None:
        """Every 20th of the next `count` messages is one the pipeline quarantines (only a few
        batches then write quarantine rows: each such batch costs the pipeline another commit)."""
        self._poison_until = self.sent + count

    def kept_below(self, end: int) -> int:
        """How many of offsets [0, end) the pipeline keeps."""
        return end - sum(1 for o in list(self.quarantined) if o < end)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    async def _run(self) -> None:
        from danube import DanubeClientBuilder, DispatchStrategy

        client = await DanubeClientBuilder().service_url(self.url).build()
        producer = (client.new_producer().with_topic(self.topic).with_name("tail-checker")
                    .with_dispatch_strategy(DispatchStrategy.RELIABLE).build())
        await producer.create()
        started = time.monotonic()
        while not self._stop.is_set() and (self.limit is None or self.sent < self.limit):
            await asyncio.sleep(max(0.0, started + self.sent / self.rate_per_s - time.monotonic()))
            offset = self.sent
            bad = offset < self._poison_until and offset % 20 == 19
            if bad:
                self.quarantined.add(offset)
            self.sent += 1
            await producer.send(payload(offset, bad))
            self.acked += 1
        await producer.close()


def pipeline_file(stack: EmbeddedStack, root: Path, name: str, topic: str) -> dict:
    return {
        "name": name,
        "source": {"etcd_endpoints": stack.etcd_endpoint, "storage_url": stack.storage_url, "topics": [topic],
                   "subscription": name, "starting_offsets": "earliest"},
        "decode": {"format": "json", "subject": name},
        "expectations": {"suite": name, "rules": RULES},
        "target": {"path": str(root / name / "target")},
        "quarantine": {"path": str(root / name / "quarantine")},
        "checkpoint": str(root / name / "checkpoint"),
        "trigger": {"mode": "processingTime", "interval": "500 ms"},
        "speedlayer": {"tenant": "acme", "dataset": name, "etcd_endpoints": stack.etcd_endpoint,
                       "key_root": "/speedlayer"},
    }


def test_answers_are_a_growing_gap_free_prefix_across_hand_overs(tmp_path, unique_name):
    name, topic = unique_name("tailorders").replace("-", "_"), f"/default/{unique_name('tail-orders')}"
    with EmbeddedStack(tmp_path / "stack") as stack:
        with EtcdMetadataStore(stack.etcd_endpoint) as metadata:
            register_schema(metadata, name, "JsonSchema", json.dumps(SCHEMA))
        data = pipeline_file(stack, tmp_path, name, topic)
        producer = Producer(stack.service_url, topic, rate_per_s=200).start()
        driver = start_pipeline(data, tmp_path)
        layer = EmbeddedSpeedLayer(tmp_path / "speedlayer", stack.etcd_endpoint, tenant="acme")
        answers: list[dict] = []
        try:
            layer.start(workers=1)
            first_commit = Path(data["target"]["path"]) / "_delta_log" / f"{0:020d}.json"
            eventually(lambda: first_commit.exists() or driver.poll() is not None, deadline_s=240, interval_s=0.2)
            assert driver.poll() is None, (tmp_path / "pipeline.log").read_text()[-4000:]
            layer.admit(name, data["target"]["path"], tail_pipeline=json.dumps(data))
            with QueryClient(layer.gateway, "acme", client_id="checker") as client:
                def ask() -> dict:
                    table = client.query(name, CHECK_SQL.format(dataset=name))
                    row = table.to_pylist()[0]
                    meta = table.schema.metadata or {}
                    tail = json.loads(meta.get(b"speedlayer.tail", b"{}"))
                    row.update(epoch=meta.get(b"speedlayer.epoch", b"").decode(), tail_rows=tail.get("rows", 0),
                               state=tail.get("state", ""), sent=producer.sent)
                    return row

                answers.append(eventually(lambda: (a := ask())["tail_rows"] > 0 and a, deadline_s=120))
                producer.poison(400)  # the tail must drop exactly what the pipeline quarantines
                # Load until HAND_OVERS epochs have answered beside the tail; the tail's process is
                # killed -9 after the second, and more hand-overs must follow it.
                deadline, killed, epochs = time.monotonic() + 240, 0, []
                worker = layer.processes["worker-w1"].pid
                while len(epochs) < HAND_OVERS and time.monotonic() < deadline:
                    answers.append(ask())
                    if not epochs or epochs[-1] != answers[-1]["epoch"]:
                        epochs.append(answers[-1]["epoch"])
                    if not killed and len(epochs) >= 2:
                        killed = tail_process(worker) or pytest.fail(f"worker {worker} runs no tail process")
                        os.kill(killed, signal.SIGKILL)
                    time.sleep(0.02)  # pacing, not waiting: asking back to back only costs CPU
                eventually(lambda: tail_process(worker) != killed, deadline_s=60)  # started anew
                answers.append(eventually(lambda: (a := ask())["state"] == "following" and a, deadline_s=60))
                producer.stop()
                final = eventually(lambda: (a := ask())["n"] == producer.kept_below(producer.acked) and a,
                                   deadline_s=60)
                answers.append(final)
        finally:
            producer.stop()
            stop_pipeline(driver)
            layer.stop()

    previous = 0
    for answer in answers:
        n = answer["n"]
        assert answer["d"] == n, f"duplicated offsets in {answer}"
        if n:  # the kept offsets of a prefix of the topic, none missing, none quarantined
            hi = answer["hi"]
            assert answer["lo"] == 0 and hi not in producer.quarantined, f"a quarantined row or a gap: {answer}"
            assert n == producer.kept_below(hi + 1), f"a gap: {answer}"
        assert n >= previous, f"went backwards from {previous} rows: {answer}"
        assert n <= producer.kept_below(answer["sent"]), f"more rows than messages kept: {answer}"
        previous = n
    epochs = {a["epoch"] for a in answers}
    fresher = [a for a in answers if a["tail_rows"] > 0]
    assert len(epochs) >= HAND_OVERS, f"only {len(epochs)} epochs handed over"
    # How many answers are fresher than their epoch depends on the machine; that some are, and all
    # are exact, is the property.
    assert fresher, f"none of {len(answers)} answers counted a row beyond its epoch"
    states = {a["state"].split(":", 1)[0] for a in answers}
    assert states <= {"following", "error", "starting"}, states
    assert any("TailProcessExited" in a["state"] for a in answers), "the killed tail process was not reported"
    assert len(producer.quarantined) == 20, producer.quarantined
