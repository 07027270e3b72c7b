"""The whole platform on this machine, started as a user would run it, for the soak.

* etcd: a three-member cluster (`devstack.chaos.etcd_cluster`), reached by every part through
  one front (`devstack.faults.proxies.FaultProxy` over all three members, each connection to the
  next member that accepts: the load balancer a broker needs, its `meta_store` naming one
  endpoint; the etcd_slow fault delays it);
* S3: `python -m moto.server` behind a fault proxy (503 SlowDown, resets, delays);
* two brokers (`devstack.faults.kit.Broker`, durable acks) in one cluster on that S3, each WAL on
  a tmpfs of its own when the disk_full fault may fill it (`devstack.chaos.wal_disk`);
* topic A, three partitions, and topic B, one, each with an acking producer at a steady rate
  (`devstack.faults.kit.AckingProducer`: every ack recorded; unique ids);
* pipeline A (A into Delta, decode failures quarantined) and pipeline B (B into Delta, with a
  great-expectations rule quarantining negative amounts), `processingTime` streams run by
  `python -m devstack.faults.pipeline run` (the product's command, hooks inert), each announcing
  its commits to the speed layer;
* the speed layer (`devstack.chaos.speed`): two masters, three workers, a gateway; both target
  tables admitted (replication 2) and followed.

Every process is a supervised part (`devstack.chaos.supervisor`). A part that cannot start stops
the soak with `PartFailedError`, naming the part and why.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from functools import partial
from typing import Any, Callable

import yaml

from devstack.chaos import wal_disk
from devstack.chaos.etcd_cluster import EtcdCluster
from devstack.chaos.speed import KEY_ROOT, TENANT, SoakSpeedLayer
from devstack.chaos.supervisor import Part, Supervisor
from devstack.faults.kit import BAD_EVERY, REPO_ROOT, AckingProducer, Broker, Pipeline, payload, pipeline_config, poll
from devstack.faults.proxies import FaultProxy
from danube_core.ports import free_port, wait_for_port

PARTITIONS_A = 3
SEND_TIMEOUT_S = 20.0  # a send unanswered this long fails, and the producer is built anew
AMOUNT_BAD_EVERY = 5


class PartFailedError(RuntimeError):
    """A part of the platform did not start: the soak stops, naming it and why."""

    def __init__(self, part: str, why: str) -> None:
        super().__init__(f"soak: {part} could not start: {why}")
        self.part = part


def payload_b(i: int) -> bytes:
    """Topic B's message i: a decode failure every `BAD_EVERY`-th, a negative amount (which
    the expectations quarantine) every `AMOUNT_BAD_EVERY`-th, else a valid row."""
    if i % BAD_EVERY == BAD_EVERY - 1:
        return payload(i)
    amount = -1.0 if i % AMOUNT_BAD_EVERY == AMOUNT_BAD_EVERY - 1 else float(i % 1000)
    return json.dumps({"n": i, "amount": amount}).encode()


@dataclass
class Stream:
    """One topic's producer and the pipeline that lands it: names, paths and the dataset."""

    name: str          # "a" or "b"
    topic: str
    partitions: int
    config: Path
    subscription: str
    producer: AckingProducer | None = None

    @property
    def target(self) -> Path:
        return self.config.parent / "target"

    @property
    def quarantine(self) -> Path:
        return self.config.parent / "quarantine"

    @property
    def dataset(self) -> str:
        return f"soak_{self.name}"

    @property
    def topic_partitions(self) -> list[str]:
        return [f"{self.topic}-part-{p}" for p in range(self.partitions)] if self.partitions else [self.topic]


class Platform:
    """Everything under `root`; `start()` brings it up in order, `stop()` takes it down."""

    def __init__(self, root: Path, rate_per_s: float, started: float, wal_tmpfs: bool = False) -> None:
        """`wal_tmpfs`: each broker's WAL on a tmpfs of its own (`devstack.chaos.wal_disk`), for
        the disk_full fault."""
        self.root = Path(root)
        self.wal_tmpfs = wal_tmpfs
        self.mounted: list[Path] = []
        self.rate_per_s = rate_per_s
        self.supervisor = Supervisor(started)
        self.etcd = EtcdCluster(self.root / "etcd")
        self.front: FaultProxy | None = None
        self.s3: FaultProxy | None = None
        self.brokers: dict[str, Broker] = {}
        self.streams: dict[str, Stream] = {}
        self.speed: SoakSpeedLayer | None = None
        self.bucket = f"soak-{uuid.uuid4().hex[:8]}"

    @property
    def front_endpoint(self) -> str:
        assert self.front is not None
        return self.front.endpoint

    def start(self, say: Callable[[str], None]) -> "Platform":
        steps = [("etcd cluster (3 members)", self._start_etcd), ("S3 (moto server)", self._start_s3),
                 ("brokers", self._start_brokers), ("topics", self._create_topics),
                 ("producers", self._start_producers), ("pipelines", self._start_pipelines),
                 ("speed layer", self._start_speed_layer), ("admission", self._admit)]
        self.supervisor.run()
        for part, step in steps:
            began = time.monotonic()
            try:
                step()
            except PartFailedError:
                raise
            except Exception as exc:
                raise PartFailedError(part, f"{type(exc).__name__}: {exc}") from exc
            say(f"started {part} in {time.monotonic() - began:.1f}s")
        return self

    def _start_etcd(self) -> None:
        for member in self.etcd.members:
            self.supervisor.add(Part(member.name, "etcd", member.start, member.root / "etcd.log"))
        for member in self.etcd.members:
            wait_for_port(member.port, 60)
        self.front = FaultProxy(*self.etcd.ports)
        from danube_core.metadata_etcd import EtcdMetadataStore

        with EtcdMetadataStore(self.etcd.endpoints) as store:
            poll(lambda: _put(store), 60, "the etcd cluster accepting a write", 0.5)

    def _start_s3(self) -> None:
        port = free_port()
        log = self.root / "moto.log"
        self.supervisor.add(Part("moto", "s3", lambda: _moto(port, log), log))
        wait_for_port(port, 60)
        self.s3 = FaultProxy(port)
        import boto3

        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="testing",
                     aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket=self.bucket)

    @property
    def s3_endpoint(self) -> str:
        assert self.s3 is not None
        return f"http://{self.s3.endpoint}"

    def _start_brokers(self) -> None:
        cloud = {"backend": "s3", "root": f"s3://{self.bucket}", "endpoint": self.s3_endpoint, "region": "us-east-1",
                 "access_key": "testing", "secret_key": "testing"}
        for name in ("b0", "b1"):
            broker = Broker(self.root / name, self.front_endpoint, cloud, coordination={"register_ttl_seconds": 6})
            if self.wal_tmpfs:
                wal_disk.mount(broker.workdir / "wal")
                self.mounted.append(broker.workdir / "wal")
            self.brokers[name] = broker
            self.supervisor.add(Part(name, "broker", partial(_started, broker), broker.workdir / "broker.log"))
        for broker in self.brokers.values():
            broker.wait_listening(90)

    def _create_topics(self) -> None:
        suffix = uuid.uuid4().hex[:6]
        for name, partitions in (("a", PARTITIONS_A), ("b", 0)):
            topic = f"/default/soak-{name}-{suffix}"
            extra = ["--partitions", str(partitions)] if partitions else []
            _admin(self.etcd.endpoints, "topics", "create", topic, *extra)
            subscription = f"soak-{name}-{suffix}"
            config = self._pipeline_file(name, topic, subscription)
            self.streams[name] = Stream(name, topic, partitions, config, subscription)

    def _pipeline_file(self, name: str, topic: str, subscription: str) -> Path:
        storage = {"key": "testing", "secret": "testing",
                   "client_kwargs": {"endpoint_url": self.s3_endpoint, "region_name": "us-east-1"}}
        path = pipeline_config(self.root / f"pipeline-{name}", subscription, self.front_endpoint,
                               f"s3://{self.bucket}", topic, storage_options=storage, max_messages_per_trigger=5000)
        config = yaml.safe_load(path.read_text())
        config["trigger"] = {"mode": "processingTime", "interval": "3 seconds"}
        config["speedlayer"] = {"tenant": TENANT, "dataset": f"soak_{name}", "key_root": KEY_ROOT}
        if name == "b":
            config["decode"]["inline_schema"] = json.dumps(
                {"type": "object", "properties": {"n": {"type": "integer"}, "amount": {"type": "number"}}})
            config["expectations"] = {"suite": "soak_b", "rules": [
                {"type": "expect_column_values_to_be_between", "kwargs": {"column": "amount", "min_value": 0}}]}
        path.write_text(yaml.safe_dump(config))
        return path

    def _start_producers(self) -> None:
        brokers = list(self.brokers.values())
        for (name, stream), broker in zip(sorted(self.streams.items()), brokers):
            stream.producer = AckingProducer(broker.url, stream.topic, rate_per_s=self.rate_per_s,
                                             partitions=stream.partitions, send_timeout_s=SEND_TIMEOUT_S,
                                             make_payload=payload_b if name == "b" else payload).start()
        for stream in self.streams.values():
            assert stream.producer is not None
            producer = stream.producer
            poll(partial(_first_ack, producer), 120, f"a first ack on {stream.topic}")
            if not producer.acked:
                raise PartFailedError("producers", f"{stream.topic}: {producer.errors[-3:]}")

    def _start_pipelines(self) -> None:
        for name, stream in self.streams.items():
            log = stream.config.parent / "pipeline.log"
            pipe = Pipeline(stream.config, log)
            self.supervisor.add(Part(f"pipeline-{name}", "pipeline", partial(_started, pipe), log, group=True))
        for stream in self.streams.values():
            poll(partial(self._first_commit, stream), 600,
                 f"pipeline {stream.name}'s first commit to {stream.target}", 0.5)

    def _first_commit(self, stream: Stream) -> bool:
        return self._pipeline_alive(stream) and any((stream.target / "_delta_log").glob("*.json"))

    def _pipeline_alive(self, stream: Stream) -> bool:
        part = self.supervisor.parts[f"pipeline-{stream.name}"]
        failed = [e for e in self.supervisor.exits if e.part == part.name and not e.by_fault]
        if len(failed) >= 3:
            raise PartFailedError(f"pipeline {stream.name}", f"exited {len(failed)} times: {failed[-1].said}")
        return True

    def _start_speed_layer(self) -> None:
        self.speed = SoakSpeedLayer(self.root / "speedlayer", self.front_endpoint)
        for part in self.speed.parts():
            self.supervisor.add(part)
        self.speed.wait_started()

    def _admit(self) -> None:
        assert self.speed is not None
        for stream in self.streams.values():
            self.speed.admit(stream.dataset, str(stream.target), replication=2, timeout_s=180)
            self.speed.wait_queryable(stream.dataset, 60)

    def stop(self) -> None:
        for stream in self.streams.values():
            if stream.producer is not None:
                stream.producer.stop(30)
        self.supervisor.stop()
        if self.speed is not None and self.speed._client is not None:
            self.speed._client.close()
        for proxy in (self.front, self.s3):
            if proxy is not None:
                proxy.close()
        for directory in self.mounted:
            wal_disk.unmount(directory)


def _started(thing: Broker | Pipeline) -> subprocess.Popen:
    thing.start()
    assert thing.process is not None
    return thing.process


def _first_ack(producer: AckingProducer) -> bool:
    return bool(producer.acked) or producer.done()


def _put(store: Any) -> bool:
    try:
        store.put("/soak/ready", b"1")
        return True
    except Exception:
        return False


def _moto(port: int, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)


def _admin(etcd: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "broker.admin", "--etcd", etcd, *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"broker.admin {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout
