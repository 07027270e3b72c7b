"""Broker processes for integration tests: `python -m broker` as a user starts it.

Each broker gets its own config file, port and WAL directory inside the test's tmp dir; the
brokers of one test share the session's etcd and one cloud-storage directory. Lease TTLs and
intervals are short so failover tests finish in seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
import yaml

from danube_core.errors import DanubeError
from danube_core.keys import REGISTER_PREFIX, register_key
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.ports import free_port, stop_process
from tests.rig import eventually

REPO_ROOT = Path(__file__).resolve().parents[2]


def broker_config(etcd_endpoint: str, port: int, wal_dir: str, cloud_root: str, **overrides: dict) -> dict:
    host, etcd_port = etcd_endpoint.rsplit(":", 1)
    config = {
        "cluster_name": "TEST_CLUSTER",
        "broker": {"host": "127.0.0.1", "ports": {"client": port, "admin": free_port()}},
        "meta_store": {"host": host, "port": int(etcd_port)},
        "bootstrap_namespaces": ["default"],
        "auto_create_topics": True,
        "load_manager": {"load_report_interval_seconds": 1},
        "coordination": {"register_ttl_seconds": 3, "leader_ttl_seconds": 2,
                         "leader_check_interval_seconds": 0.2, "lookup_wait_seconds": 10},
        "subscriptions": {"max_unacked_messages": 1000, "cursor_flush_every_acks": 100,
                          "cursor_flush_interval_seconds": 0.2},
        "wal_cloud": {
            "wal": {"dir": wal_dir, "file_sync": {"interval_ms": 200, "durable": True}},
            "uploader": {"interval_seconds": 1, "root_prefix": "/danube-data"},
            "cloud": {"backend": "fs", "root": cloud_root},
        },
    }
    for section, values in overrides.items():
        config.setdefault(section, {}).update(values)
    return config


class BrokerProcess:
    """One `python -m broker` subprocess; `start()` returns once it is registered in etcd.

    A second object with the same `name` and `port` is the same broker restarted: same config
    file and WAL directory (a new process; a new broker id unless it resumed its registration).

    `stop()` of a killed broker waits until its registration has expired, unless a restarted
    process holds it: a later test's leader would otherwise place topics on the dead broker
    during the rest of its lease, and that test's clients would be sent to a closed port.
    """

    running: list["BrokerProcess"] = []  # started and not stopped or killed, in this test process

    def __init__(self, etcd_endpoint: str, workdir: Path, name: str, cloud_root: str, port: int | None = None,
                 etcd_client: dict | None = None, env: dict | None = None, **overrides: dict) -> None:
        self.etcd_endpoint = etcd_endpoint
        self.etcd_client = etcd_client or {}  # EtcdMetadataStore options (credentials, TLS) for checks
        self.env = env or {}  # extra environment, e.g. DANUBE_META_STORE__PASSWORD
        self.workdir = workdir / name
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.wal_dir = str(self.workdir / "wal")
        self.config_path = self.workdir / "broker.yaml"
        config = broker_config(etcd_endpoint, self.port, self.wal_dir, cloud_root, **overrides)
        self.config_path.write_text(yaml.safe_dump(config))
        self.process: subprocess.Popen | None = None
        self.broker_id: int | None = None

    def start(self, deadline_s: float = 30.0) -> "BrokerProcess":
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **self.env}
        self._log = open(self.workdir / "broker.log", "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "broker", "--config", str(self.config_path)],
            cwd=self.workdir, env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )
        self.broker_id = eventually(self._registered_id, deadline_s, 0.1)
        BrokerProcess.running.append(self)
        return self

    def _registered_id(self) -> int | None:
        assert self.process.poll() is None, f"broker {self.name} exited: {self.log_tail()}"
        with EtcdMetadataStore(self.etcd_endpoint, **self.etcd_client) as store:
            for key, raw in store.get_prefix(REGISTER_PREFIX):
                if json.loads(raw)["broker_url"] == self.url:
                    return int(key[len(REGISTER_PREFIX):])
        return None

    def log_tail(self, lines: int = 40) -> str:
        path = self.workdir / "broker.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (topics handed over), then SIGKILL if it does not exit in time."""
        if self in BrokerProcess.running:
            BrokerProcess.running.remove(self)
        if self.process is None or self.process.poll() is not None:
            self._wait_registration_gone()
            return
        stop_process(self.process, timeout_s)
        self._log.close()

    def kill(self) -> None:
        """kill -9: no handover, registration left to expire."""
        if self in BrokerProcess.running:
            BrokerProcess.running.remove(self)
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
            self._log.close()

    def _wait_registration_gone(self, deadline_s: float = 30.0) -> None:
        if self.broker_id is None or any(p.broker_id == self.broker_id for p in BrokerProcess.running):
            return
        key = register_key(self.broker_id)
        try:
            with EtcdMetadataStore(self.etcd_endpoint, **self.etcd_client) as store:
                eventually(lambda: store.get(key) is None, deadline_s, 0.1)
        except DanubeError:
            pass  # etcd itself is down (a fault test): nothing can be placed on the dead broker


def run_admin(etcd_endpoint: str, *args: str) -> list[dict]:
    """`python -m broker.admin --etcd ... args`; the JSON lines it printed."""
    result = subprocess.run(
        [sys.executable, "-m", "broker.admin", "--etcd", etcd_endpoint, *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert result.returncode == 0, f"admin {args} failed ({result.returncode}): {result.stderr}"
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


@contextlib.contextmanager
def running_broker(etcd_endpoint: str, tmp_path_factory: Any, label: str) -> Iterator[BrokerProcess]:
    """One started broker with its own WAL and cloud directories, stopped on exit (module fixtures)."""
    proc = BrokerProcess(etcd_endpoint, tmp_path_factory.mktemp(label), "a",
                         str(tmp_path_factory.mktemp(f"{label}-cloud"))).start()
    try:
        yield proc
    finally:
        proc.stop()


async def expect_status(code: grpc.StatusCode, call: Any, *words: str) -> str:
    """Await a gRPC call that must fail with `code` and details naming every one of `words`."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value.details()
    for word in words:
        assert word in info.value.details()
    return info.value.details()


async def reliable_producer(url: str, topic: str, name: str, options: Any = None) -> tuple[Any, Any]:
    """(client, created producer) of danube-client: a Reliable producer `name` on `topic`, with
    `options` (a `ProducerOptions`: retries, backoff) if given."""
    from danube import DanubeClientBuilder, DispatchStrategy

    client = await DanubeClientBuilder().service_url(url).build()
    builder = client.new_producer().with_topic(topic).with_name(name).with_dispatch_strategy(DispatchStrategy.RELIABLE)
    producer = (builder if options is None else builder.with_options(options)).build()
    await producer.create()
    return client, producer
