"""Where a stream query's CPU goes beyond a batch read's, for `bench/bench_kafka.py`.

A `readStream ... Trigger.AvailableNow` query runs the same `read()` on the same Python
workers as `spark.read`, and adds a fixed cost per query: Spark starts a fresh Python process
for the source's driver-side methods (`python -m
pyspark.sql.streaming.python_streaming_source_runner`, not forked from the warm
`pyspark.daemon`), and the JVM runs the micro-batch machinery (offset and commit logs in the
checkpoint, the sink's transaction). A whole-run CPU ratio mixes per-row and per-query costs,
so it moves with the number of rows; this module provides what separates them:

* `ProcessCpu`: CPU seconds of one run split by process (the JVM's own threads, the
  `pyspark.daemon` tree where `read()` and batch planning run, the JVM's other children such
  as a stream's source process), from /proc;
* `linear_fit`: CPU = fixed + per_row x rows from runs at two sizes (best run of each);
* `source_process_breakdown`: the stream's source process's CPU by activity, from py-spy.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from common import tree_cpu_s

DAEMON = b"pyspark.daemon"
SOURCE_RUNNER = b"python_streaming_source_runner"


def _stat(pid: int) -> tuple[int, float, float] | None:
    """(parent pid, own CPU s, reaped children's CPU s) of `pid`, or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def _children(parent: int) -> dict[int, bytes]:
    """Live child pid -> command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            info = _stat(int(entry.name))
            if info is not None and info[0] == parent:
                try:
                    found[int(entry.name)] = Path(entry, "cmdline").read_bytes()
                except OSError:
                    continue
    return found


class ProcessCpu:
    """CPU seconds by process while the `with` block runs, from /proc at its start and end only
    (no sampling, so nothing is added to what is measured):

    * `jvm`: the JVM's own threads (query planning, the micro-batch machinery, tasks' Java side);
    * `python_workers`: the long-lived `pyspark.daemon` and the workers it forks (`read()`,
      a batch read's planning), living or exited;
    * `jvm_children`: the JVM's other child processes, living at the end or exited meanwhile
      (an exited child's CPU is in the JVM's cutime once the JVM has reaped it; the daemon
      lives on, so it is never in it): a stream query's driver-side source process, and
      ~0.1 s per case of short-lived children that batch cases have too. (A daemon that
      exits during the block would move its CPU from `python_workers` to here.)

    The caller's whole-tree CPU less these and the servers' is the benchmark's own process.
    """

    def __init__(self, jvm_pid: int) -> None:
        self.jvm = jvm_pid
        self.split: dict[str, float] = {}

    def _sample(self) -> tuple[float, float, float]:
        own, reaped = (_stat(self.jvm) or (0, 0.0, 0.0))[1:]
        daemon = fresh = 0.0
        for pid, cmdline in _children(self.jvm).items():
            if DAEMON in cmdline:
                daemon += tree_cpu_s(pid)
            else:
                fresh += tree_cpu_s(pid)
        return own, daemon, reaped + fresh

    def __enter__(self) -> "ProcessCpu":
        self._before = self._sample()
        return self

    def __exit__(self, *exc: object) -> None:
        after = self._sample()
        self.split = {name: round(a - b, 2) for name, a, b in
                      zip(("jvm", "python_workers", "jvm_children"), after, self._before)}


@dataclass(frozen=True)
class LinearFit:
    """CPU = fixed_s + per_row_s x rows through the best runs at two sizes."""

    fixed_s: float
    per_row_s: float


def linear_fit(small_rows: int, small_cpu_s: float, rows: int, cpu_s: float) -> LinearFit:
    per_row = (cpu_s - small_cpu_s) / (rows - small_rows)
    return LinearFit(cpu_s - per_row * rows, per_row)


def source_process_breakdown(stacks: Mapping[str, int], rate_hz: int) -> dict:
    """A stream's driver-side source process, from py-spy's raw stacks (`PythonProfile.stacks`
    of a run with `--subprocesses`, one `process N:"cmdline"` frame first): CPU seconds by what
    the samples were doing. Imports are split by the module being loaded: Spark's zip (Python
    compiles its modules from source: `zipimport` frames) or bytecode when Spark's runner
    imports them, and by top-level package when our code (or unpickling our data source)
    imports them; the rest by the outermost data source method
    (`DanubeStreamReader.latestOffset`, ...) or Spark's runner (its protocol, unpickling)."""
    seconds: Counter[str] = Counter()
    for stack, count in stacks.items():
        frames = [f for f in stack.split(";") if f]
        if not frames or SOURCE_RUNNER not in frames[0].encode():
            continue
        seconds[_category(frames[1:])] += count / rate_hz
    return {name: round(s, 2) for name, s in seconds.most_common()}


OURS = ("connectors", "danube_core")


def _package(frame: str) -> str:
    """`f (grpc/_channel.py:12)` -> `grpc` (py-spy shows paths relative to sys.path; modules
    loaded from a zip by their file name only: `pyspark` for those)."""
    where = frame.rpartition(" (")[2]
    return where.split("/", 1)[0] if "/" in where else "pyspark"


def _category(frames: list[str]) -> str:
    """What one sample of the source process was doing (see `source_process_breakdown`)."""
    first_import = next((i for i, f in enumerate(frames) if "_find_and_load" in f), None)
    if first_import is not None:
        importer = _package(frames[first_import - 1]) if first_import else "?"
        loaded = next((_package(f) for f in frames[first_import:] if f.startswith("<module> (")), "?")
        if importer in OURS or loaded in OURS:
            return f"import by danube code: {loaded if loaded != 'pyspark' else 'pyspark modules'}"
        if any("zipimport" in f for f in frames):
            return "import by Spark's runner, compiling Spark's zip (no bytecode in it)"
        return "import by Spark's runner, from bytecode (numpy, pyarrow, ...)"
    ours = [f.split(" (")[0] for f in frames if _package(f) in OURS]
    methods = [f for f in ours if "<locals>" not in f]  # past `plain_config_errors`' wrapper
    if ours:
        return "danube: " + (methods or ours)[0]
    return "Spark's runner (protocol, pickling, interpreter)"
