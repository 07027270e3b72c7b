"""A Spark standalone cluster of real processes for tests: one master and N workers.

Started from the installed pyspark (`spark-class org.apache.spark.deploy.master.Master` and
`...worker.Worker`), bound to loopback, small: each worker offers one core and a little
memory, so a 2-core machine runs it. Every daemon logs to a file in the cluster's directory
(`logs()` for a failing test). The master's JSON status page says when the workers registered.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pyspark

from devstack.short_spark_runs import SHORT_RUN_JVM_OPTIONS
from danube_core.ports import free_port, wait_for_port
from tests.rig import eventually

SPARK_HOME = Path(pyspark.__file__).parent


def short_run_java_options() -> str:
    """JVM options for the cluster's daemons and executors: a test's cluster lives for a
    minute, so the C1 compiler alone and the serial GC (`SHORT_RUN_JVM_OPTIONS`), and the
    options the suite gives every driver in `SPARK_SUBMIT_OPTS` (its class-data archive,
    `tests/jvm_class_archive.py`), which spark-submit passes to drivers only."""
    return f"{SHORT_RUN_JVM_OPTIONS} {os.environ.get('SPARK_SUBMIT_OPTS', '')}".strip()


class SparkStandaloneCluster:
    """`with SparkStandaloneCluster(root, workers=2) as cluster:` -> `cluster.master_url`."""

    def __init__(self, root: Path, *, workers: int = 2, worker_memory: str = "1g",
                 daemon_memory: str = "256m") -> None:
        self.root = root
        self.workers = workers
        self.worker_memory = worker_memory
        self.port, self.ui_port = free_port(), free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_DAEMON_MEMORY": daemon_memory, "SPARK_LOG_DIR": str(root / "logs"),
                    "SPARK_NO_DAEMONIZE": "1", "SPARK_DAEMON_JAVA_OPTS": short_run_java_options()}
        self.env.pop("PYTHONPATH", None)  # executors must get the code from what is shipped
        self.processes: list[subprocess.Popen] = []

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "ab")
        process = subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], cwd=self.root, env=self.env,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)
        return process

    def start(self) -> "SparkStandaloneCluster":
        self.root.mkdir(parents=True, exist_ok=True)
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui_port))
        wait_for_port(self.port, deadline_s=120)
        for index in range(self.workers):
            work_dir = self.root / f"worker-{index}"
            work_dir.mkdir(exist_ok=True)
            self._spawn(f"worker-{index}", "org.apache.spark.deploy.worker.Worker", self.master_url,
                        "--host", "127.0.0.1", "--cores", "1", "--memory", self.worker_memory,
                        "--webui-port", str(free_port()), "--work-dir", str(work_dir))
        eventually(lambda: self.status().get("aliveworkers") == self.workers, 120, 0.5)
        return self

    def status(self) -> dict:
        """The master's `/json/` page (workers, applications); {} while it does not answer.

        Just after its web UI binds, the master may answer `/json/` with its HTML page (seen
        once, 2 s after the bind, before it was elected leader): that is "not yet", like no
        answer, and the caller polls again."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as reply:
                return json.load(reply)
        except (OSError, ValueError):  # ValueError: a page that is not JSON (json.JSONDecodeError)
            return {}

    def executor_dirs(self) -> list[Path]:
        """The executors' working directories (`worker-N/app-*/<executor id>`)."""
        return sorted(p for p in self.root.glob("worker-*/app-*/*") if p.is_dir())

    def logs(self, lines: int = 60) -> str:
        parts = []
        for path in sorted(self.root.glob("*.log")) + sorted(self.root.glob("worker-*/app-*/*/stderr")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.relative_to(self.root)}\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)

    def __enter__(self) -> "SparkStandaloneCluster":
        try:
            return self.start()
        except BaseException:
            print(self.logs())
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
