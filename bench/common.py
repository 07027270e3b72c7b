"""What the bench/bench_*.py scripts share: machine facts, CPU + wall timing, a table, the JSON.

Every benchmark prints a table and writes `bench/results/<name>.json`; rates are most
meaningful per CPU second on a shared machine, so timings carry both clocks (`timed`, and
`tree_cpu_s` for work done in child processes such as a Spark JVM) and reports carry the load
average they were measured under.

    from common import Column, machine_info, print_table, timed, write_results

    with timed() as t:
        work()
    print_table([{"case": "x", "rate": n / t.wall_s}], [Column("case", "case"),
                Column("rate/s", "rate", "{:,.0f}")])
    write_results("x", {"machine": machine_info(), ...})
"""

from __future__ import annotations

import cProfile
import json
import os
import platform
import pstats
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Mapping, Sequence, TypeVar

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "bench" / "results"

T = TypeVar("T")
_END = object()


def machine_info() -> dict[str, Any]:
    """Python version, architecture, CPUs and the 1-minute load average right now."""
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


@dataclass
class Timing:
    """CPU seconds of this process and wall seconds of one measured block."""

    cpu_s: float = 0.0
    wall_s: float = 0.0


@contextmanager
def timed() -> Iterator[Timing]:
    """Time the `with` block; the yielded Timing is filled in when the block ends."""
    timing = Timing()
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        yield timing
    finally:
        timing.cpu_s = time.process_time() - cpu
        timing.wall_s = time.perf_counter() - wall


def best_times(fn: Callable[[], object], repeat: int) -> Timing:
    """Best CPU and best wall seconds over `repeat` calls of `fn` (each minimised on its own)."""
    best = Timing(float("inf"), float("inf"))
    for _ in range(repeat):
        with timed() as t:
            fn()
        best = Timing(min(best.cpu_s, t.cpu_s), min(best.wall_s, t.wall_s))
    return best


def tree_cpu_s(root: int | None = None) -> float:
    """CPU seconds used so far by process `root` (default: this one) and all its descendants,
    living or exited (an exited child's time is in its parent's cutime once reaped).

    Rates per CPU second of a whole process tree (a JVM, its Python workers, servers) stay
    comparable on a busy machine, where wall-clock rates depend on what else runs. Linux only.
    """
    root = os.getpid() if root is None else root
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        ticks[pid] = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    tree, frontier = {root}, [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier and pid not in tree]
        tree.update(children)
        frontier = children
    return sum(ticks.get(pid, 0) for pid in tree) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int | None = None) -> float:
    """Resident memory (VmRSS) of process `pid` (default: this one) in MiB, from /proc/<pid>/status.

    NaN when the process is gone or reports no VmRSS (a zombie): benchmarks sample processes
    that may exit meanwhile, and a missing figure must not end the run. Linux only.
    """
    try:
        with open(f"/proc/{'self' if pid is None else pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return float("nan")



class Phase:
    """Wall and process-tree CPU seconds of one phase, with the load average at its end."""

    def __init__(self, name: str, phases: dict) -> None:
        self.name, self.phases = name, phases

    def __enter__(self) -> "Phase":
        self.cpu0, self.wall0 = tree_cpu_s(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.phases[self.name] = {"wall_s": round(time.perf_counter() - self.wall0, 2),
                                  "cpu_s": round(tree_cpu_s() - self.cpu0, 2),
                                  "load_1m": round(os.getloadavg()[0], 2)}


def wait_for(check: Callable[[], T], deadline_s: float = 120.0, interval_s: float = 0.02) -> T:
    """Call `check` until it returns something truthy (returned), taking an exception as "not
    yet" (a speed-layer master between leaders answers with errors); TimeoutError at the
    deadline."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception:  # noqa: BLE001 (not ready yet; poll again)
            pass
        time.sleep(interval_s)
    raise TimeoutError("condition not met")

@dataclass(frozen=True)
class LoadRun:
    """What `closed_loop_load` measured: its clients, wall seconds, calls that returned and the
    failures (type and first words of each)."""

    clients: int
    wall_s: float
    calls: int
    failures: list[str]

    def summary(self, calls_key: str, rate_key: str) -> dict[str, Any]:
        """The figures as the results JSON holds them, the calls and their rate per second under
        the benchmark's own names (`queries`/`qps`, `statements`/`per_s`), as earlier results do."""
        return {"clients": self.clients, "seconds": round(self.wall_s, 2), calls_key: self.calls,
                "failed": len(self.failures), rate_key: round(self.calls / self.wall_s, 1),
                "failures_sample": self.failures[:3]}


def closed_loop_load(open_client: Callable[[int], ContextManager[Callable[[], object]]], clients: int,
                     seconds: float, during: Callable[[], object] | None = None) -> LoadRun:
    """`clients` threads, client `i` opening its connection with `open_client(i)` and calling what
    that yields back to back (closed loop: each waits for its answer) for `seconds`.

    `during` (a fault, such as a killed worker) runs at half time. A call that raises counts as a
    failure and the loop goes on: what a fault costs is the calls it fails, not a stopped client.
    """
    calls, failures, lock, stop = [0], [], threading.Lock(), threading.Event()

    def client_loop(i: int) -> None:
        with open_client(i) as call:
            while not stop.is_set():
                try:
                    call()
                    with lock:
                        calls[0] += 1
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    with lock:
                        failures.append(f"{type(exc).__name__}: {str(exc)[:160]}")

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    if during is not None:
        time.sleep(seconds / 2)
        during()
        time.sleep(seconds / 2)
    else:
        time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(30)
    return LoadRun(clients, time.perf_counter() - started, calls[0], failures)


def drain_timed(items: Iterator[T], total: Timing) -> list[T]:
    """Drain `items`, adding only the time spent producing them (not the caller's) to `total`."""
    out: list[T] = []
    while True:
        with timed() as t:
            item = next(items, _END)
        total.cpu_s += t.cpu_s
        total.wall_s += t.wall_s
        if item is _END:
            return out
        out.append(item)  # type: ignore[arg-type]


def profile_top(fn: Callable[[], object], top: int = 8) -> list[dict]:
    """The `top` functions by own time while `fn` runs (cProfile). C extension functions show
    on their own; Cython code (pyarrow) counts in its Python caller's own time."""
    profiler = cProfile.Profile()
    profiler.runcall(fn)
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values()) or 1.0
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [{"function": f"{Path(f).name}:{line}({name})", "calls": v[1], "tottime_s": round(v[2], 4),
             "share": round(v[2] / total, 3)} for (f, line, name), v in rows]


@dataclass(frozen=True)
class Column:
    """One table column: its header, the row key it shows and a format for the value."""

    header: str
    key: str
    fmt: str = "{}"

    def render(self, row: Mapping[str, Any]) -> str:
        value = row.get(self.key)
        return "-" if value is None else self.fmt.format(value)


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], title: str | None = None) -> None:
    """Rows as an aligned text table: the first column left-aligned, the others right-aligned."""
    cells = [[c.render(row) for c in columns] for row in rows]
    widths = [max([len(c.header)] + [len(line[i]) for line in cells]) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        first = values[0].ljust(widths[0])
        return "  ".join([first] + [v.rjust(w) for v, w in zip(values[1:], widths[1:])])

    if title:
        print(title)
    print(line([c.header for c in columns]))
    for values in cells:
        print(line(values))


def write_results(name: str, report: Mapping[str, Any]) -> Path:
    """Write `report` to bench/results/<name>.json and say where."""
    path = RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    try:
        shown = path.relative_to(Path.cwd())
    except ValueError:
        shown = path
    print(f"wrote {shown}")
    return path


def local_delta_builder(app_name: str, warehouse: Path):
    """A `local[2]` SparkSession builder with Delta Lake, two partitions everywhere and no UI: the
    session every Spark benchmark measures in (finish it with `configure_spark_with_delta_pip`)."""
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master("local[2]").appName(app_name)
            .config("spark.sql.shuffle.partitions", "2").config("spark.default.parallelism", "2")
            .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.warehouse.dir", str(warehouse))
            .config("spark.databricks.delta.snapshotPartitions", "2")
            .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
            .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"))


def run_in_workdir(prefix: str, run: Callable[[Path], dict[str, Any]], *, keep: bool = False) -> dict[str, Any]:
    """`run(work)` in a fresh temporary directory (removed unless `keep`), its result with the
    load average at the start and the total wall time: what every benchmark reports beside its cases."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    load_start = round(os.getloadavg()[0], 2)
    try:
        with timed() as t:
            result = run(work)
        result.update(load_average_1m_start=load_start, total_wall_s=round(t.wall_s, 1))
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    return result
