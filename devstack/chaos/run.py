"""One soak, start to verdict: the platform up, load and recorders on, the schedule carried
out (the planted defect, if asked for, halfway), the final heal, the catch-up, queries after
the heal, then the checker. `SoakOptions` is what the command line sets.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from devstack.chaos.checker import Verdict, check
from devstack.chaos.injectors import Injector
from devstack.chaos.plant import plant
from devstack.chaos.platform import Platform, PartFailedError
from devstack.chaos.recorder import History, Recorder
from devstack.chaos.report import machine_cpu_s, print_report
from devstack.chaos.schedule import make_schedule
from devstack.faults.kit import poll, tally
from devstack.faults.proxies import PASS

AFTER_HEAL_QUERIES = 10


@dataclass(frozen=True)
class SoakOptions:
    minutes: float                 # the fault window
    seed: int
    kinds: tuple[str, ...]
    rate_per_s: float = 5.0        # per producer
    plant: str | None = None       # "duplicate" | "lose": the negative control
    workdir: Path | None = None
    keep: bool = False             # keep the work dir (logs, tables) even when the run passed
    drain_s: float = 420.0         # the heal's deadline for every acked message to reach Delta
    results: Path | None = None    # also write the report's JSON there


@dataclass
class SoakResult:
    verdict: Verdict | None
    report: dict
    workdir: Path
    kept: bool
    error: str = ""


def run_soak(options: SoakOptions, say: Callable[[str], None] = print) -> SoakResult:
    root = Path(options.workdir or tempfile.mkdtemp(prefix="danube-soak-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    started, cpu0, machine0 = time.monotonic(), _cpu(), machine_cpu_s()
    history = History(started)
    schedule = make_schedule(options.seed, options.minutes * 60, options.kinds)
    platform = Platform(root, options.rate_per_s, started, wal_tmpfs="disk_full" in options.kinds)
    report: dict = {"options": {**asdict(options), "workdir": str(root)},
                    "schedule": [e.to_json() for e in schedule]}
    say(f"soak: seed {options.seed}, {options.minutes} min of faults, {len(schedule)} events, work dir {root}")
    try:
        platform.start(lambda line: say(f"[{history.t():7.1f}s] {line}"))
    except BaseException as exc:
        if not isinstance(exc, PartFailedError):
            platform.stop()
            raise
        platform.stop()
        say(str(exc))
        report["error"] = str(exc)
        _write(root, options, report, machine0)
        return SoakResult(None, report, root, True, str(exc))
    assert platform.speed is not None
    recorder = Recorder(history, platform.streams, platform.speed.gateway, platform.etcd.endpoints).start()
    injector = Injector(platform, history)
    try:
        report["planted"] = _faults(platform, injector, schedule, options, history, say)
        report["heal"] = _heal(platform, recorder, injector, history, options, say)
        injector.closing.set()
        injector.join(30)
    finally:
        injector.closing.set()
        recorder.stop()
        down = platform.supervisor.all_running()
        platform.stop()
    not_recovered = [f"{o.event} ({o.note})" for o in injector.outcomes if o.recovery_s is None]
    verdict = check(platform.streams, history, not_recovered, down)
    report.update(verdict=verdict.to_json(), outcomes=[o.to_json() for o in injector.outcomes],
                  exits=[asdict(e) for e in platform.supervisor.exits], history=history.to_json(),
                  wall_s=round(time.monotonic() - started, 1), cpu_s=round(_cpu() - cpu0, 1),
                  machine_cpu_s=round(machine_cpu_s() - machine0, 1))
    print_report(report, injector.outcomes, platform.supervisor.exits, say)
    kept = options.keep or not verdict.passed
    _write(root, options, report, machine0)
    if not kept:
        shutil.rmtree(root, ignore_errors=True)
    say(f"soak: {'PASSED' if verdict.passed else 'FAILED'}" + (f"; logs and tables kept in {root}" if kept else ""))
    return SoakResult(verdict, report, root, kept)


def _faults(platform: Platform, injector: Injector, schedule: list, options: SoakOptions, history: History,
            say: Callable[[str], None]) -> dict | None:
    """Carry out the schedule over the window; the planted defect halfway. What was planted."""
    window_s = options.minutes * 60
    opened = time.monotonic()
    planted = None
    pending = sorted(schedule, key=lambda e: e.start_s)
    plant_at = window_s / 2 if options.plant else None
    while time.monotonic() - opened < window_s:
        now = time.monotonic() - opened
        while pending and pending[0].start_s <= now:
            event = pending.pop(0)
            say(f"[{history.t():7.1f}s] fault {event}")
            injector.launch(event)
        if plant_at is not None and now >= plant_at:
            plant_at = None
            try:
                planted = plant(options.plant or "", platform.streams["b"].target)
            except Exception as exc:  # said: a control that was not planted proves nothing
                say(f"[{history.t():7.1f}s] the defect could not be planted: {type(exc).__name__}: {exc}")
                continue
            history.notes.append(f"planted at {history.t():.1f}s: {planted}")
            say(f"[{history.t():7.1f}s] planted defect: {planted}")
        time.sleep(0.1)
    return planted


def _heal(platform: Platform, recorder: Recorder, injector: Injector, history: History, options: SoakOptions,
          say: Callable[[str], None]) -> dict:
    """Lift every fault, then wait for the platform to catch up: parts running, every acked
    message in Delta, the speed layer serving the newest version, queries answered."""
    healed = history.t()
    platform.supervisor.heal()
    for proxy in (platform.front, platform.s3):
        if proxy is not None:
            proxy.set_mode(PASS)
    say(f"[{healed:7.1f}s] heal: every fault lifted")
    figures: dict = {"healed_at_s": healed}
    try:
        poll(lambda: not platform.supervisor.all_running(), 120, "every part running after the heal", 0.5)
    except TimeoutError as exc:  # judged at the end (down_after_heal); the catch-up is tried anyway
        say(f"[{history.t():7.1f}s] {exc}: {platform.supervisor.all_running()}")
    try:  # the producers send on until every fault they would show the recovery of has recovered
        poll(lambda: not injector.waiting_for("acks"), 180, "acks after every broker-side fault", 0.5)
    except TimeoutError as exc:
        say(f"[{history.t():7.1f}s] {exc}")
    time.sleep(5)
    for stream in platform.streams.values():
        assert stream.producer is not None
        stream.producer.stop(60)
    figures["producers_stopped_at_s"] = history.t()

    def drained() -> bool:
        return all(tally(s.producer.sent, s.producer.acked, [s.target, s.quarantine])["lost"] == 0
                   for s in platform.streams.values() if s.producer is not None)

    try:
        poll(drained, options.drain_s, "every acknowledged message in Delta after the heal", 3.0)
        figures["drained_s"] = round(history.t() - healed, 1)
    except TimeoutError as exc:
        figures["drained_s"] = None
        say(f"[{history.t():7.1f}s] {exc}")

    def served() -> bool:
        return all(recorder.ready_version(s.dataset) >= _latest_version(s.target) for s in platform.streams.values())

    try:
        poll(served, 240, "the speed layer serving every table's newest version", 1.0)
        figures["served_s"] = round(history.t() - healed, 1)
    except TimeoutError as exc:
        figures["served_s"] = None
        say(f"[{history.t():7.1f}s] {exc}")
    recorder.after_heal = True
    datasets = [s.dataset for s in platform.streams.values()]
    try:
        poll(lambda: all(sum(a.after_heal and a.dataset == d for a in history.answers) >= AFTER_HEAL_QUERIES
                         for d in datasets), 120, f"{AFTER_HEAL_QUERIES} queries of each dataset after the heal")
    except TimeoutError as exc:
        say(f"[{history.t():7.1f}s] {exc}")
    say(f"[{history.t():7.1f}s] caught up: {figures}")
    return figures


def _latest_version(table: Path) -> int:
    log = table / "_delta_log"
    return max((int(p.stem) for p in log.glob("*.json")), default=-1)


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (restarted parts, killed ones)."""
    own = os.times()
    return own.user + own.system + own.children_user + own.children_system


def _write(root: Path, options: SoakOptions, report: dict, machine0: float) -> None:
    report.setdefault("machine_cpu_s", round(machine_cpu_s() - machine0, 1))
    text = json.dumps(report, indent=1, default=str)
    (root / "report.json").write_text(text)
    if options.results is not None:
        Path(options.results).parent.mkdir(parents=True, exist_ok=True)
        Path(options.results).write_text(text)
