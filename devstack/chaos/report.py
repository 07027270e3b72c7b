"""The soak's printed report: the schedule with what became of each fault, the counts per
anomaly class with examples, the parts' own exits, and the figures (messages, commits,
queries, faults by kind, recovery p50/max per kind, wall and CPU seconds, load)."""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from typing import Callable, Iterable

from devstack.chaos.checker import FAILURES
from devstack.chaos.injectors import Outcome
from devstack.chaos.supervisor import Exit


def print_report(report: dict, outcomes: Iterable[Outcome], exits: Iterable[Exit],
                 say: Callable[[str], None]) -> None:
    outcomes, exits = list(outcomes), list(exits)
    verdict = report["verdict"]
    say("\n== schedule (start, kind, target, length) -> recovery")
    for o in outcomes:
        recovery = "NOT RECOVERED" if o.recovery_s is None else f"recovered in {o.recovery_s:.1f}s"
        say(f"  {o.event}  -> {recovery}{'; ' + o.note if o.note else ''}")
    say("\n== faults by kind: count, recovery p50 / max (s)")
    for kind, row in recovery_by_kind(outcomes).items():
        say(f"  {kind:<15} {row['count']:>3}   {_s(row['p50_s'])} / {_s(row['max_s'])}")
    report["recovery_by_kind"] = recovery_by_kind(outcomes)
    say("\n== anomalies (a run passes when every class but 'resent' is 0)")
    for name in (*FAILURES, "resent"):
        count = verdict["counts"].get(name, 0)
        say(f"  {name:<20} {count}")
        for example in verdict["examples"].get(name, []):
            say(f"      e.g. {example}")
    own = [e for e in exits if not e.by_fault]
    say(f"\n== exits the faults did not cause (loud errors; each part restarted): {len(own)}")
    for e in own[:30]:
        say(f"  {e.at_s:7.1f}s {e.part} exit {e.code}: {e.said}")
    say("\n== figures")
    for key, value in sorted(verdict["figures"].items()):
        say(f"  {key}: {value}")
    say(f"  heal: {report.get('heal')}")
    say(f"  planted: {report.get('planted')}")
    load = os.getloadavg()
    report["load_at_end"] = [round(x, 2) for x in load]
    say(f"  wall {report['wall_s']} s, CPU {report['cpu_s']} s (this process and the parts it reaped), "
        f"machine CPU {report.get('machine_cpu_s')} s (everything on the machine meanwhile), load {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} (1/5/15 min)")


def recovery_by_kind(outcomes: Iterable[Outcome]) -> dict[str, dict]:
    """kind -> count, recovered, p50 and max recovery seconds (None where none recovered)."""
    times: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)
    for o in outcomes:
        counts[o.event.kind] += 1
        if o.recovery_s is not None:
            times[o.event.kind].append(o.recovery_s)
    return {kind: {"count": counts[kind], "recovered": len(times[kind]),
                   "p50_s": round(statistics.median(times[kind]), 2) if times[kind] else None,
                   "max_s": round(max(times[kind]), 2) if times[kind] else None} for kind in sorted(counts)}


def machine_cpu_s() -> float:
    """The machine's busy CPU seconds since boot (/proc/stat), all processes of every user:
    the difference over a run is what the run cost with whatever else ran beside it."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return round((sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK"), 1)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
