"""The embedded default deployment: a local etcd and our broker on local storage, in one folder.

Used by the demo (`devstack.demo`), the end-to-end tests and the freshness benchmark. The broker runs as a real
subprocess (`python -m broker --config conf/broker.yaml`) with every location overridden
through its `DANUBE_...` environment variables: free ports, the stack's own etcd, WAL and
cloud-storage folders under `data_dir`, and a short WAL flush interval so a published message
reaches the WAL file (where the `danube` source reads the newest messages) within
`flush_interval_ms`.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from danube_core.embedded_etcd import EmbeddedEtcd
from danube_core.keys import REGISTER_PREFIX
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.ports import free_port, stop_process, wait_for_port
from devstack import REPO_ROOT

logger = logging.getLogger(__name__)

BROKER_CONFIG = REPO_ROOT / "conf" / "broker.yaml"


class EmbeddedStack:
    """etcd + one broker under `data_dir`; `start()` waits until the broker is registered."""

    def __init__(self, data_dir: str | Path, *, flush_interval_ms: int = 20, startup_timeout_s: float = 60.0) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.flush_interval_ms = flush_interval_ms
        self.startup_timeout_s = startup_timeout_s
        self.etcd: EmbeddedEtcd | None = None
        self.broker: subprocess.Popen | None = None
        self.client_port = free_port()
        self.admin_port = free_port()

    @property
    def etcd_endpoint(self) -> str:
        assert self.etcd is not None, "stack not started"
        return self.etcd.endpoint

    @property
    def service_url(self) -> str:
        """What a danube-client connects to."""
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def wal_dir(self) -> Path:
        return self.data_dir / "wal"

    @property
    def storage_url(self) -> str:
        """The broker's cloud-storage root, as the `danube` source's `storage.url`."""
        return str(self.data_dir / "cloud-storage")

    def start(self) -> "EmbeddedStack":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.etcd = EmbeddedEtcd(data_dir=str(self.data_dir / "etcd"))
        self._start_broker()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        logger.info("embedded stack up: etcd %s, broker %s, data in %s",
                    self.etcd_endpoint, self.service_url, self.data_dir)
        return self

    def _start_broker(self) -> None:
        log = open(self.data_dir / "broker.log", "ab")
        self.broker = subprocess.Popen(
            [sys.executable, "-m", "broker", "--config", str(BROKER_CONFIG)],
            cwd=str(REPO_ROOT), env=self._broker_env(), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's Ctrl-C reaches the demo, which stops this in order
        )
        log.close()

    def restart_broker(self, sig: int = signal.SIGKILL) -> None:
        """Stop the broker with `sig` (SIGKILL: as a crash) and start it again on the same WAL,
        ports and etcd; returns once its client port is open again."""
        assert self.broker is not None, "stack not started"
        self.broker.send_signal(sig)
        self.broker.wait(30)
        self._start_broker()
        self._wait_ready()

    def _broker_env(self) -> dict[str, str]:
        host, port = self.etcd_endpoint.rsplit(":", 1)
        overrides = {
            "DANUBE_META_STORE__HOST": host,
            "DANUBE_META_STORE__PORT": port,
            "DANUBE_META_STORE__EMBEDDED": "false",
            "DANUBE_BROKER__PORTS__CLIENT": str(self.client_port),
            "DANUBE_BROKER__PORTS__ADMIN": str(self.admin_port),
            "DANUBE_WAL_CLOUD__WAL__DIR": str(self.wal_dir),
            "DANUBE_WAL_CLOUD__WAL__FILE_SYNC__INTERVAL_MS": str(self.flush_interval_ms),
            "DANUBE_WAL_CLOUD__CLOUD__ROOT": self.storage_url,
        }
        return {**os.environ, **overrides}

    def _wait_ready(self) -> None:
        """Client port open and the broker's registration visible in etcd."""
        deadline = time.monotonic() + self.startup_timeout_s
        assert self.broker is not None
        with EtcdMetadataStore(self.etcd_endpoint) as metadata:
            while time.monotonic() < deadline:
                if self.broker.poll() is not None:
                    raise RuntimeError(
                        f"broker exited with code {self.broker.returncode} during startup; "
                        f"see {self.data_dir / 'broker.log'}"
                    )
                if metadata.get_prefix(REGISTER_PREFIX, keys_only=True):
                    wait_for_port(self.client_port, max(0.1, deadline - time.monotonic()))
                    return
                time.sleep(0.1)
        raise TimeoutError(f"broker not registered within {self.startup_timeout_s}s; "
                           f"see {self.data_dir / 'broker.log'}")

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after 20 s) and etcd."""
        if self.broker is not None:
            stop_process(self.broker, 20.0)
        self.broker = None
        if self.etcd is not None:
            self.etcd.stop()
            self.etcd = None

    def __enter__(self) -> "EmbeddedStack":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
