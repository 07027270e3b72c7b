"""The console's server time per page against the size of the cluster in etcd.

Every page must render in at most 300 ms of server time with 1,000 topics and 100 subscriptions
in etcd (issue 28). One etcd (`danube_core.embedded_etcd`) is filled with the records a broker
writes: per topic its namespace-index entry, delivery, assignment and `--descriptors` object
descriptors with `cur`; per subscription its record (with the `lag` the data source records)
and cursor; a registration and a load report per broker; a speed-layer tenant with datasets and
replicated epochs. The console's app (`console.app`, its own etcd cache) serves each page
`--repeat` times through Starlette's test client; the server time is its `Server-Timing`.

First with `--baseline-topics` (10) topics (the baseline), then with `--topics` (1,000) in the
same etcd and the same run; the ratio is large/baseline per page. Also reported: the load
average, this process's CPU seconds per page and its wall time.

    python bench/bench_console.py [--topics 1000] [--subscriptions 100] [--repeat 20]

Prints a table and writes bench/results/console.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Column, machine_info, print_table, timed, write_results
from console.app import build_app
from console.config import ConsoleConfig, SpeedLayerSection
from console.services import ConsoleServices
from danube_core import keys
from danube_core.etcd_settings import EtcdSettings
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.records import (
    NULL_JSON, RELIABLE, BrokerRegistration, CurPointer, LoadReport, ObjectDescriptor, Policies, ResourceUsage,
    SubscriptionRecord, dump_cursor, dump_delivery, dump_json,
)
from danube_core.embedded_etcd import EmbeddedEtcd
from speedlayer.keys import SpeedLayerKeys
from speedlayer.records import AssignmentRecord, ReplicaRecord, WorkerRecord

GOAL_MS = 300.0
BROKERS = 3
KEY_ROOT = "/sl-bench"


def write_topics(metadata: EtcdMetadataStore, first: int, last: int, descriptors: int) -> None:
    storage = keys.StorageKeys()
    metadata.put_if_absent(keys.namespace_policy_key("bench"), Policies().to_json())
    for i in range(first, last):
        topic = f"/bench/topic-{i:05d}"
        metadata.put(keys.namespace_topic_key(topic), NULL_JSON)
        metadata.put(keys.delivery_key(topic), dump_delivery(RELIABLE))
        metadata.put(keys.assignment_key(i % BROKERS + 1, topic), NULL_JSON)
        for d in range(descriptors):
            start = d * 1000
            metadata.put(storage.object_key(topic, start), ObjectDescriptor(
                f"data-{start}-1700000000.dnb1", start, start + 999, 1_000_000, None, 1_700_000_000,
                offset_index=[(start, 0)]).to_json())
        metadata.put(storage.cur_key(topic), CurPointer.for_offset((descriptors - 1) * 1000).to_json())


def write_subscriptions(metadata: EtcdMetadataStore, topics: int, count: int) -> None:
    for s in range(count):
        topic = f"/bench/topic-{s * max(1, topics // count):05d}"
        record = SubscriptionRecord(None, "spark", f"sub-{s}", 0).to_value()
        lag = {"messages": s, "bytes": s * 100, "ms": s * 10, "updated_at": 1_700_000_000}
        metadata.put(keys.subscription_key(topic, f"sub-{s}"), dump_json({**record, "lag": lag}))
        metadata.put(keys.cursor_key(topic, f"sub-{s}"), dump_cursor(1000 + s))


def write_cluster(metadata: EtcdMetadataStore) -> None:
    for b in range(1, BROKERS + 1):
        metadata.put(keys.register_key(b), BrokerRegistration("http://a", "http://b", "http://c").to_json())
        metadata.put(keys.load_key(b), LoadReport(b, [ResourceUsage("CPU", 12.5), ResourceUsage("Memory", 40.0)],
                                                  1_700_000_000, [], 0, 0, 0.0).to_json())
    metadata.put(keys.LEADER_KEY, dump_json(1))
    sl = SpeedLayerKeys(KEY_ROOT)
    for w in ("w1", "w2", "w3"):
        metadata.put(sl.worker("acme", w), WorkerRecord(f"127.0.0.1:1{w[1]}", 2**31, 4, "m1").to_json())
    for d in range(10):
        replicas = {w: ReplicaRecord(state="READY", rows=1000) for w in ("w1", "w2")}
        metadata.put(sl.assignment("acme", f"ds{d}", "e1"), AssignmentRecord(
            "acme", f"ds{d}", "e1", "r", "ASSIGNED", version=1, total_rows=1000, estimated_memory_bytes=10**6,
            replicas=replicas).to_json())


def measure(client, pages: list[str], repeat: int) -> dict[str, dict[str, float]]:
    out = {}
    for page in pages:
        client.get(page)  # the first render compiles templates and parses values: not the steady state
        server, cpu = [], []
        for _ in range(repeat):
            with timed() as t:
                response = client.get(page)
            assert response.status_code == 200, (page, response.status_code)
            server.append(float(response.headers["server-timing"].split("dur=")[1]))
            cpu.append(t.cpu_s * 1000)
        out[page] = {"median_ms": statistics.median(server), "max_ms": max(server),
                     "cpu_ms": statistics.median(cpu)}
    return out


def run(args: argparse.Namespace) -> dict:
    from starlette.testclient import TestClient

    pages = ["/topics", "/topics/bench/topic-00000", "/topics/bench/topic-00000/messages", "/brokers",
             "/pipelines", "/speedlayer"]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-console-") as tmp:
        etcd = EmbeddedEtcd(str(Path(tmp) / "etcd"))
        try:
            config = ConsoleConfig(etcd=EtcdSettings(etcd.endpoint), storage_url=str(Path(tmp) / "cloud"),
                                   speedlayer=SpeedLayerSection(KEY_ROOT))
            with EtcdMetadataStore(etcd.endpoint) as metadata:
                write_cluster(metadata)
                write_topics(metadata, 0, args.baseline_topics, args.descriptors)
                write_subscriptions(metadata, args.baseline_topics, min(args.subscriptions, args.baseline_topics))
                results["baseline"] = serve(config, pages, args.repeat, TestClient)
                started = time.perf_counter()
                write_topics(metadata, args.baseline_topics, args.topics, args.descriptors)
                write_subscriptions(metadata, args.topics, args.subscriptions)
                logging.info("wrote %d topics in %.1f s", args.topics, time.perf_counter() - started)
                results["large"] = serve(config, pages, args.repeat, TestClient)
        finally:
            etcd.stop()
    rows = []
    for page in pages:
        base, large = results["baseline"][page], results["large"][page]
        rows.append({"page": page, "base_ms": base["median_ms"], "large_ms": large["median_ms"],
                     "large_max_ms": large["max_ms"], "cpu_ms": large["cpu_ms"],
                     "ratio": large["median_ms"] / base["median_ms"] if base["median_ms"] else None,
                     "goal": "ok" if large["max_ms"] <= GOAL_MS else "OVER"})
    return {"rows": rows, "config": vars(args), "goal_ms": GOAL_MS, "machine": machine_info()}


def serve(config: ConsoleConfig, pages: list[str], repeat: int, client_class) -> dict:
    services = ConsoleServices(dataclasses.replace(config), sample_lag=False).start()
    try:
        if not services.etcd.wait_ready(60):
            raise RuntimeError(f"the console's cache did not load: {services.etcd.problem}")
        with client_class(build_app(services)) as client:
            return measure(client, pages, repeat)
    finally:
        services.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--baseline-topics", type=int, default=10)
    parser.add_argument("--subscriptions", type=int, default=100)
    parser.add_argument("--descriptors", type=int, default=3, help="object descriptors per topic")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    with timed() as total:
        report = run(args)
    report["cpu_s"], report["wall_s"] = round(total.cpu_s, 2), round(total.wall_s, 2)
    print_table(report["rows"], [
        Column("page", "page"), Column(f"{args.baseline_topics} topics ms", "base_ms", "{:.1f}"),
        Column(f"{args.topics} topics ms", "large_ms", "{:.1f}"), Column("max ms", "large_max_ms", "{:.1f}"),
        Column("cpu ms", "cpu_ms", "{:.1f}"), Column("ratio", "ratio", "{:.1f}x"), Column("≤300 ms", "goal"),
    ], title=f"console server time per page (median of {args.repeat}; load {report['machine']['load_average_1m']}, "
             f"{report['cpu_s']} CPU s, {report['wall_s']} s wall)")
    write_results("console", report)


if __name__ == "__main__":
    main()
