"""A three-member etcd cluster on loopback, for the soak: one member can be killed -9 or
paused and the cluster keeps its quorum.

Each member is the `etcd` server the product runs (`danube_core.embedded_etcd.etcd_binary`),
on fixed ports and its own data dir, so a restart is the same member with its data. Election
settings are raised from etcd's defaults (100 ms heartbeat, 1 s election): on a 2-core machine
under the whole platform, the defaults make members call elections whenever a JVM starts.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from danube_core.embedded_etcd import etcd_binary, extra_flags_from_env
from danube_core.ports import free_port, wait_for_port


class EtcdMember:
    """One member; `start()` after `kill9()` restarts it on its data."""

    def __init__(self, name: str, root: Path, initial_cluster: str = "") -> None:
        self.name = name
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port, self.peer_port = free_port(), free_port()
        self.initial_cluster = initial_cluster
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self) -> subprocess.Popen:
        client = f"http://{self.endpoint}"
        with open(self.root / "etcd.log", "ab") as log:
            self.process = subprocess.Popen(
                [etcd_binary(), "--name", self.name, "--data-dir", str(self.root / "data"),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
                 "--initial-cluster", self.initial_cluster, "--initial-cluster-token", "soak",
                 "--initial-cluster-state", "new", "--heartbeat-interval", "250", "--election-timeout", "2500",
                 *extra_flags_from_env()],
                stdout=log, stderr=subprocess.STDOUT)
        return self.process


class EtcdCluster:
    """Three members started together (each waits for the others to form the cluster)."""

    def __init__(self, root: Path, size: int = 3) -> None:
        self.members = [EtcdMember(f"e{i}", Path(root) / f"e{i}") for i in range(size)]
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for member in self.members:
            member.initial_cluster = cluster

    @property
    def endpoints(self) -> str:
        """Every member's `host:port`, comma-separated, as the etcd clients here take them."""
        return ",".join(m.endpoint for m in self.members)

    @property
    def ports(self) -> list[int]:
        return [m.port for m in self.members]

    def member(self, name: str) -> EtcdMember:
        return next(m for m in self.members if m.name == name)

    def start(self, deadline_s: float = 60.0) -> "EtcdCluster":
        for member in self.members:
            member.start()
        for member in self.members:
            try:
                wait_for_port(member.port, deadline_s)
            except TimeoutError as exc:
                raise RuntimeError(f"etcd member {member.name} did not listen on {member.endpoint}: "
                                   f"see {member.root / 'etcd.log'}") from exc
        return self
