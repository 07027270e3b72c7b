"""What the leader does with a replica whose load FAILED: pure record arithmetic.

A worker that reports `DataPullStatusUpdate` FAILED (it cannot reach the plan's files, a file
is gone, the data does not fit its memory) is taken off the epoch and its reason kept in the
record's `load_failures`; the placement then picks another eligible worker of the tenant, never
one that failed this epoch before. Attempts are bounded by `GlobalConfig.max_load_failures`:
once that many workers have failed, no new replica is placed for failures (a lost worker's
replica is still replaced). The epoch turns FAILED only when it has no replica left and no
worker can be tried, so a partly failed epoch keeps serving from the replicas that loaded.
"""

from __future__ import annotations

from dataclasses import replace

from speedlayer.records import ASSIGNED, FAILED, PLANNED, R_FAILED, AssignmentRecord

MAX_REASON_CHARS = 500  # a worker's error text can carry a whole stack; the record stays small


def retire_failed_replicas(record: AssignmentRecord) -> AssignmentRecord | None:
    """`record` with its FAILED replicas moved to `load_failures` (None: nothing to move).

    A leaving replica was READY and is on its way out anyway: its failure is not an attempt.
    """
    failed = {w: r for w, r in record.replicas.items() if r.state == R_FAILED}
    if not failed or record.status not in (PLANNED, ASSIGNED):
        return None
    replicas = {w: r for w, r in record.replicas.items() if w not in failed}
    failures = dict(record.load_failures)
    for worker, replica in failed.items():
        if not replica.leaving:
            failures[worker] = (replica.error or "no reason given")[:MAX_REASON_CHARS]
    return replace(record, replicas=replicas, load_failures=failures)


def replication_target(record: AssignmentRecord, max_load_failures: int) -> int:
    """How many replicas placement should give `record`: its replication, unless the failure
    budget is spent, then no more than it has (so failures cause no further attempts)."""
    if len(record.load_failures) < max_load_failures:
        return record.replication
    return min(record.replication, len(record.staying()))


def failed_everywhere(record: AssignmentRecord, max_load_failures: int) -> AssignmentRecord | None:
    """`record` as FAILED if its loads failed and no replica is left (None: it stands).

    Called after placement had its chance: an epoch without replicas then has no eligible
    worker left to try (all failed it, or the budget is spent).
    """
    if record.status not in (PLANNED, ASSIGNED) or not record.load_failures or record.replicas:
        return None
    spent = len(record.load_failures) >= max_load_failures
    why = (f"max_load_failures={max_load_failures} reached" if spent
           else f"no other eligible worker of tenant {record.tenant}")
    reasons = "; ".join(f"{w}: {reason}" for w, reason in sorted(record.load_failures.items()))
    return replace(record, status=FAILED,
                   message=f"loading failed on {len(record.load_failures)} worker(s) and {why}: {reasons}")
