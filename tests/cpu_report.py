"""Per-test CPU accounting, to find where the suite's time goes.

On 2 cores the suite is bound by CPU, not by waiting, so wall durations (`--durations`) mislead
under pytest-xdist: a test looks slow because its neighbours took the cores. This plugin charges
each test the CPU its pytest process and every process it started used while it ran (the
process itself, its reaped children, and every live descendant found in /proc), and writes one
JSON line per test to the file named by DANUBE_TEST_CPU_REPORT. Processes that detach from
the tree (re-parented to init, as a JVM whose driver was killed with -9) are not counted that
way; with DANUBE_TEST_CPU_CGROUP naming a writable cgroup-v1 `cpuacct` directory, each pytest
process moves itself into a cgroup of its own below it and is charged that cgroup's usage,
which keeps every process it starts, detached or not.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Iterator

import pytest

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds of the process and its reaped children)."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces) start at field 3 (state).
        fields = stat[stat.rindex(")") + 2:].split()
        ppid = int(fields[1])
        utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
        table[int(entry.name)] = (ppid, (utime + stime + cutime + cstime) / CLOCK_TICKS)
    return table


_cgroup_usage: Path | None = None


def _own_cgroup(parent: str) -> Path:
    """A cpuacct cgroup for this pytest process (one per xdist worker), joined now."""
    group = Path(parent, os.environ.get("PYTEST_XDIST_WORKER", "main"))
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(os.getpid()))
    return group / "cpuacct.usage"


def tree_cpu_seconds() -> float:
    """CPU of this process and everything it started: its cgroup's, if it has one."""
    global _cgroup_usage
    parent = os.environ.get("DANUBE_TEST_CPU_CGROUP")
    if parent:
        if _cgroup_usage is None:
            _cgroup_usage = _own_cgroup(parent)
        return int(_cgroup_usage.read_text()) / 1e9
    return _process_tree_cpu_seconds()


def _process_tree_cpu_seconds() -> float:
    """CPU of this process, its reaped children and every live descendant."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    pending = list(children.get(os.getpid(), ()))
    while pending:
        pid = pending.pop()
        total += table[pid][1]
        pending.extend(children.get(pid, ()))
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    report_path = os.environ.get("DANUBE_TEST_CPU_REPORT")
    if not report_path:
        yield
        return
    cpu_before, wall_before = tree_cpu_seconds(), time.monotonic()
    yield
    record = {"test": item.nodeid, "cpu_s": round(tree_cpu_seconds() - cpu_before, 2),
              "wall_s": round(time.monotonic() - wall_before, 2), "ended_at": round(time.time(), 1),
              "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}
    with open(report_path, "a") as report:
        report.write(json.dumps(record) + "\n")
