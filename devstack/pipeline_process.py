"""A pipeline run as a user runs it, as a process of its own, for the tests and benchmarks that
watch it from outside or kill parts of it: `python -m pipelines run <file>` in a process group
of its own (its driver, JVM and Spark's Python workers), stopped with SIGTERM (the pipeline
stops its query and Spark) and its group killed if it hangs; and the tail process a speed-layer
worker runs beside it (`python -m pipelines tail`), found among the worker's children.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from devstack import REPO_ROOT


def start_pipeline(data: dict, root: Path) -> subprocess.Popen:
    """`data` written as `root/<name>.yaml` and run, its output in `root/pipeline.log`."""
    file = root / f"{data['name']}.yaml"
    file.write_text(yaml.safe_dump(data))
    with (root / "pipeline.log").open("w") as log:
        return subprocess.Popen([sys.executable, "-m", "pipelines", "run", str(file)], cwd=str(REPO_ROOT),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop_pipeline(driver: subprocess.Popen, grace_s: float = 60) -> None:
    """SIGTERM, then, after `grace_s` or at once when it has ended, its whole group killed."""
    if driver.poll() is None:
        driver.terminate()
        try:
            driver.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(driver.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    driver.wait(30)


def tail_process(worker_pid: int) -> int | None:
    """The pid of the tail process the speed-layer worker `worker_pid` runs, None when none."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if parent == worker_pid and b"pipelines" in command and b"tail" in command:
                return int(entry.name)
    return None
