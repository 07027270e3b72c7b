"""A short soak (`bench/soak.py`) in the suite: the whole platform (a 3-member etcd, two
brokers, S3 on moto, two pipelines into Delta, the speed layer with two masters, three workers
and a gateway) under the fixed seed's schedule of every fault kind, with the negative control
planted in the same run: one row of pipeline B's target written again halfway, as a replay
without the duplicate guard would.

So one run shows both halves: the checker catches the planted duplicate (it can fail), and
finds nothing else (no message lost, no other duplicate, no gap, no cursor ahead of Delta, no
wrong or failed answer, every fault recovered). The long runs are `python bench/soak.py
--minutes 60 --seed N` (bench/README.md, "The soak").
"""

from __future__ import annotations

import pytest

from devstack.chaos.checker import FAILURES
from devstack.chaos.run import SoakOptions, run_soak
from devstack.chaos.schedule import KINDS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = 43
MINUTES = 1.5


def test_short_soak_with_every_fault_finds_only_the_planted_duplicate(tmp_path):
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        print(line, flush=True)  # seen with -s while it runs

    result = run_soak(SoakOptions(minutes=MINUTES, seed=SEED, kinds=tuple(KINDS), plant="duplicate",
                                  workdir=tmp_path / "soak"), say)
    log = "\n".join(lines)
    assert result.verdict is not None, f"the platform did not start: {result.error}\n{log}"
    counts = {name: result.verdict.counts[name] for name in FAILURES if result.verdict.counts[name]}
    planted = result.report["planted"]
    assert planted is not None, log
    assert counts == {"duplicated": 1}, f"{counts}\n{log}"
    assert result.verdict.examples["duplicated"] == [f"{planted['topic']}@{planted['offset']} x2"], log
    assert result.kept, "a failing run keeps its logs"
    kinds = {o["event"]["kind"] for o in result.report["outcomes"]}
    assert len(kinds) >= len(KINDS) - 2, f"kinds met: {sorted(kinds)}"
    # The suite's only test of a streaming (processingTime) pipeline's driver killed mid-stream.
    assert "pipeline_kill" in kinds, f"kinds met: {sorted(kinds)}"
    assert result.report["heal"]["drained_s"] is not None, log
