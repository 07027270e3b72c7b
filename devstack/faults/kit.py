"""Machinery the fault battery (`bench/faults.py`) and its tests share: real processes on
loopback, fault-injecting proxies, a producer that records acknowledgements, and the checker
that counts lost and duplicated messages in Delta.

* `Etcd`: an etcd server on a fixed port and data dir, so it can be killed and restarted.
* `Broker`: one `python -m broker` process (durable acks, group commit); kill -9 and restart on
  the same WAL dir and port.
* `AckingProducer`: the official danube-client in a thread of its own, sending message i with
  a payload that names i; `acked` holds the i whose `send()` returned.
* `TcpProxy`: a loopback TCP proxy that passes, delays every chunk, or drops connections.
* `S3FaultProxy`: an HTTP proxy in front of moto answering 503 SlowDown, or resetting
  connections, while told to.
* `Pipeline`: `python -m devstack.faults.pipeline run <yaml>` (`python -m pipelines run` with the
  fault hooks passed in) in its own process group (kill -9 reaches the driver, its JVM and its
  Python workers).
* `delta_ids` + `tally`: which message ids the target and quarantine tables hold, read from
  the Delta log and Parquet files with pyarrow (no Spark), and the lost/duplicated counts.

Payloads: message i is `{"n": i}` (JSON), except every `BAD_EVERY`-th, `bad-<i>`, which the
pipeline's JSON decoder sends to the quarantine table, so both tables take part.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

import yaml

from danube_core.embedded_etcd import single_node_command
from danube_core.ports import free_port, wait_for_port
from devstack import REPO_ROOT
from devstack.short_spark_runs import SHORT_RUN_JVM_OPTIONS

BAD_EVERY = 7
T = TypeVar("T")


def poll(check: Callable[[], T | None], deadline_s: float, what: str, interval_s: float = 0.05) -> T:
    """Call `check` until truthy (returned); TimeoutError naming `what` at the deadline."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(interval_s)
    raise TimeoutError(f"{what}: not within {deadline_s:.0f}s")


def payload(i: int) -> bytes:
    return f"bad-{i}".encode() if i % BAD_EVERY == BAD_EVERY - 1 else json.dumps({"n": i}).encode()


def payload_id(raw: bytes | str) -> int:
    text = raw.decode() if isinstance(raw, bytes) else raw
    return int(text[4:]) if text.startswith("bad-") else int(json.loads(text)["n"])


# ---- processes ---------------------------------------------------------------------------

class Etcd:
    """A single-node etcd on fixed ports and a fixed data dir: `kill9()` then `start()` is a
    restart of the same member with its data."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port, self.peer_port = free_port(), free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> "Etcd":
        peer = f"http://127.0.0.1:{self.peer_port}"
        with open(self.data_dir / "etcd.log", "ab") as log:
            self.process = subprocess.Popen(single_node_command(str(self.data_dir / "data"), f"http://{self.endpoint}",
                                                                peer), stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(self.port)
        return self

    def kill9(self) -> None:
        _kill(self.process)

    def stop(self) -> None:
        _terminate(self.process)


class Broker:
    """`python -m broker` with durable acks; the same object restarts on the same WAL and port."""

    def __init__(self, workdir: Path, etcd_endpoint: str, cloud: dict, **sections: dict) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        host, etcd_port = etcd_endpoint.rsplit(":", 1)
        config: dict[str, Any] = {
            "cluster_name": "FAULTS", "auto_create_topics": True, "bootstrap_namespaces": ["default"],
            "broker": {"host": "127.0.0.1", "ports": {"client": self.port, "admin": free_port()}},
            "meta_store": {"host": host, "port": int(etcd_port)},
            "load_manager": {"load_report_interval_seconds": 1},
            "coordination": {"register_ttl_seconds": 3, "leader_ttl_seconds": 2,
                             "leader_check_interval_seconds": 0.2, "lookup_wait_seconds": 10},
            "wal_cloud": {"wal": {"dir": str(self.workdir / "wal"), "file_sync": {"interval_ms": 200, "durable": True}},
                          "uploader": {"interval_seconds": 1, "root_prefix": "/danube-data"}, "cloud": cloud},
        }
        for section, values in sections.items():
            config.setdefault(section, {}).update(values)
        self.config_path = self.workdir / "broker.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.process: subprocess.Popen | None = None

    def start(self, env: dict | None = None) -> "Broker":
        with open(self.workdir / "broker.log", "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "broker", "--config", str(self.config_path)], cwd=self.workdir,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}, stdout=log, stderr=subprocess.STDOUT)
        return self

    def wait_listening(self, deadline_s: float = 60.0) -> None:
        poll(lambda: self._alive() and _port_open(self.port), deadline_s, f"broker {self.url} listening")

    def _alive(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"broker {self.url} exited: {self.log_tail()}")
        return True

    def log_tail(self, lines: int = 30) -> str:
        path = self.workdir / "broker.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def kill9(self) -> None:
        _kill(self.process)

    def stop(self) -> None:
        _terminate(self.process, signal.SIGTERM, 30)


class Pipeline:
    """`python -m devstack.faults.pipeline run <yaml>` in a process group of its own."""

    def __init__(self, config_path: Path, log_path: Path, env: dict | None = None) -> None:
        self.config_path, self.log_path, self.env = config_path, log_path, env or {}
        self.process: subprocess.Popen | None = None

    def start(self) -> "Pipeline":
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "devstack.faults.pipeline", "run", str(self.config_path)], cwd=str(REPO_ROOT),
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **self.env}, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        return self

    @property
    def running(self) -> subprocess.Popen:
        """The process `start` started."""
        if self.process is None:
            raise RuntimeError(f"pipeline {self.config_path} was not started")
        return self.process

    def wait(self, timeout_s: float) -> int:
        """Exit code (negative: killed by that signal); the whole group is killed afterwards,
        so a driver that died leaves no JVM or Python worker behind."""
        try:
            code = self.running.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill9()
            raise TimeoutError(f"pipeline {self.config_path} still running after {timeout_s:.0f}s; "
                               f"log: {self.log_tail()}") from None
        self.kill9()
        return code

    def kill9(self) -> None:
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(30)

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def pipeline_config(root: Path, name: str, etcd: str, storage_url: str, topic: str, **source: Any) -> Path:
    """A JSON pipeline (inline schema `{"n": integer}`, bad payloads quarantined) under `root`."""
    root.mkdir(parents=True, exist_ok=True)
    config = {
        "name": name,
        "source": {"etcd_endpoints": etcd, "storage_url": storage_url, "topics": [topic], "subscription": name,
                   "starting_offsets": "earliest", "max_messages_per_trigger": 200, **source},
        "decode": {"format": "json", "on_error": "quarantine",
                   "inline_schema": json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}})},
        "target": {"path": str(root / "target")},
        "quarantine": {"path": str(root / "quarantine")},
        "checkpoint": str(root / "checkpoint"),
        "trigger": {"mode": "availableNow"},
        # local[2,4]: a failed task is retried (up to 4 attempts) as on a cluster. A pipeline run
        # here is short (a JVM per run, a few small batches): the C1 compiler alone and the serial
        # GC halve the driver JVM's CPU seconds (measured: 43 s -> 23 s for a session and a first
        # Delta write), which is most of what a run costs on a busy 2-core machine.
        "spark_conf": {"spark.master": "local[2,4]", "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                       "spark.python.authenticate.socketTimeout": "120s",
                       "spark.driver.extraJavaOptions": SHORT_RUN_JVM_OPTIONS},
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _kill(process: subprocess.Popen | None) -> None:
    if process is not None and process.poll() is None:
        process.kill()
        process.wait(30)


def _terminate(process: subprocess.Popen | None, sig: int = signal.SIGTERM, grace_s: float = 10) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        _kill(process)


# ---- the producer ------------------------------------------------------------------------

class AckingProducer:
    """Sends message 0, 1, 2, ... through the official client, one at a time, in its own
    thread and event loop; `acked` gets i once `send(i)` returned, with the time it did.

    `rate_per_s` paces the sends (at most that many a second): a producer that runs through a
    fault then sends what the fault's length calls for, not as many as the machine can (an
    unpaced one sent 4,000 messages through a 4 s S3 fault, which the pipeline then took
    minutes to drain).

    A send that fails is not acknowledged: it may or may not be stored, and it is not retried
    under the same id (a retry is a new message), so "acknowledged" is exactly what the client
    was told was written."""

    def __init__(self, url: str, topic: str, limit: int | None = None, rate_per_s: float | None = None, *,
                 partitions: int = 0, make_payload: Callable[[int], bytes] = payload,
                 send_timeout_s: float | None = None) -> None:
        """`partitions`: a partitioned topic's partition count (the client spreads the sends
        round-robin); `make_payload`: message i's payload, which must name i (`payload_id`);
        `send_timeout_s`: a send (or the producer's creation) not answered within it fails,
        and any failed send has the producer built anew (fresh lookups of every partition), as
        an application would whose producer got stuck (the soak: its brokers die, move topics
        and come back while it sends; None: the client alone recovers, without a deadline)."""
        self.url, self.topic, self.limit, self.rate_per_s = url, topic, limit, rate_per_s
        self.partitions, self.make_payload, self.send_timeout_s = partitions, make_payload, send_timeout_s
        self.sent: list[int] = []
        self.acked: list[int] = []
        self.ack_times: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> "AckingProducer":
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def first_ack_after(self, moment: float) -> float | None:
        return next((t for t in self.ack_times if t >= moment), None)

    async def _run(self) -> None:
        from danube import DanubeClientBuilder, DispatchStrategy, ProducerOptions

        producer = None
        paced_from, paced_sends = time.monotonic(), 0
        while not self._stop.is_set() and (self.limit is None or len(self.sent) < self.limit):
            i = len(self.sent)
            if self.rate_per_s:
                await asyncio.sleep(max(0.0, paced_from + paced_sends / self.rate_per_s - time.monotonic()))
                paced_sends += 1
            try:
                if producer is None:
                    client = await asyncio.wait_for(DanubeClientBuilder().service_url(self.url).build(),
                                                    self.send_timeout_s)
                    builder = (client.new_producer().with_topic(self.topic).with_name(f"faults-{os.getpid()}")
                               .with_dispatch_strategy(DispatchStrategy.RELIABLE)
                               .with_options(ProducerOptions(max_retries=3, base_backoff_ms=100)))
                    if self.partitions:
                        builder = builder.with_partitions(self.partitions)
                    built = builder.build()
                    await asyncio.wait_for(built.create(), self.send_timeout_s)
                    producer = built
                self.sent.append(i)
                await asyncio.wait_for(producer.send(self.make_payload(i), {"i": str(i)}), self.send_timeout_s)
                self.acked.append(i)
                self.ack_times.append(time.monotonic())
            except Exception as exc:  # not acknowledged (the client reconnects by itself)
                self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                if self.send_timeout_s is not None and producer is not None:
                    await _close_quietly(producer)
                    producer = None
                await asyncio.sleep(0.05)
        if producer is not None:
            await _close_quietly(producer)


async def _close_quietly(producer: Any) -> None:
    try:
        await asyncio.wait_for(producer.close(), 10)
    except Exception:
        pass


# ---- the checker -------------------------------------------------------------------------

def delta_ids(table: Path) -> Counter:
    """Message id -> times present, over a Delta table's live files (no Spark)."""
    import pyarrow.parquet as pq

    log = Path(table) / "_delta_log"
    if not log.is_dir():
        return Counter()
    files: set[str] = set()
    for commit in sorted(log.glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                files.add(action["add"]["path"])
            elif "remove" in action:
                files.discard(action["remove"]["path"])
    found: Counter = Counter()
    for rel in files:
        columns = pq.read_schema(Path(table) / _unquote(rel)).names
        column = "n" if "n" in columns and "payload" not in columns else "payload"
        for value in pq.read_table(Path(table) / _unquote(rel), columns=[column]).column(column).to_pylist():
            found[value if column == "n" else payload_id(value)] += 1
    return found


def _unquote(path: str) -> str:
    from urllib.parse import unquote

    return unquote(path)


def tally(produced: Iterable[int], acked: Iterable[int], tables: Iterable[Path]) -> dict[str, int]:
    """rows in Delta, acknowledged messages missing (lost), extra copies (duplicated), and ids
    present that nobody produced (foreign, must be 0)."""
    found: Counter = Counter()
    for table in tables:
        found.update(delta_ids(table))
    acked, produced = set(acked), set(produced)
    return {
        "rows": sum(found.values()),
        "lost": len(acked - set(found)),
        "duplicated": sum(n - 1 for n in found.values() if n > 1),
        "foreign": len(set(found) - produced),
    }


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
