"""Pipeline files for tests: the shipped `conf/pipelines/orders.yaml` pointed at a test's services."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from devstack import REPO_ROOT
from devstack.broker_stack import EmbeddedStack
from devstack.demo import PIPELINE_FILE, produce, sample_orders


def orders_pipeline_file(root: Path, *, subject: str, source_keys: dict[str, Any], name: str | None = None,
                         **changes: Any) -> Path:
    """orders.yaml with `source_keys` set in its `source` and `decode.subject` replaced, its
    tables and checkpoint under `root`, each of `changes` laid over its section (after
    `source_keys`); written as `root/<name>.yaml` (`name` also names the pipeline; by default
    the shipped name and `orders.yaml`)."""
    data = yaml.safe_load(PIPELINE_FILE.read_text())
    if name is not None:
        data["name"] = name
    data["source"].update(source_keys)
    data["decode"]["subject"] = subject
    for table in ("target", "quarantine"):
        data[table]["path"] = str(root / table)
    data["checkpoint"] = str(root / "checkpoint")
    for section, values in changes.items():
        data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
    path = root / f"{name or 'orders'}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def stack_pipeline_file(stack: EmbeddedStack, root: Path, name: str, topic: str, subject: str,
                        **changes: Any) -> Path:
    """orders.yaml reading `topic` from the embedded stack's etcd and storage as subscription
    `name`, with everything under `root` and `changes` laid over it."""
    source = dict(etcd_endpoints=stack.etcd_endpoint, storage_url=stack.storage_url, topics=[topic],
                  subscription=name)
    return orders_pipeline_file(root, subject=subject, name=name, source_keys=source, **changes)


def publish_orders(stack: EmbeddedStack, topic: str, count: int,
                   schema_subject: str | None = None) -> list[tuple[bytes, bool]]:
    """`count` sample orders published through the stack's broker, one at a time so message i
    gets offset i; (payload, whether it is a valid order) each."""
    orders = sample_orders(count)
    asyncio.run(produce(stack.service_url, topic, [p for p, _ in orders], concurrency=1,
                        schema_subject=schema_subject))
    return orders


def run_to_end(config: Any, spark: Any) -> None:
    """Run an availableNow pipeline in `spark` until it has read everything, then stop it."""
    from pipelines.runner import PipelineRunner

    runner = PipelineRunner(config, spark)
    try:
        runner.run()
    finally:
        runner.stop()


def run_pipeline_process(file: Path, log: Path, timeout_s: int = 600) -> None:
    """`python -m pipelines run <file>` as a user runs it, to its end (an availableNow file):
    for a test outside the suite's Spark session, which then waits on no other module's tests."""
    with log.open("w") as output:
        done = subprocess.run([sys.executable, "-m", "pipelines", "run", str(file)], cwd=str(REPO_ROOT),
                              stdout=output, stderr=subprocess.STDOUT, timeout=timeout_s)
    assert done.returncode == 0, f"pipeline {file} exited {done.returncode}:\n{log.read_text()[-4000:]}"


def assert_exactly_once(target: list[dict], quarantine: list[dict], orders: list[tuple[bytes, bool]],
                        topic: str) -> None:
    """The rows of an orders pipeline's two tables hold every one of `orders` (published to
    `topic` from offset 0) exactly once: the valid ones in the target, the others in the
    quarantine with their payload."""
    keys = [(r["_topic"], r["_offset"]) for r in target + quarantine]
    assert len(keys) == len(set(keys)) == len(orders), "every message exactly once, in one of the two tables"
    assert {r["_offset"] for r in target} == {i for i, (_, ok) in enumerate(orders) if ok}
    assert {r["_offset"] for r in quarantine} == {i for i, (_, ok) in enumerate(orders) if not ok}
    assert all(bytes(r["payload"]) == orders[r["_offset"]][0] for r in quarantine)
    assert {r["_topic"] for r in target} == {topic}
