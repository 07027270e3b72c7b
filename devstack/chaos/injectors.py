"""Carrying out the schedule (`devstack.chaos.schedule`) on the running platform: each event in a
thread of its own (so faults overlap as scheduled), then a recovery probe that waits for what
the fault stopped to work again.

Recovery time is measured from the end of the fault (the restart's hold over, the pause or
proxy mode lifted) until the probe of its kind holds: `acks` (every producer acknowledged a
send since), `commits` (every pipeline committed a Delta version since), `answers` (the
gateway answered each dataset since), `fresh` (a newer epoch became READY for each dataset).
With faults overlapping, a recovery includes waiting out the others: figures are upper bounds.

The fault machinery is the battery's: the proxies (`devstack.faults.proxies`), the subscription
lock revocation (`devstack.faults.cases._revoke_lease_of`), the Python task worker kill
(`devstack.faults.cases_infra`), the broker CLI's `topics unload` for a move.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from devstack.chaos import wal_disk
from devstack.chaos.platform import Platform, _admin
from devstack.chaos.recorder import History
from devstack.chaos.schedule import FaultEvent
from devstack.faults.cases import _revoke_lease_of
from devstack.faults.cases_infra import _kill_newest_child, _task_worker_daemon
from devstack.faults.kit import poll
from devstack.faults.proxies import DELAY, HTTP503, PASS, RESET

logger = logging.getLogger(__name__)

PROBES: dict[str, tuple[str, ...]] = {
    "broker_kill": ("acks",), "broker_pause": ("acks",),
    "pipeline_kill": ("commits",), "pipeline_pause": ("commits",), "pyworker_kill": ("commits",),
    "lease_revoke": ("commits",), "topic_move": ("acks", "commits"),
    "master_kill": ("fresh",), "worker_kill": ("answers", "fresh"), "worker_pause": ("answers", "fresh"),
    "gateway_kill": ("answers",),
    "etcd_kill": ("acks", "commits", "answers"), "etcd_pause": ("acks", "commits", "answers"),
    "etcd_slow": ("acks", "commits"),
    "s3_503": ("commits",), "s3_reset": ("commits",), "s3_slow": ("commits",), "disk_full": ("acks",),
}


@dataclass
class Outcome:
    """What became of one event: when it began and ended (s into the run), what it hit, its
    recovery (None: not recovered when the run ended) and a note (e.g. nothing to kill)."""

    event: FaultEvent
    began_s: float = 0.0
    ended_s: float = 0.0
    recovery_s: float | None = None
    note: str = ""
    held: dict[str, float] = field(default_factory=dict)  # probe -> seconds after the end it first held

    def to_json(self) -> dict:
        return {**asdict(self), "event": self.event.to_json()}


class Injector:
    """Runs events against `platform`, probing recovery against `history`."""

    def __init__(self, platform: Platform, history: History) -> None:
        self.platform, self.history = platform, history
        self.outcomes: list[Outcome] = []
        self.closing = threading.Event()  # set when the run ends: probes give up
        self._threads: list[threading.Thread] = []

    def launch(self, event: FaultEvent) -> None:
        outcome = Outcome(event)
        self.outcomes.append(outcome)
        thread = threading.Thread(target=self._run, args=(outcome,), name=f"fault-{event.kind}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def waiting_for(self, probe: str) -> list[Outcome]:
        """Events still waiting for `probe` to hold (not recovered yet)."""
        return [o for o in self.outcomes if probe in PROBES[o.event.kind] and probe not in o.held]

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))

    def _run(self, outcome: Outcome) -> None:
        event = outcome.event
        outcome.began_s = self.history.t()
        try:
            outcome.note = self._inject(event) or ""
        except Exception as exc:  # the fault itself failed: said, and the run goes on
            outcome.note = f"fault not applied: {type(exc).__name__}: {str(exc)[:200]}"
            logger.warning("soak: %s on %s: %s", event.kind, event.target, outcome.note)
        outcome.ended_s = self.history.t()
        self._probe(outcome)

    def _inject(self, event: FaultEvent) -> str | None:
        sup, kind, target, hold = self.platform.supervisor, event.kind, event.target, event.duration_s
        part = f"pipeline-{target}" if kind.startswith("pipeline") else target
        if kind.endswith("_kill") and kind != "pyworker_kill":
            sup.kill(part, hold)
            time.sleep(hold)
            return None
        if kind.endswith("_pause"):
            sup.pause(part)
            try:
                time.sleep(hold)
            finally:
                sup.resume(part)
            return None
        proxy_modes: dict[str, Callable[[], None]] = {
            "etcd_slow": lambda: self._front().set_mode(DELAY, event.param or 0.5),
            "s3_503": lambda: self._s3().set_mode(HTTP503), "s3_reset": lambda: self._s3().set_mode(RESET),
            "s3_slow": lambda: self._s3().set_mode(DELAY, event.param or 0.5),
        }
        if kind in proxy_modes:
            proxy = self._front() if kind == "etcd_slow" else self._s3()
            proxy_modes[kind]()
            try:
                time.sleep(hold)
            finally:
                proxy.set_mode(PASS)
            return None
        if kind == "disk_full":
            wal = self.platform.brokers[target].workdir / "wal"
            taken = wal_disk.fill(wal)
            try:
                time.sleep(hold)
            finally:
                wal_disk.free(wal)
            return f"{taken >> 20} MiB allocated"
        return {"pyworker_kill": self._kill_task_worker, "lease_revoke": self._revoke_lock,
                "topic_move": self._move_topic}[kind](event)

    def _front(self):
        assert self.platform.front is not None
        return self.platform.front

    def _s3(self):
        assert self.platform.s3 is not None
        return self.platform.s3

    def _kill_task_worker(self, event: FaultEvent) -> str:
        driver = self.platform.supervisor.pid(f"pipeline-{event.target}")
        if driver is None:
            return "no driver running"
        daemon = _task_worker_daemon(driver)
        if daemon is None:
            return "no Python task worker daemon yet"
        try:
            victim = poll(lambda: _kill_newest_child(daemon), 5, "a Python task worker", 0.01)
        except TimeoutError:
            return "no task running within 5 s"
        return f"killed task worker {victim}"

    def _revoke_lock(self, event: FaultEvent) -> str:
        from danube_core.keys import subscription_lock_key

        stream = self.platform.streams[event.target]
        key = subscription_lock_key("/danube-data", stream.subscription)
        for member in self.platform.etcd.members:
            try:
                _revoke_lease_of(member.endpoint, key)
                return f"revoked the lease of {key}"
            except RuntimeError as exc:
                return str(exc)  # no lock held right now (the pipeline is restarting)
            except Exception:
                continue  # this member is down or paused: the next one
        return "no etcd member answered"

    def _move_topic(self, event: FaultEvent) -> str:
        stream = self.platform.streams[event.target]
        topic = stream.topic_partitions[int(event.start_s * 10) % len(stream.topic_partitions)]
        _admin(self.platform.etcd.endpoints, "topics", "unload", topic)
        return f"unloaded {topic}"

    def _probe(self, outcome: Outcome) -> None:
        since = outcome.ended_s
        checks = {name: self._check(name, since) for name in PROBES[outcome.event.kind]}
        while not self.closing.is_set():
            for name, check in checks.items():
                if name not in outcome.held and check():
                    outcome.held[name] = round(self.history.t() - since, 2)
            if len(outcome.held) == len(checks):
                outcome.recovery_s = max(outcome.held.values())
                return
            self.closing.wait(0.25)

    def _check(self, probe: str, since: float) -> Callable[[], bool]:
        streams, history = self.platform.streams, self.history
        started = history.started
        if probe == "acks":
            return lambda: all(s.producer is not None and any(t - started >= since for t in s.producer.ack_times[-50:])
                               for s in streams.values())
        if probe == "commits":
            return lambda: {n for t, n, _ in history.commits_seen[-50:] if t >= since} >= set(streams)
        if probe == "answers":
            return lambda: {a.dataset for a in history.answers[-20:] if a.t0 >= since and not a.error} >= {
                s.dataset for s in streams.values()}
        # fresh: an epoch newer than the newest READY one when the fault ended, as the readers saw them
        baseline = {s.dataset: max((a.ready_after for a in list(history.answers) if a.dataset == s.dataset
                                    and a.t1 <= since), default=-1) for s in streams.values()}
        return lambda: all(any(a.dataset == d and a.ready_before > v for a in history.answers[-40:])
                           for d, v in baseline.items())
