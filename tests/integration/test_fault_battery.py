"""The fault battery's cases (`bench/faults.py`), small: each fault against real processes
on loopback (broker, `python -m pipelines run`, etcd, moto behind a fault proxy), and each
must end with 0 acknowledged messages lost and 0 duplicated in Delta.

The pipelines run as processes so they can be killed with -9; each costs a JVM start (run with
C1 only and the serial GC, `devstack.short_spark_runs.SHORT_RUN_JVM_OPTIONS`, about 23 CPU s), about 19
in all, which makes this module slow: an estimated 6-8 minutes on an idle 2-core machine, far
more under other load (the lock-lease test alone took 7 minutes at load 30-35). See the
fault battery section of bench/README.md.
"""

from __future__ import annotations

import os

import pytest

from devstack.faults import cases
from devstack.faults import cases_infra as infra
from pipelines.batch_hooks import STEPS

# Each case goes to any free pytest-xdist worker (no case judges by timing: the lock-lease case
# tells a revoked lease from an expired one by keeping the lease alive itself).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

# DANUBE_FAULT_BATTERY=full runs every case at the battery's own sizes (as `python
# bench/faults.py` does) instead of the small ones.
FULL = os.environ.get("DANUBE_FAULT_BATTERY") == "full"
SMALL = cases.Sizes(before=40, after=30, batch=100, register_ttl_s=3, fault_s=4.0, send_rate_per_s=25)
SIZES = cases.Sizes(register_ttl_s=3) if FULL else SMALL


def exactly_once(result: dict) -> dict:
    assert result["acked"] > 0, result
    assert result["lost"] == 0, f"acknowledged messages lost: {result}"
    assert result["duplicated"] == 0, f"messages duplicated: {result}"
    assert result["foreign"] == 0, result
    return result


def test_broker_kill9_while_producing_loses_no_acknowledged_message(etcd_server, tmp_path):
    result = exactly_once(cases.broker_kill9(tmp_path, etcd_server, SIZES))
    assert result["recovery_s"] is not None


# Every step of a batch, in two chains of its own: each chain's pipeline costs a JVM start per
# step, and the one chain of all steps was the suite's longest test (270 s of its 25 minutes);
# two chains run on two workers at once.
STEP_CHAINS = (STEPS[:len(STEPS) // 2], STEPS[len(STEPS) // 2:])


def test_the_step_chains_cover_every_step_once() -> None:
    assert [step for chain in STEP_CHAINS for step in chain] == list(STEPS)


@pytest.mark.parametrize("steps", STEP_CHAINS, ids="+".join)
def test_driver_killed_at_every_step_of_a_batch_replays_exactly_once(etcd_server, tmp_path, steps):
    """One pipeline, killed at each step of its chain in turn (each replay of the batch dies at
    the next step), then run through."""
    result = exactly_once(cases.driver_kill9(tmp_path, etcd_server, SIZES, steps))
    assert result["outcome"].startswith(f"exit codes {[-9] * len(steps) + [0]}"), result


def test_python_worker_killed_mid_task(etcd_server, tmp_path):
    exactly_once(infra.worker_kill9(tmp_path, etcd_server, SIZES))


def test_etcd_killed_and_restarted_under_a_stream(etcd_server, tmp_path):
    exactly_once(infra.etcd_kill_restart(tmp_path, etcd_server, SIZES))


def test_etcd_slowed_past_its_request_timeout(etcd_server, tmp_path):
    exactly_once(infra.etcd_slow(tmp_path, etcd_server, SIZES))


def test_s3_slowdown_and_dropped_connections(etcd_server, tmp_path):
    exactly_once(infra.s3_faults(tmp_path, etcd_server, SIZES))


def test_deleted_object_is_refused_naming_it_and_only_its_messages_are_lost(etcd_server, tmp_path):
    """The one fault that destroys data: acknowledged messages in the deleted object are lost,
    but only those, after a refusal that names them."""
    result = infra.object_deleted(tmp_path, etcd_server, SIZES)
    assert "lost = exactly that object's messages (yes)" in result["outcome"], result
    assert result["duplicated"] == 0 and result["foreign"] == 0, result


def test_deleted_checkpoint_is_refused_and_its_advice_resumes_exactly(etcd_server, tmp_path):
    exactly_once(cases.checkpoint_deleted(tmp_path, etcd_server, SIZES))
    assert_quiet_exit(last_successful_log(tmp_path, "first"))


def last_successful_log(root, tag: str):
    """The log of a case's run tagged `tag` that ended it (a supervised run's retries are
    `<tag>-<n>.log`; the last one is the run that succeeded)."""
    logs = sorted(root.rglob(f"{tag}*.log"), key=lambda path: path.stat().st_mtime)
    assert logs, f"no {tag}*.log under {root}"
    return logs[-1]


def assert_quiet_exit(log) -> None:
    """A successful `python -m pipelines run` ends without an ERROR or a traceback.

    Every run used to end with "ERROR StreamingQueryListenerBus: Listener
    PythonStreamingQueryListenerWrapper threw an exception ... Py4JException": the process
    exited with listener events still queued for connectors' Python `DanubeCursorCommitter`,
    and the JVM's shutdown hook delivered them after Python had gone. It happens only when the
    Python process exits with its session, as each pipeline of this battery does, so the check
    rides on one of their runs instead of a Spark start of its own."""
    output = log.read_text(errors="replace")
    assert " finished: {" in output, output[-3000:]
    assert "ERROR StreamingQueryListenerBus" not in output, output[-3000:]
    assert "Traceback" not in output and " ERROR " not in output, output[-3000:]


def test_same_pipeline_started_twice_on_one_subscription(etcd_server, tmp_path):
    exactly_once(cases.same_subscription_twice(tmp_path, etcd_server, SIZES))


def test_lock_lease_lost_mid_query_stops_it_and_a_restart_is_exact(etcd_server, tmp_path):
    """Also: SIGTERM of the restarted pipeline releases the lock (revokes its lease) instead of
    leaving it to expire, told apart by keeping the lease alive from the test meanwhile."""
    result = exactly_once(cases.lock_lease_lost(tmp_path, etcd_server, SIZES))
    assert result["lock_released"], result
