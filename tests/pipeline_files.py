"""Pipeline files for tests: the shipped `conf/pipelines/orders.yaml` pointed at a test's services."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from devstack.demo import PIPELINE_FILE


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
