"""The soak's fault schedule: which fault, on which part, when and for how long, drawn from a
seed alone, so a seed names a run's faults exactly (`tests/unit/test_soak_schedule.py`).

The schedule alternates storms (faults every few seconds, overlapping when they hit different
parts) with quiet periods, over the fault window; the run heals everything after it. Two
faults never hold the same *resource* at once (one broker is not killed while it is paused; one
etcd member at most is down or paused, so the cluster keeps its quorum; the S3 proxy has one
mode at a time). Each kind is drawn from a shuffled round of all the enabled kinds, so a short
run still meets every kind once before any kind comes twice.

Pure: no clock, no processes; `devstack.chaos.injectors` carries the events out.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Callable


@dataclass(frozen=True)
class FaultKind:
    """A kind of fault: the parts it may hit, how long it lasts (0: instant) and what it holds."""

    targets: tuple[str, ...]
    duration_s: tuple[float, float] = (0.0, 0.0)
    resource: Callable[[str], str] = lambda target: target
    param: tuple[float, float] | None = None  # e.g. a delay per chunk, drawn per event
    doc: str = ""


BROKERS = ("b0", "b1")
PIPELINES = ("a", "b")
MASTERS = ("m1", "m2")
WORKERS = ("w1", "w2", "w3")
ETCD_MEMBERS = ("e0", "e1", "e2")

KINDS: dict[str, FaultKind] = {
    "broker_kill": FaultKind(BROKERS, (1, 8), lambda t: f"broker:{t}", doc="kill -9 of a broker, restarted on its WAL"),
    "broker_pause": FaultKind(BROKERS, (2, 6), lambda t: f"broker:{t}", doc="SIGSTOP of a broker, then SIGCONT"),
    "pipeline_kill": FaultKind(PIPELINES, (1, 8), lambda t: f"pipeline:{t}",
                               doc="kill -9 of a pipeline's process group (driver, its JVM and Python workers)"),
    "pyworker_kill": FaultKind(PIPELINES, resource=lambda t: f"pipeline:{t}",
                               doc="kill -9 of a pipeline's newest PySpark Python task worker"),
    "pipeline_pause": FaultKind(PIPELINES, (2, 6), lambda t: f"pipeline:{t}",
                                doc="SIGSTOP of a pipeline's driver process group, then SIGCONT"),
    "lease_revoke": FaultKind(PIPELINES, resource=lambda t: f"pipeline:{t}",
                              doc="the pipeline's subscription-lock lease revoked in etcd (as if expired)"),
    "topic_move": FaultKind(PIPELINES, resource=lambda t: f"topic:{t}",
                            doc="a topic (a partition of the partitioned one) unloaded under load: moved to a broker"),
    "master_kill": FaultKind(MASTERS, (1, 8), lambda t: "masters", doc="kill -9 of a speed-layer master"),
    "worker_kill": FaultKind(WORKERS, (1, 8), lambda t: f"worker:{t}", doc="kill -9 of a speed-layer worker"),
    "worker_pause": FaultKind(WORKERS, (2, 6), lambda t: f"worker:{t}", doc="SIGSTOP of a speed-layer worker"),
    "gateway_kill": FaultKind(("gw",), (1, 5), lambda t: "gateway", doc="kill -9 of the Data Gateway"),
    "etcd_kill": FaultKind(ETCD_MEMBERS, (2, 10), lambda t: "etcd-members", doc="kill -9 of one etcd member"),
    "etcd_pause": FaultKind(ETCD_MEMBERS, (2, 6), lambda t: "etcd-members", doc="SIGSTOP of one etcd member"),
    "etcd_slow": FaultKind(("front",), (3, 10), lambda t: "etcd-front", (0.2, 1.5),
                           doc="every chunk to and from etcd delayed (param: seconds per chunk)"),
    "s3_503": FaultKind(("s3",), (3, 10), lambda t: "s3", doc="S3 answering 503 SlowDown"),
    "s3_reset": FaultKind(("s3",), (3, 10), lambda t: "s3", doc="S3 connections reset"),
    "s3_slow": FaultKind(("s3",), (3, 10), lambda t: "s3", (0.3, 2.0), doc="S3 chunks delayed (param: seconds)"),
    "disk_full": FaultKind(BROKERS, (3, 10), lambda t: f"broker:{t}",
                           doc="the filesystem of a broker's WAL filled to the last block (a tmpfs of its own)"),
}

# Kinds the issue asks for that this soak cannot make real, and why: named when asked for.
NOT_DONE: dict[str, str] = {
    "executor_kill": "the pipelines run Spark in local mode, where executors are threads of the driver's JVM: "
                     "pipeline_kill (the whole process group) and pyworker_kill cover what dies",
    "clock_jump": "not done: a jump of one process's wall clock needs libfaketime (Debian's faketime) preloaded "
                  "into it, which the project's setup does not install; the wall-clock readers to aim it at "
                  "(leases are etcd's, which keeps its own time) are the brokers' publish times and object "
                  "names and the masters' epoch timestamps",
}


@dataclass(frozen=True)
class FaultEvent:
    """One fault: `start_s` after the fault window opens, on `target`, for `duration_s`."""

    start_s: float
    kind: str
    target: str
    duration_s: float
    param: float | None = None

    def to_json(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        extra = f" param={self.param}" if self.param is not None else ""
        return f"{self.start_s:7.1f}s {self.kind:<15} {self.target:<6} {self.duration_s:5.1f}s{extra}"


def parse_kinds(text: str) -> tuple[str, ...]:
    """`--faults`: `all` or comma-separated kind names; ValueError naming what is wrong."""
    names = list(KINDS) if text.strip() in ("", "all") else [n.strip() for n in text.split(",") if n.strip()]
    missing = [n for n in names if n in NOT_DONE]
    if missing:
        raise ValueError("--faults: not available in this soak: "
                         + "; ".join(f"{n} ({NOT_DONE[n]})" for n in missing))
    unknown = [n for n in names if n not in KINDS]
    if unknown:
        raise ValueError(f"--faults: unknown kind(s) {unknown}; known: {', '.join(KINDS)}")
    if not names:
        raise ValueError("--faults: no kind named")
    return tuple(dict.fromkeys(names))


def make_schedule(seed: int, window_s: float, kinds: tuple[str, ...], *, storm_s: tuple[float, float] = (20, 45),
                  quiet_s: tuple[float, float] = (8, 20), gap_s: tuple[float, float] = (1, 5)) -> list[FaultEvent]:
    """The faults of a run: storms of faults `gap_s` apart, quiet periods between, every
    fault over before `window_s`; the same arguments give the same list."""
    rng = random.Random(seed)
    events: list[FaultEvent] = []
    busy_until: dict[str, float] = {}
    round_: list[str] = []
    t = 0.0
    while t < window_s:
        storm_end = min(window_s, t + rng.uniform(*storm_s))
        while t < storm_end:
            if not round_:
                round_ = sorted(kinds)
                rng.shuffle(round_)
            name = round_.pop()
            kind = KINDS[name]
            target = rng.choice(kind.targets)
            duration = round(min(rng.uniform(*kind.duration_s), max(0.0, window_s - t)), 1)
            param = round(rng.uniform(*kind.param), 2) if kind.param else None
            resource = kind.resource(target)
            if busy_until.get(resource, -1.0) < t:
                events.append(FaultEvent(round(t, 1), name, target, duration, param))
                busy_until[resource] = t + duration
            t += rng.uniform(*gap_s)
        t = storm_end + rng.uniform(*quiet_s)
    return events
