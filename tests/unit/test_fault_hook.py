"""The sink's driver-kill test hook: inert unless armed, fires once per step, refuses unknown steps."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from devstack.faults import hook as fault_hook
from devstack import REPO_ROOT

pytestmark = pytest.mark.unit

FIRE = "from devstack.faults.hook import fault_point; fault_point('after_target_write'); print('survived')"


def run_hook(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", FIRE], cwd=REPO_ROOT, env={"PYTHONPATH": str(REPO_ROOT), **env},
                          capture_output=True, text=True, timeout=60)


def test_unarmed_hook_does_nothing(monkeypatch):
    monkeypatch.delenv(fault_hook.ENV_STEPS, raising=False)
    store = object()
    assert not fault_hook.armed("after_target_write")
    assert fault_hook.faulting_store(store) is store
    with fault_hook.fault_window("during_target_write"):
        pass
    fault_hook.fault_point("after_target_write")
    hooks = fault_hook.FaultHooks()  # what `python -m devstack.faults.pipeline` passes into the sink
    assert hooks.cursor_store(store) is store
    with hooks.around("during_target_write"):
        pass
    hooks.at("after_target_write")


def test_an_armed_step_kills_once_then_the_restart_runs_through(tmp_path):
    env = {fault_hook.ENV_STEPS: "after_target_write", fault_hook.ENV_MARKERS: str(tmp_path)}
    first = run_hook(env)
    assert first.returncode == -signal.SIGKILL
    assert (tmp_path / "fault-after_target_write.fired").exists()
    second = run_hook(env)
    assert second.returncode == 0 and "survived" in second.stdout


def test_another_step_armed_leaves_this_one_alone(tmp_path):
    done = run_hook({fault_hook.ENV_STEPS: "during_cursor_commit", fault_hook.ENV_MARKERS: str(tmp_path)})
    assert done.returncode == 0


def test_an_unknown_step_is_refused_naming_the_accepted_ones(monkeypatch):
    monkeypatch.setenv(fault_hook.ENV_STEPS, "after_target_wrte")
    with pytest.raises(ValueError, match="after_target_wrte.*accepted: during_target_write"):
        fault_hook.armed("after_target_write")
