"""A single-node Apache Kafka (KRaft) on loopback, from jars fetched from Maven Central.

The Kafka baseline (`bench/bench_kafka.py`) needs a real broker, and this machine has no
Kafka install: as Spark fetches Delta's jars, `fetch_kafka_jars` resolves
`org.apache.kafka:kafka_<scala>:<version>` and its runtime dependencies with Ivy (the
`ivy-*.jar` PySpark ships, the resolver behind `spark.jars.packages`) into a cache directory
(`~/.cache/danube-bench/kafka-<version>` by default), once. `KafkaNode` then formats a
fresh log directory and runs `kafka.Kafka` as broker + controller of a one-voter quorum.

    with KafkaNode(fetch_kafka_jars()) as kafka:
        kafka.bootstrap          # "127.0.0.1:<port>"
        tree_cpu_s(kafka.pid)    # the broker's CPU, counted on its own side

The broker's own CPU is what a comparison must add to Kafka's side: the Spark side of a
Kafka read does less work because the broker serves ready record batches.
"""

from __future__ import annotations

import base64
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from danube_core.ports import stop_process

KAFKA_VERSION = "4.1.2"
SCALA_BINARY = "2.13"
CACHE_ROOT = Path(os.environ.get("DANUBE_BENCH_CACHE", Path.home() / ".cache" / "danube-bench"))
START_TIMEOUT_S = 120.0


class KafkaServerError(RuntimeError):
    """The Kafka jars could not be fetched or the node did not start (its log is named)."""


def _ivy_jar() -> Path:
    import pyspark

    found = sorted(glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "ivy-*.jar")))
    if not found:
        raise KafkaServerError("no ivy-*.jar in pyspark/jars: cannot resolve the Kafka jars from Maven Central")
    return Path(found[-1])


def fetch_kafka_jars(version: str = KAFKA_VERSION, cache: Path = CACHE_ROOT) -> Path:
    """The directory of the Kafka server's jars, resolved from Maven Central on first use."""
    lib = cache / f"kafka-{SCALA_BINARY}-{version}" / "lib"
    done = lib / ".complete"
    if done.exists():
        return lib
    staging = Path(tempfile.mkdtemp(prefix="kafka-lib-", dir=cache if cache.exists() else None))
    cache.mkdir(parents=True, exist_ok=True)
    command = ["java", "-jar", str(_ivy_jar()), "-cache", str(cache / "ivy"),
               "-dependency", "org.apache.kafka", f"kafka_{SCALA_BINARY}", version,
               "-retrieve", f"{staging}/[artifact]-[revision](-[classifier]).[ext]"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0 or not list(staging.glob(f"kafka_{SCALA_BINARY}-{version}.jar")):
        raise KafkaServerError(f"resolving org.apache.kafka:kafka_{SCALA_BINARY}:{version} from Maven Central "
                               f"failed (exit {result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    for extra in staging.glob("*-javadoc.jar"):
        extra.unlink()
    for extra in staging.glob("*-sources.jar"):
        extra.unlink()
    if lib.exists():
        shutil.rmtree(lib)
    lib.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(lib)
    done.write_text(version)
    return lib


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cluster_id() -> str:
    """A Kafka Uuid as `kafka-storage random-uuid` prints it: 16 bytes, URL-safe base64."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


class KafkaNode:
    """One KRaft node (broker + controller) on 127.0.0.1 with a fresh log directory.

    Replication factors are 1 and topics are created with `partitions` partitions when a
    client writes to one that does not exist. `heap` is the JVM's -Xmx.
    """

    def __init__(self, lib: Path, *, heap: str = "1g", partitions: int = 1) -> None:
        self.lib = lib
        self.heap = heap
        self.partitions = partitions
        self.dir = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
        self.port, self.controller_port = _free_port(), _free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the node is not started"
        return self.proc.pid

    def _properties(self) -> Path:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.dir / "logs"),
            "num.partitions": str(self.partitions),
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "true",
        }
        path = self.dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def _java(self, main: str, *args: str) -> list[str]:
        return ["java", f"-Xmx{self.heap}", "-Xms256m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                "-cp", f"{self.lib}/*", main, *args]

    def start(self) -> "KafkaNode":
        props = self._properties()
        # `--cluster-id=...` in one argument: a URL-safe base64 id may start with "-", which as a
        # separate argument the tool's parser takes for an option (then "expected one argument").
        fmt = subprocess.run(self._java("kafka.tools.StorageTool", "format", f"--cluster-id={_cluster_id()}",
                                        "-c", str(props)), capture_output=True, text=True)
        if fmt.returncode != 0:
            raise KafkaServerError(f"kafka-storage format failed (exit {fmt.returncode}): {fmt.stdout}{fmt.stderr}")
        log = open(self.dir / "server.log", "ab")
        self.proc = subprocess.Popen(self._java("kafka.Kafka", str(props)), stdout=log, stderr=subprocess.STDOUT,
                                     cwd=self.dir, start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise KafkaServerError(f"Kafka exited with {self.proc.returncode}; see {self.dir / 'server.log'}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise KafkaServerError(f"Kafka did not listen on {self.bootstrap} within {START_TIMEOUT_S:.0f} s")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, 60.0)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "KafkaNode":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
