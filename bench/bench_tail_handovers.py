"""Hand-overs from a dataset's topic tail to its Delta epochs, many of them: every answer through
the gateway a gap-free, duplicate-free prefix of the topic's offsets that never goes backwards,
across `--hand-overs` epochs, with the worker's tail process killed -9 and the broker killed -9
and restarted among them (issue 42's goal: 0 missing and 0 duplicated over >= 100 hand-overs).

Real processes on loopback: etcd and our broker (`devstack.EmbeddedStack`, restarted with
`restart_broker`), an orders pipeline streaming into Delta (`python -m pipelines run`,
processingTime 500 ms, announcing each commit; no expectations, so that its batches, hence the
hand-overs, come every second or two: tests/integration/test_tail_handover.py checks the
quarantine's part of the boundary), one master, one worker (its tail process) and a
gateway (`devstack.EmbeddedSpeedLayer`). A producer sends valid orders at `--rate` msg/s, one at
a time, and after a failed send (the broker gone) builds its client again and goes on; a send
whose ack was lost may still be in the topic, so the check is on offsets, not on acks. This
process asks the gateway `count(*)`, `count(DISTINCT _offset)`, `min` and `max(_offset)` in a
loop (one client id: one replica). The tail process is killed after `--kill-tail-at` hand-overs,
the broker after `--restart-broker-at`. At the end the producer stops and the last answer must
count every offset the topic holds (read from the topic's head through the pipeline's own tail
feed) and every acknowledged send.

    python bench/bench_tail_handovers.py [--hand-overs 100] [--rate 200] [--kill-tail-at 30] [--restart-broker-at 60]

Writes bench/results/tail_handovers.json. Not in the suite (minutes of load);
tests/integration/test_tail_handover.py is its short form.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from common import machine_info, run_in_workdir, tree_cpu_s, write_results  # noqa: E402

NAME, TOPIC = "handovers", "/default/tail-handovers"
SCHEMA = {"type": "object", "required": ["order_id", "amount"],
          "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}, "currency": {"type": "string"}}}
CHECK_SQL = f"SELECT count(*) AS n, count(DISTINCT _offset) AS d, min(_offset) AS lo, max(_offset) AS hi FROM {NAME}"


class Producer:
    """Valid orders at `rate_per_s`, one send at a time; a failed send rebuilds the client."""

    def __init__(self, url: str, rate_per_s: float) -> None:
        self.url, self.rate_per_s = url, rate_per_s
        self.sent = self.acked = self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> "Producer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)

    async def _connect(self):
        from danube import DanubeClientBuilder, DispatchStrategy

        client = await DanubeClientBuilder().service_url(self.url).build()
        producer = (client.new_producer().with_topic(TOPIC).with_name(f"handovers-{self.failed}")
                    .with_dispatch_strategy(DispatchStrategy.RELIABLE).build())
        await producer.create()
        return producer

    async def _run(self) -> None:
        producer, started = None, time.monotonic()
        while not self._stop.is_set():
            await asyncio.sleep(max(0.0, started + self.sent / self.rate_per_s - time.monotonic()))
            try:
                if producer is None:
                    producer = await asyncio.wait_for(self._connect(), 10)
                self.sent += 1
                body = json.dumps({"order_id": f"o{self.sent}", "amount": 1.0, "currency": "EUR"}).encode()
                await asyncio.wait_for(producer.send(body), 10)
                self.acked += 1
            except Exception:  # the broker is gone: its ack may be lost, the message still in the topic
                self.failed += 1
                producer = None
                await asyncio.sleep(0.2)
                started = time.monotonic() - self.sent / self.rate_per_s
        if producer is not None:
            try:
                await producer.close()
            except Exception:
                pass


def pipeline_file(stack, root: Path) -> dict:
    return {
        "name": NAME,
        "source": {"etcd_endpoints": stack.etcd_endpoint, "storage_url": stack.storage_url, "topics": [TOPIC],
                   "subscription": NAME, "starting_offsets": "earliest"},
        "decode": {"format": "json", "subject": NAME},
        "target": {"path": str(root / NAME / "target")},
        "quarantine": {"path": str(root / NAME / "quarantine")},
        "checkpoint": str(root / NAME / "checkpoint"),
        "trigger": {"mode": "processingTime", "interval": "500 ms"},
        "speedlayer": {"tenant": "acme", "dataset": NAME, "etcd_endpoints": stack.etcd_endpoint,
                       "key_root": "/speedlayer"},
    }


def wait(check, deadline_s: float, what: str):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            if result := check():
                return result
        except Exception:  # an answer refused while a part restarts: ask again
            pass
        time.sleep(0.1)
    raise RuntimeError(f"not within {deadline_s} s: {what}")


def topic_head(data: dict) -> int:
    """The topic's end offset (exclusive), read as the tail reads it."""
    from pipelines.config import parse_config
    from pipelines.tail_feed import TailFeed

    feed = TailFeed(parse_config(data, "<bench_tail_handovers>"))
    try:
        (partition,) = feed.topics()
        return feed.latest([partition])[partition]
    finally:
        feed.close()


def check(answers: list[dict]) -> dict:
    """Gaps, duplicates and steps back over all answers."""
    duplicated = gaps = backwards = 0
    previous = 0
    for a in answers:
        n = a["n"]
        duplicated += n - a["d"]
        if n and (a["lo"] != 0 or a["hi"] != n - 1):
            gaps += 1
        if n < previous:
            backwards += 1
        previous = max(previous, n)
    return {"answers_with_duplicates": sum(1 for a in answers if a["n"] != a["d"]), "duplicated_offsets": duplicated,
            "answers_with_a_gap": gaps, "answers_backwards": backwards}


def run(work: Path, args: argparse.Namespace) -> dict:
    from danube_core.metadata_etcd import EtcdMetadataStore
    from danube_core.schema_registry import register_schema
    from devstack.broker_stack import EmbeddedStack
    from devstack.pipeline_process import start_pipeline, stop_pipeline, tail_process
    from devstack.speedlayer_stack import EmbeddedSpeedLayer
    from speedlayer.clients.query_client import QueryClient

    with EmbeddedStack(work / "stack") as stack:
        with EtcdMetadataStore(stack.etcd_endpoint) as metadata:
            register_schema(metadata, NAME, "JsonSchema", json.dumps(SCHEMA))
        data = pipeline_file(stack, work)
        producer = Producer(stack.service_url, args.rate).start()
        driver = start_pipeline(data, work)
        layer = EmbeddedSpeedLayer(work / "speedlayer", stack.etcd_endpoint, tenant="acme")
        answers: list[dict] = []
        events: list[dict] = []
        cpu_all, started = tree_cpu_s(), time.monotonic()
        loads = [os.getloadavg()[0]]
        try:
            layer.start(workers=1)
            first_commit = Path(data["target"]["path"]) / "_delta_log" / f"{0:020d}.json"
            wait(lambda: first_commit.exists() or driver.poll() is not None, 300, "the pipeline's first commit")
            if driver.poll() is not None:
                raise RuntimeError(f"the pipeline exited: {(work / 'pipeline.log').read_text()[-3000:]}")
            layer.admit(NAME, data["target"]["path"], tail_pipeline=json.dumps(data))
            with QueryClient(layer.gateway, "acme", client_id="handovers") as client:
                def ask() -> dict:
                    table = client.query(NAME, CHECK_SQL)
                    row = table.to_pylist()[0]
                    meta = table.schema.metadata or {}
                    tail = json.loads(meta.get(b"speedlayer.tail", b"{}"))
                    row.update(epoch=meta.get(b"speedlayer.epoch", b"").decode(), tail_rows=tail.get("rows", 0),
                               state=str(tail.get("state", "")), at=round(time.monotonic() - started, 2))
                    return row

                answers.append(wait(lambda: (a := ask())["tail_rows"] > 0 and a, 300, "a first answer with tail rows"))
                epochs: list[str] = [answers[-1]["epoch"]]
                worker = layer.processes["worker-w1"].pid
                deadline, refused = time.monotonic() + args.max_seconds, 0
                while len(epochs) <= args.hand_overs and time.monotonic() < deadline:
                    try:
                        answers.append(ask())
                    except Exception as exc:  # counted: while the broker restarts the gateway still answers
                        refused += 1
                        if refused % 50 == 1:
                            print(f"answer refused: {exc}", file=sys.stderr)
                        time.sleep(0.1)
                        continue
                    if answers[-1]["epoch"] != epochs[-1]:
                        epochs.append(answers[-1]["epoch"])
                        if len(epochs) % 10 == 0:
                            print(f"{len(epochs) - 1} hand-overs, {answers[-1]['n']} rows, "
                                  f"load {os.getloadavg()[0]:.1f}", file=sys.stderr)
                            loads.append(os.getloadavg()[0])
                    hand_overs = len(epochs) - 1
                    if hand_overs >= args.kill_tail_at and not any(e["event"] == "tail killed" for e in events):
                        victim = tail_process(worker)
                        if victim is not None:
                            os.kill(victim, signal.SIGKILL)
                            events.append({"event": "tail killed", "after_hand_overs": hand_overs, "pid": victim,
                                           "rows": answers[-1]["n"]})
                    if hand_overs >= args.restart_broker_at and not any(e["event"] == "broker restarted" for e in events):
                        began = time.monotonic()
                        stack.restart_broker(signal.SIGKILL)
                        events.append({"event": "broker restarted", "after_hand_overs": hand_overs,
                                       "restart_s": round(time.monotonic() - began, 1), "rows": answers[-1]["n"]})
                    time.sleep(0.02)  # pacing: asking back to back only costs CPU
                producer.stop()
                head = topic_head(data)
                final = wait(lambda: (a := ask())["n"] == head and a, 300, f"an answer counting all {head} offsets")
                answers.append(final)
        finally:
            producer.stop()
            stop_pipeline(driver)
            layer.stop()
    found = check(answers)
    states = sorted({a["state"].split(":", 1)[0] for a in answers})
    return {"machine": machine_info(), "rate_msgs_s": args.rate, "hand_overs": len(epochs) - 1,
            "answers": len(answers), "answers_refused": refused,
            "answers_with_tail_rows": sum(1 for a in answers if a["tail_rows"]),
            "events": events, "sent": producer.sent, "acked": producer.acked, "failed_sends": producer.failed,
            "topic_offsets": head, "final_rows": final["n"],
            "missing": head - final["n"], "missing_acked": max(0, producer.acked - final["n"]), **found,
            "states_seen": states,
            "tail_process_exit_reported": any("TailProcessExited" in a["state"] for a in answers),
            "wall_s": round(time.monotonic() - started, 1), "all_cpu_s": round(tree_cpu_s() - cpu_all, 1),
            "load_average_1m": [round(x, 2) for x in loads]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hand-overs", type=int, default=100, help="epochs handed over before stopping")
    parser.add_argument("--rate", type=float, default=200.0, help="messages per second")
    parser.add_argument("--kill-tail-at", type=int, default=30, help="hand-overs before the tail process is killed")
    parser.add_argument("--restart-broker-at", type=int, default=60, help="hand-overs before the broker restarts")
    parser.add_argument("--max-seconds", type=float, default=1800, help="give up after this long")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args()
    report = run_in_workdir("bench-tail-handovers-", lambda work: run(work, args), keep=args.keep)
    print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=1))
    write_results("tail_handovers", report)
    ok = (report["hand_overs"] >= args.hand_overs and report["missing"] == 0 and report["missing_acked"] == 0
          and report["duplicated_offsets"] == 0 and report["answers_with_a_gap"] == 0
          and report["answers_backwards"] == 0)
    print(f"{report['hand_overs']} hand-overs: missing {report['missing']}, duplicated {report['duplicated_offsets']}, "
          f"gaps {report['answers_with_a_gap']}, backwards {report['answers_backwards']}: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
