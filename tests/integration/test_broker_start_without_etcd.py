"""A broker started while its etcd is down fails, naming the keys to check, and starts no etcd.

The shipped `conf/broker.yaml` once had `meta_store.embedded: true`: a production broker
started during a short etcd outage brought up an empty etcd of its own on that port, and the
cluster's metadata forked. Now the embedded etcd is only started when asked for.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from danube_core.ports import free_port, stop_process

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED = REPO_ROOT / "conf" / "broker.yaml"
EXIT_DEADLINE_S = 60.0


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_a_broker_on_the_shipped_config_whose_etcd_is_down_fails_and_starts_no_etcd(tmp_path):
    etcd_port = free_port()  # nothing listens there: the cluster's etcd is down
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT),
           "DANUBE_META_STORE__PORT": str(etcd_port),
           "DANUBE_BROKER__PORTS__CLIENT": str(free_port()), "DANUBE_BROKER__PORTS__ADMIN": str(free_port())}
    broker = subprocess.Popen([sys.executable, "-m", "broker", "--config", str(SHIPPED)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = broker.communicate(timeout=EXIT_DEADLINE_S)
    except subprocess.TimeoutExpired:
        stop_process(broker)
        pytest.fail(f"the broker still runs after {EXIT_DEADLINE_S}s with no etcd at 127.0.0.1:{etcd_port} "
                    f"(etcd started by the broker: {_listening(etcd_port)})")
    assert broker.returncode == 1, stderr[-2000:]
    assert f"error: config {SHIPPED}: etcd unreachable at 127.0.0.1:{etcd_port}" in stderr
    assert "(meta_store.host/meta_store.port)" in stderr
    assert "Traceback" not in stderr
    assert not _listening(etcd_port)
    assert not (tmp_path / "danube-data" / "etcd").exists()  # the embedded etcd's data dir
