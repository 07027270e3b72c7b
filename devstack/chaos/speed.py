"""The soak's speed layer: two masters, three workers and a gateway, each a real `python -m
speedlayer ...` process, on `devstack.speedlayer_stack.EmbeddedSpeedLayer`'s configuration
file and spawning (one master there; the second and the workers that know both are added here).

`parts()` gives each process as a supervised part (`devstack.chaos.supervisor.Part`) whose
`start` launches it again with the same arguments, so a killed master or worker comes back
as the same id.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from devstack.chaos.schedule import MASTERS, WORKERS
from devstack.chaos.supervisor import Part
from danube_core.ports import free_port, wait_for_port
from devstack.speedlayer_stack import EmbeddedSpeedLayer

TENANT = "soak"
KEY_ROOT = "/speedlayer"


class SoakSpeedLayer(EmbeddedSpeedLayer):
    """Masters `m1`, `m2`, workers `w1..w3` of tenant `soak`, a gateway, on the etcd at `etcd`."""

    def __init__(self, root: Path, etcd: str, worker_memory_mb: int = 512) -> None:
        super().__init__(root, etcd, key_root=KEY_ROOT, tenant=TENANT)
        self.ports = {MASTERS[0]: self.master_port, MASTERS[1]: free_port()}
        self.worker_memory_mb = worker_memory_mb

    @property
    def masters(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports.values())

    def _args(self, name: str) -> tuple[str, ...]:
        config = str(self.config_path)
        if name in self.ports:
            return ("master", "--config", config, "--id", name, "--port", str(self.ports[name]))
        if name == "gw":
            return ("gateway", "--config", config)
        return ("worker", "--tenant", self.tenant, "--id", name, "--masters", self.masters,
                "--memory-mb", str(self.worker_memory_mb), "--threads", "1")

    def parts(self) -> list[Part]:
        """Every process as a part to supervise (not started yet)."""
        def starter(name: str):
            return lambda: self._spawn(name, *self._args(name))

        names = [*MASTERS, *WORKERS, "gw"]
        return [Part(name, "master" if name in MASTERS else "gateway" if name == "gw" else "worker",
                     starter(name), self.root / f"{name}.log") for name in names]

    def wait_started(self, deadline_s: float = 90.0) -> None:
        """Masters and gateway listening, every worker registered with the leader."""
        from speedlayer.clients import ManagementClient

        for port in (*self.ports.values(), self.gateway_port):
            wait_for_port(port, deadline_s)
        client = self._client = ManagementClient(self.masters.split(","), deadline_s=60)
        self._wait(lambda: len(client.workers(self.tenant).workers) >= len(WORKERS), deadline_s,
                   "workers registered")

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        process = super()._spawn(name, *args)
        self.processes.pop(name, None)  # the supervisor owns it; EmbeddedSpeedLayer._wait must not judge it
        return process
