"""An embedded speed layer for the demo and the benchmarks: one master, workers and a gateway,
each a real `python -m speedlayer ...` process on loopback, against a given etcd.

`EmbeddedSpeedLayer(root, etcd).start(workers=1)` starts them (logs in `root/*.log`);
`admit(tenant, dataset, table)` admits a Delta table and waits until it is READY on as many
workers as its replication; `stop()` stops every process it started (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from danube_core.ports import free_port, stop_processes, wait_for_port
from devstack import REPO_ROOT

if TYPE_CHECKING:
    from speedlayer.clients import ManagementClient


class EmbeddedSpeedLayer:
    def __init__(self, root: Path, etcd_endpoint: str, *, key_root: str = "/speedlayer", tenant: str = "demo",
                 heartbeat_s: int = 1, etcd: Mapping[str, Any] | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        """`etcd`: more keys of the `etcd:` section (a secured etcd's `user`, `ca_cert`, ...);
        `env`: environment of every process (its `SPEEDLAYER_ETCD__PASSWORD`, kept out of the file)."""
        self.root, self.etcd_endpoint, self.tenant = Path(root), etcd_endpoint, tenant
        self.env = dict(env or {})
        self.root.mkdir(parents=True, exist_ok=True)
        self.config_path = self.root / "speedlayer.yaml"
        self.master_port, self.gateway_port = free_port(), free_port()
        self.config_path.write_text(json.dumps({
            "etcd": {"endpoints": etcd_endpoint, "key_root": key_root, **(etcd or {})},
            "master": {"port": self.master_port, "election_ttl_seconds": 2, "heartbeat_interval_seconds": heartbeat_s,
                       "audit_log": str(self.root / "audit.jsonl")},
            "gateway": {"port": self.gateway_port},
        }))
        self.processes: dict[str, subprocess.Popen] = {}
        self._client: ManagementClient | None = None  # set by start()

    @property
    def master(self) -> str:
        return f"127.0.0.1:{self.master_port}"

    @property
    def gateway(self) -> str:
        return f"127.0.0.1:{self.gateway_port}"

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        log = open(self.root / f"{name}.log", "ab")
        # start_new_session: a terminal's Ctrl-C reaches the demo only, which stops these in order
        process = subprocess.Popen([sys.executable, "-m", "speedlayer", *args], stdout=log,
                                   stderr=subprocess.STDOUT, env=env, cwd=self.root, start_new_session=True)
        self.processes[name] = process
        return process

    def start(self, workers: int = 1, worker_memory_mb: int = 2048, worker_threads: int = 2) -> "EmbeddedSpeedLayer":
        from speedlayer.clients import ManagementClient

        self._spawn("master", "master", "--config", str(self.config_path), "--id", "m1")
        wait_for_port(self.master_port)
        for i in range(1, workers + 1):
            self.start_worker(f"w{i}", worker_memory_mb, worker_threads)
        self._spawn("gateway", "gateway", "--config", str(self.config_path))
        wait_for_port(self.gateway_port)
        client = self._client = ManagementClient([self.master], deadline_s=60)
        self._wait(lambda: len(client.workers(self.tenant).workers) >= workers, 60, "workers registered")
        return self

    def start_worker(self, worker_id: str, memory_mb: int = 2048, threads: int = 2) -> subprocess.Popen:
        return self._spawn(f"worker-{worker_id}", "worker", "--tenant", self.tenant, "--id", worker_id,
                           "--masters", self.master, "--memory-mb", str(memory_mb), "--threads", str(threads))

    def admit(self, dataset: str, table_uri: str, *, replication: int = 1, timeout_s: float = 120,
              tail_pipeline: str | None = None, tail_limit_rows: int = 1_000_000) -> str:
        """Admit a Delta table; returns the epoch once READY on `replication` workers.
        `tail_pipeline`: the text of the pipeline file writing the table, to serve its topic's tail."""
        from speedlayer.api.v1 import management_service_pb2 as mg
        from speedlayer.clients import delta_request

        client = self._client
        assert client is not None, "admit() after start()"
        tail = (mg.TailOptions(pipeline_config=tail_pipeline, limit_rows=tail_limit_rows)
                if tail_pipeline is not None else None)
        reply = client.admit(delta_request(self.tenant, dataset, table_uri, replication=replication, tail=tail))
        if reply.status not in ("ASSIGNED", "PLANNED"):
            raise RuntimeError(f"admission of {table_uri} refused: {reply.status} {reply.message}")

        def ready() -> bool:
            status = client.status(self.tenant, dataset, reply.epoch_id)
            return sum(r.state == "READY" for e in status.epochs for r in e.replicas) >= replication

        self._wait(ready, timeout_s, f"epoch {reply.epoch_id} READY")
        return reply.epoch_id

    def wait_queryable(self, dataset: str, timeout_s: float = 30) -> None:
        """Until the gateway (its etcd cache) routes queries on `dataset`."""
        from speedlayer.clients import query
        from speedlayer.errors import ReplicaUnavailableError

        def answered() -> bool:
            try:
                query(self.gateway, self.tenant, dataset, f"SELECT 1 AS one FROM {dataset} LIMIT 1")
                return True
            except ReplicaUnavailableError:
                return False

        self._wait(answered, timeout_s, f"{dataset} queryable through the gateway")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        process = self.processes.pop(name)
        process.send_signal(sig)
        process.wait(10)

    def _wait(self, check, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            dead = [n for n, p in self.processes.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"speed layer: {what} not reached (exited: {dead}; logs in {self.root})")
            time.sleep(0.1)

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
        stop_processes(self.processes.values())
        self.processes.clear()
