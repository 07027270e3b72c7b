"""Ingest through the official danube-client into our broker, durable writes on.

Starts a local etcd and a broker process (`python -m broker`) with
`wal_cloud.wal.file_sync.durable: true`: a SendMessage is answered only after its WAL frame is
written and fsync(2)ed (group commit, see broker/durable_ack.py). Then 1 and 4 producer
processes (each its own danube-client `Producer`, `--in-flight` sends pipelined per producer)
send 100-byte messages with one attribute to one reliable topic. Reports msgs/s, the
p50/p99 latency of `producer.send()`, and CPU microseconds per message spent by the client
processes and by the server process.

Two brokers run in turn on the same etcd: `broker` with the default native front
(`broker.grpc_front: native`, SendMessage answered in Rust from batches, see
broker/send_front.py) and `broker-py` with Python's gRPC server alone (`grpc_front: python`).

Baselines, same run and same client code: the same producers against a no-op Python gRPC
server that answers every call at once (`ratio` = msgs/s / no-op msgs/s), and `broker-py`
(`vs py` = msgs/s / broker-py msgs/s). The goal (issue 14) is durable msgs/s >= 0.5x what
this client reached against the real Danube v0.7.3 broker on this machine (8,891 msgs/s).

    python bench/bench_ingest.py [--messages 10000] [--in-flight 64] [--flush-interval-ms 5]

Prints a table and writes bench/results/ingest.json. The JSON also holds the load average
before and after each case (other work on the machine slows both sides; CPU per message is
steadier than msgs/s) and `broker_profile`: the broker's hot path (py-spy sampling the broker
process, top functions by own and by inclusive samples) during a separate, untimed run of the
1-producer case, so the sampler's cost is in no figure of the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from danube_core.embedded_etcd import EmbeddedEtcd  # noqa: E402
from danube_core.ports import free_port, wait_for_port  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pyspy_profile  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "ingest.json"
PAYLOAD = bytes(range(100))


def _noop_server(port: int) -> None:
    """A gRPC server that accepts everything at once (the baseline)."""
    import grpc
    from danube.proto import DanubeApi_pb2 as pb
    from danube.proto import DanubeApi_pb2_grpc as pb_grpc

    url = f"http://127.0.0.1:{port}"

    class Producers(pb_grpc.ProducerServiceServicer):
        async def CreateProducer(self, request, context):
            return pb.ProducerResponse(request_id=request.request_id, producer_id=1, producer_name=request.producer_name)

        async def SendMessage(self, request, context):
            return pb.MessageResponse(request_id=request.request_id)

    class Discovery(pb_grpc.DiscoveryServicer):
        async def TopicLookup(self, request, context):
            return pb.TopicLookupResponse(request_id=request.request_id, response_type=pb.TopicLookupResponse.Connect,
                                          broker_url=url, connect_url=url)

    class Health(pb_grpc.HealthCheckServicer):
        async def HealthCheck(self, request, context):
            return pb.HealthCheckResponse(status=pb.HealthCheckResponse.OK)

    async def serve() -> None:
        server = grpc.aio.server()
        pb_grpc.add_ProducerServiceServicer_to_server(Producers(), server)
        pb_grpc.add_DiscoveryServicer_to_server(Discovery(), server)
        pb_grpc.add_HealthCheckServicer_to_server(Health(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(serve())


def _producer_process(url: str, topic: str, name: str, messages: int, in_flight: int, out: multiprocessing.Queue) -> None:
    from danube import DanubeClientBuilder, DispatchStrategy

    async def run() -> dict:
        client = await DanubeClientBuilder().service_url(url).build()
        producer = (client.new_producer().with_topic(topic).with_name(name)
                    .with_dispatch_strategy(DispatchStrategy.RELIABLE).build())
        await producer.create()
        latencies: list[float] = []
        slots = asyncio.Semaphore(in_flight)

        async def send(i: int) -> None:
            async with slots:
                started = time.perf_counter()
                await producer.send(PAYLOAD, {"i": str(i)})
                latencies.append(time.perf_counter() - started)

        started, cpu = time.time(), time.process_time()
        await asyncio.gather(*(send(i) for i in range(messages)))
        ended, cpu = time.time(), time.process_time() - cpu
        await producer.close()
        return {"started": started, "ended": ended, "latencies": latencies, "cpu_s": cpu}

    out.put(asyncio.run(run()))


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_seconds_by_thread_name(pid: int) -> dict[str, float]:
    """CPU seconds of `pid`'s threads grouped by thread name: the native front's threads are
    `grpc-front`, Python's threads keep the interpreter's name."""
    totals: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        totals[name] = totals.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return totals


def run_case(url: str, topic: str, producers: int, messages: int, in_flight: int, server_pid: int) -> dict:
    """`producers` processes each sending `messages`; msgs/s, latency percentiles, CPU per message.

    CPU per message, of the client processes and of the server, shows which side bounds the
    rate: on 2 cores, both near 100% of a core means the machine, not the broker, is the limit.
    """
    load_before = os.getloadavg()[0]
    server_cpu = _cpu_seconds(server_pid)
    threads_before = _cpu_seconds_by_thread_name(server_pid)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_producer_process, args=(url, topic, f"bench-{i}", messages, in_flight, out))
             for i in range(producers)]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(60)
    server_cpu = _cpu_seconds(server_pid) - server_cpu
    threads_after = _cpu_seconds_by_thread_name(server_pid)
    latencies = sorted(lat for r in results for lat in r["latencies"])
    elapsed = max(r["ended"] for r in results) - min(r["started"] for r in results)
    total = len(latencies)
    return {
        "producers": producers,
        "messages": total,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(total / elapsed),
        "p50_ms": round(latencies[total // 2] * 1000, 2),
        "p99_ms": round(latencies[min(total - 1, int(total * 0.99))] * 1000, 2),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 2),
        "client_cpu_us_per_msg": round(sum(r["cpu_s"] for r in results) / total * 1e6),
        "server_cpu_us_per_msg": round(server_cpu / total * 1e6),
        "server_cpu_us_per_msg_by_thread": {
            name: round((seconds - threads_before.get(name, 0.0)) / total * 1e6)
            for name, seconds in threads_after.items() if seconds - threads_before.get(name, 0.0) > 0.005},
        "load_1m_before": round(load_before, 2),
        "load_1m_after": round(os.getloadavg()[0], 2),
    }


REAL_BROKER_MSGS_PER_S = 8891  # the same client, 64 in flight, against Danube v0.7.3 here (issue 14)


def _start_broker(workdir: Path, etcd: EmbeddedEtcd, flush_interval_ms: int,
                  grpc_front: str = "native") -> tuple[subprocess.Popen, str]:
    port = free_port()
    workdir = workdir / grpc_front
    workdir.mkdir(parents=True, exist_ok=True)
    config = {
        "broker": {"host": "127.0.0.1", "ports": {"client": port, "admin": free_port()}, "grpc_front": grpc_front},
        "meta_store": {"host": "127.0.0.1", "port": etcd.port},
        "coordination": {"leader_check_interval_seconds": 0.2},
        "wal_cloud": {
            "wal": {"dir": str(workdir / "wal"), "file_sync": {"interval_ms": flush_interval_ms, "durable": True}},
            "uploader": {"interval_seconds": 30, "root_prefix": "/danube-data"},
            "cloud": {"backend": "fs", "root": str(workdir / "cloud")},
        },
    }
    path = workdir / "broker.yaml"
    path.write_text(yaml.safe_dump(config))
    log = open(workdir / "broker.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "broker", "--config", str(path), "--log-level", "WARNING"],
                            cwd=workdir, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)})
    wait_for_port(port)
    return proc, f"http://127.0.0.1:{port}"


def _profile_broker(url: str, broker_pid: int, messages: int, in_flight: int) -> dict:
    """py-spy on the broker during an extra, untimed 1-producer run: where its CPU goes."""
    if not pyspy_profile.available():
        return {"skipped": "py-spy is not installed (pip install danube-spark[bench])"}
    with pyspy_profile.PythonProfile(pids=[broker_pid]) as prof:
        run_case(url, "/default/ingest-profile", 1, messages, in_flight, broker_pid)
    return prof.summary(top=30)  # the first ~10 inclusive rows are interpreter and thread bootstrap


def _print_table(rows: list[dict]) -> None:
    header = (f"{'target':<10}{'producers':>10}{'messages':>10}{'msgs/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
              f"{'client us/msg':>15}{'server us/msg':>15}{'ratio':>8}{'vs py':>8}")
    print(header)
    print("-" * len(header))
    for row in rows:
        print(f"{row['target']:<10}{row['producers']:>10}{row['messages']:>10}{row['msgs_per_s']:>10}"
              f"{row['p50_ms']:>9}{row['p99_ms']:>9}"
              f"{row['client_cpu_us_per_msg']:>15}{row['server_cpu_us_per_msg']:>15}"
              f"{row.get('ratio', ''):>8}{row.get('vs_python_front', ''):>8}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000, help="messages per producer")
    parser.add_argument("--in-flight", type=int, default=64, help="pipelined sends per producer")
    parser.add_argument("--flush-interval-ms", type=int, default=5, help="wal_cloud.wal.file_sync.interval_ms")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    etcd = EmbeddedEtcd(data_dir=str(workdir / "etcd"))
    baseline_port = free_port()
    ctx = multiprocessing.get_context("spawn")
    baseline = ctx.Process(target=_noop_server, args=(baseline_port,), daemon=True)
    baseline.start()
    wait_for_port(baseline_port)
    by_case: dict[tuple[str, int], dict] = {}
    profile: dict = {}
    try:
        for front, target in (("python", "broker-py"), ("native", "broker")):
            broker, url = _start_broker(workdir, etcd, args.flush_interval_ms, front)
            try:
                for producers in (1, 4):
                    if ("no-op", producers) not in by_case:
                        by_case["no-op", producers] = run_case(f"http://127.0.0.1:{baseline_port}", "/default/bench",
                                                               producers, args.messages, args.in_flight, baseline.pid)
                    by_case[target, producers] = run_case(url, f"/default/ingest-{front}-{producers}p", producers,
                                                          args.messages, args.in_flight, broker.pid)
                if front == "native":
                    profile = _profile_broker(url, broker.pid, args.messages, args.in_flight)
            finally:
                broker.send_signal(signal.SIGTERM)
                broker.wait(60)
    finally:
        baseline.terminate()
        etcd.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    rows = []
    for producers in (1, 4):
        noop, python_front = by_case["no-op", producers], by_case["broker-py", producers]
        for target in ("no-op", "broker-py", "broker"):
            row = {"target": target, **by_case[target, producers]}
            if target != "no-op":
                row["ratio"] = round(row["msgs_per_s"] / noop["msgs_per_s"], 2)
            if target == "broker":
                row["vs_python_front"] = round(row["msgs_per_s"] / python_front["msgs_per_s"], 2)
                row["vs_real_broker"] = round(row["msgs_per_s"] / REAL_BROKER_MSGS_PER_S, 2)
            rows.append(row)
    _print_table(rows)
    print(f"durable writes: fsync + ack after flush (group commit); file_sync.interval_ms={args.flush_interval_ms}")
    for row in rows:
        if row["target"] == "broker":
            print(f"{row['producers']} producer(s): {row['msgs_per_s']} msgs/s = {row['vs_real_broker']}x the real "
                  f"v0.7.3 broker's {REAL_BROKER_MSGS_PER_S} (goal >= 0.5x)")
    print(f"load average (1 min) {rows[0]['load_1m_before']} at the start, {rows[-1]['load_1m_after']} at the end")
    for entry in profile.get("own", [])[:8]:
        print(f"  broker hot path (own samples): {entry['share']:>6.1%}  {entry['function']}")
    report = {
        "benchmark": "ingest through danube-client 0.5 (100-byte messages, durable)",
        "flush": {"durable": True, "interval_ms": args.flush_interval_ms,
                  "ack": "after the WAL write + fsync (group commit, one per event-loop turn)"},
        "in_flight_per_producer": args.in_flight,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "real_broker_msgs_per_s": REAL_BROKER_MSGS_PER_S,
        "rows": rows,
        "broker_profile": profile,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
