"""Sampled CPU profiles of Python processes other than the benchmark's own, with py-spy.

A Python data source runs in processes the JVM forks (the `pyspark.daemon` and its workers for
`read()`, one long-lived process per streaming query for `latestOffset`/`partitions`), so
cProfile in the benchmark's own process never sees them. `PythonProfile` watches the JVM's
process tree while a block runs, attaches `py-spy record --subprocesses` to every Python
process that appears, and turns the collapsed stacks into the functions with the most own
samples and the most inclusive samples. py-spy samples only running threads (not idle ones),
so sample counts are proportional to CPU time.

    with PythonProfile(jvm_pid) as prof:
        run_case()
    prof.summary(top=15)   # {"samples": ..., "rate_hz": ..., "own": [...], "inclusive": [...]}

Servers a benchmark starts itself (a broker, speed-layer workers, a gateway) are profiled the
same way by pid: `PythonProfile(pids=[broker.pid])`.

py-spy is in the `bench` extra; without it `available()` is False and a benchmark reports
no profile rather than failing. Its own CPU is not part of any timed run: profile a separate
run of the case.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

RATE_HZ = 200
POLL_S = 0.05


def available() -> bool:
    return shutil.which("py-spy") is not None


def profile_processes(pids: Sequence[int], run: Callable[[], object], top: int = 12) -> dict:
    """`run()` once under py-spy attached to `pids` (and their Python children): the summary, or
    why there is none. For a benchmark's servers; the run is extra, so its time counts nowhere."""
    if not available():
        return {"skipped": "py-spy is not installed (pip install -e '.[bench]')"}
    with PythonProfile(pids=pids) as profile:
        run()
    return profile.summary(top=top)


def print_summary(title: str, summary: dict, top: int = 8) -> None:
    """The `top` functions by own samples of a `PythonProfile.summary()`, or why there is none."""
    if "own" not in summary:
        print(f"\n{title}: no profile ({summary.get('skipped') or summary.get('error')})")
        return
    print(f"\n{title}: {summary['samples']:,} samples, ~{summary['cpu_s_estimate']} CPU s of Python "
          f"in {summary['processes']} processes")
    for row in summary["own"][:top]:
        print(f"  {row['share']:>6.1%}  {row['function']}")


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            out.setdefault(parent, []).append(int(entry.name))
    return out


def _python_descendants(root: int) -> list[int]:
    """Python processes under `root` whose parent is not Python (py-spy follows the rest)."""
    children, found, frontier = _children(), [], [(root, False)]
    while frontier:
        pid, parent_is_python = frontier.pop()
        for child in children.get(pid, []):
            try:
                exe = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            is_python = b"python" in Path(exe.decode(errors="replace")).name.encode()
            if is_python and not parent_is_python:
                found.append(child)
            frontier.append((child, is_python))
    return found


class PythonProfile:
    """py-spy on every Python process under `root_pid` (a JVM), and on the given `pids` (servers
    a benchmark started itself, with their children), while the `with` block runs."""

    def __init__(self, root_pid: int | None = None, rate_hz: int = RATE_HZ, pids: Sequence[int] = (),
                 subprocesses: bool = True) -> None:
        """`subprocesses=False`: the processes themselves only, not the Python processes they
        start (a driver's own process, where foreachBatch runs, beside a broker it started)."""
        self.root = root_pid
        self.pids = list(pids)
        self.subprocesses = subprocesses
        self.rate = rate_hz
        self.dir = Path(tempfile.mkdtemp(prefix="pyspy-"))
        self.recorders: dict[int, subprocess.Popen] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self.stacks: Counter[str] = Counter()

    def _attach(self, pid: int) -> None:
        out = self.dir / f"{pid}.txt"
        self.recorders[pid] = subprocess.Popen(
            ["py-spy", "record", "--pid", str(pid), *(["--subprocesses"] if self.subprocesses else []),
             "--rate", str(self.rate), "--format", "raw", "--output", str(out), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _watch(self) -> None:
        while not self._stop.is_set():
            found = self.pids + (_python_descendants(self.root) if self.root is not None else [])
            for pid in found:
                if pid not in self.recorders:
                    self._attach(pid)
            self._stop.wait(POLL_S)

    def __enter__(self) -> "PythonProfile":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for proc in self.recorders.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in self.recorders.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for path in self.dir.glob("*.txt"):
            for line in path.read_text(errors="replace").splitlines():
                stack, _, count = line.rpartition(" ")
                if stack and count.isdigit():
                    self.stacks[stack] += int(count)
        shutil.rmtree(self.dir, ignore_errors=True)

    def summary(self, top: int = 15) -> dict:
        """Samples in all, and the `top` functions by own and by inclusive samples."""
        own: Counter[str] = Counter()
        inclusive: Counter[str] = Counter()
        for stack, count in self.stacks.items():
            frames = [_short(f) for f in stack.split(";") if f]
            if not frames:
                continue
            own[frames[-1]] += count
            for frame in set(frames):
                inclusive[frame] += count
        total = sum(self.stacks.values()) or 1

        def rows(counter: Counter[str]) -> list[dict]:
            return [{"function": f, "samples": n, "share": round(n / total, 3)} for f, n in counter.most_common(top)]

        return {"samples": sum(self.stacks.values()), "rate_hz": self.rate, "processes": len(self.recorders),
                "cpu_s_estimate": round(sum(self.stacks.values()) / self.rate, 2),
                "own": rows(own), "inclusive": rows(inclusive)}


def _short(frame: str) -> str:
    """`func (/long/path/module.py:12)` -> `func (module.py:12)`; process frames kept as is."""
    name, sep, where = frame.partition(" (")
    if not sep:
        return frame
    return f"{name} ({Path(where.rstrip(')')).name})"
