"""A speed layer cluster of real processes for tests and benchmarks: etcd, masters, workers.

The cluster's keys live under a key root of their own, on an etcd it is given (the test
session's, shared with every other cluster and broker) or on one it starts itself, which it
can then stop and restart (`restart_etcd`).

Every master and worker is a `python -m speedlayer ...` subprocess whose output goes to a log
file in the cluster's directory (printed by `dump_logs` when a test fails). Timings are short
(election TTL 2 s, heartbeats 1 s, reassignment delay 1 s) so failures are detected quickly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from danube_core.embedded_etcd import single_node_command
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.ports import free_port, stop_process, stop_processes, wait_for_port
from devstack import REPO_ROOT
from speedlayer.clients import ManagementClient
from speedlayer.keys import SpeedLayerKeys
from speedlayer.records import GlobalConfig, TenantConfig


class RestartableEtcd:
    """A single-node etcd on fixed ports and data dir, so it can be stopped and started again."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port, self.peer_port = free_port(), free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        peer = f"http://127.0.0.1:{self.peer_port}"
        log = open(self.data_dir / "etcd.log", "ab")
        self.process = subprocess.Popen(single_node_command(str(self.data_dir / "data"), f"http://{self.endpoint}", peer),
                                        stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(self.port)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)


class SpeedLayerCluster:
    def __init__(self, root: Path, *, election_ttl_s: int = 2, heartbeat_s: int = 1,
                 reassign_delay_s: float = 1.0, strategy: str = "rendezvous",
                 delta_storage_options: dict[str, str] | None = None, etcd_endpoint: str | None = None) -> None:
        """`etcd_endpoint`: an etcd to share (the cluster starts its own without one)."""
        self.root = root
        self.own_etcd = RestartableEtcd(root / "etcd") if etcd_endpoint is None else None
        self.etcd_endpoint = etcd_endpoint or self.own_etcd.endpoint  # type: ignore[union-attr]
        # A shared etcd: keys under a root of this cluster's own; its own etcd: the seed's layout.
        self.keys = SpeedLayerKeys(root=f"/speedlayer-{uuid.uuid4().hex[:8]}" if etcd_endpoint else "")
        self.config_path = root / "speedlayer.yaml"
        self.config_path.write_text(json.dumps({
            "etcd": self._etcd_section(),
            "master": {"election_ttl_seconds": election_ttl_s, "heartbeat_interval_seconds": heartbeat_s},
            "sources": {"delta": {"storage_options": delta_storage_options or {}}},
        }))
        self.masters: dict[str, tuple[subprocess.Popen, int]] = {}
        self._ports: dict[str, int] = {}
        self.workers: dict[str, subprocess.Popen] = {}
        self.gateways: dict[str, tuple[subprocess.Popen, int]] = {}
        self.metadata = EtcdMetadataStore(self.etcd_endpoint)
        self.set_global(GlobalConfig(reassign_delay_s=reassign_delay_s, strategy=strategy))
        self._clients: list[ManagementClient] = []
        self._local: list = []

    def set_global(self, config: GlobalConfig) -> None:
        self.metadata.put(self.keys.global_config, config.to_json())

    def set_tenant(self, tenant: str, config: TenantConfig) -> None:
        self.metadata.put(self.keys.tenant_config(tenant), config.to_json())

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env.update(extra or {})
        return env

    def _etcd_section(self) -> dict[str, str]:
        return {"endpoints": self.etcd_endpoint, "key_root": self.keys.root}

    def restart_etcd(self) -> None:
        if self.own_etcd is None:
            raise RuntimeError("restart_etcd needs a cluster with an etcd of its own (no etcd_endpoint)")
        self.own_etcd.stop()
        self.own_etcd.start()

    def start_master(self, master_id: str, env: dict[str, str] | None = None,
                     entry: tuple[str, ...] = ("speedlayer",)) -> int:
        """Start (or restart, on the port it had) master `master_id`; clients know masters by address.

        `entry` is the module run with `-m` and its arguments before `master`: the product's
        command, or a test's entry point passing hooks in (`("devstack.faults.master", ...)`)."""
        port = self._ports.setdefault(master_id, free_port())
        log = open(self.root / f"master-{master_id}.log", "ab")
        process = subprocess.Popen(
            [sys.executable, "-m", *entry, "master", "--config", str(self.config_path), "--id", master_id,
             "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, env=self._env(env), cwd=self.root)
        self.masters[master_id] = (process, port)
        wait_for_port(port)
        return port

    @property
    def master_addresses(self) -> list[str]:
        """Every master this cluster ever started (a killed one may come back on its port)."""
        return [f"127.0.0.1:{port}" for port in self._ports.values()]

    def start_worker(self, tenant: str, worker_id: str, memory_mb: int = 1024,
                     storage_options: dict[str, dict] | None = None) -> subprocess.Popen:
        log = open(self.root / f"worker-{tenant}-{worker_id}.log", "ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "speedlayer", "worker", "--tenant", tenant, "--id", worker_id,
             "--masters", ",".join(self.master_addresses), "--memory-mb", str(memory_mb), "--threads", "1",
             "--storage-options", json.dumps(storage_options or {})],
            stdout=log, stderr=subprocess.STDOUT, env=self._env(), cwd=self.root)
        self.workers[f"{tenant}/{worker_id}"] = process
        return process

    def start_local_worker(self, tenant: str, worker_id: str, memory_mb: int = 1024):
        """A worker agent in this process (its DuckDB can be queried directly); stopped with the cluster."""
        import threading

        from speedlayer.config import WorkerConfig
        from speedlayer.worker.agent import WorkerAgent

        agent = WorkerAgent(WorkerConfig(tenant=tenant, worker_id=worker_id, masters=tuple(self.master_addresses),
                                         memory_bytes=memory_mb * 1024 * 1024, threads=1))
        thread = threading.Thread(target=agent.run, name=f"worker-{worker_id}", daemon=True)
        thread.start()
        self._local.append((agent, thread))
        return agent
    def start_gateway(self, gateway_id: str = "g1", extra: dict | None = None) -> str:
        """Start a Data Gateway process; returns its host:port."""
        port = free_port()
        config = self.root / f"gateway-{gateway_id}.yaml"
        config.write_text(json.dumps({"etcd": self._etcd_section(),
                                      "gateway": {"port": port, **(extra or {})}}))
        log = open(self.root / f"gateway-{gateway_id}.log", "ab")
        process = subprocess.Popen([sys.executable, "-m", "speedlayer", "gateway", "--config", str(config)],
                                   stdout=log, stderr=subprocess.STDOUT, env=self._env(), cwd=self.root)
        self.gateways[gateway_id] = (process, port)
        wait_for_port(port)
        return f"127.0.0.1:{port}"

    def client(self, deadline_s: float = 30.0) -> ManagementClient:
        client = ManagementClient(self.master_addresses, deadline_s=deadline_s)
        self._clients.append(client)
        return client

    def leader_id(self) -> str | None:
        raw = self.metadata.get(self.keys.election)
        return raw.decode() if raw else None

    def kill_master(self, master_id: str, sig: int = signal.SIGKILL) -> None:
        process, _ = self.masters.pop(master_id)
        process.send_signal(sig)
        process.wait(10)

    def kill_worker(self, key: str, sig: int = signal.SIGKILL) -> None:
        process = self.workers.pop(key)
        process.send_signal(sig)
        process.wait(10)

    def audit_events(self, kind: str) -> list[dict]:
        """The audit trail's events of `kind`, from every master's JSON lines file (cwd = root)."""
        events = []
        for path in sorted(self.root.glob("speedlayer-audit-*.jsonl")):
            events += [e for e in map(json.loads, path.read_text().splitlines()) if e.get("kind") == kind]
        return events

    def dump_logs(self) -> str:
        parts = []
        for path in sorted(self.root.glob("**/*.log")):
            text = path.read_text(errors="replace").splitlines()[-40:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self) -> None:
        for client in self._clients:
            client.close()
        for agent, thread in self._local:
            agent.stop()
            thread.join(10)
        processes = ([p for p, _ in self.masters.values()] + list(self.workers.values())
                     + [p for p, _ in self.gateways.values()])
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)  # a paused process would not act on SIGTERM
        stop_processes(processes)
        self.masters.clear()
        self.workers.clear()
        self.gateways.clear()
        self.metadata.close()
        if self.own_etcd is not None:
            self.own_etcd.stop()


def ready_workers(client: ManagementClient, tenant: str, dataset: str, epoch: str) -> dict[str, int]:
    """{worker: rows} of the epoch's READY replicas."""
    status = client.status(tenant, dataset, epoch)
    return {r.worker_id: r.rows for e in status.epochs for r in e.replicas if r.state == "READY"}
