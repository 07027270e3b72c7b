"""How a writer tells the speed layer it committed a table: `announce(...)`, the one public entry.

A job that writes a table a speed-layer dataset follows (the pipelines' `speedlayer:` feed, or
any other writer) calls `announce` after its commit; the leading master watches
`{key_root}/announce/{tenant}/{dataset}` and plans the next epoch at once instead of at its next
poll. The key layout and the record stay the speed layer's own (`speedlayer.keys`,
`speedlayer.records`): writers import only this module, so neither can change under them
unseen. An announcement is a hint (the master reads the table's log itself), so a writer may
treat a failure as harmless: the master's poll finds the commit too.
"""

from __future__ import annotations

import time

from danube_core.metadata import MetadataStore
from speedlayer.keys import SpeedLayerKeys, valid_id
from speedlayer.records import Announcement

ID_FORM = "1-128 of letters, digits, '_', '.', '-'"


def announce_problems(tenant: str, dataset: str, key_root: str = "") -> dict[str, str]:
    """What is wrong with an announcement target, by field (`tenant`, `dataset`, `key_root`);
    empty when `announce` would accept it. For a writer to check its configuration up front."""
    problems = {name: f"{value!r}: expected {ID_FORM}"
                for name, value in (("tenant", tenant), ("dataset", dataset)) if not valid_id(value)}
    try:
        SpeedLayerKeys(key_root)
    except ValueError as exc:
        problems["key_root"] = str(exc)
    return problems


def announcement_key(tenant: str, dataset: str, key_root: str = "") -> str:
    """The etcd key `announce` writes (for logs and tests)."""
    return SpeedLayerKeys(key_root).announce(tenant, dataset)


def announce(metadata: MetadataStore, tenant: str, dataset: str, table_uri: str, *, version: int = -1,
             writer: str = "", key_root: str = "", committed_ms: int | None = None) -> int:
    """Announce that `writer` committed `version` (-1: unknown) of `table_uri`, the table the
    speed layer's `tenant`/`dataset` follows; returns the store revision of the write.

    `metadata` is the speed layer's etcd (with `key_root` its `etcd.key_root`). Raises
    `ValueError` for a bad tenant, dataset or key root, and the store's errors (`MetadataError`,
    `MetadataUnavailableError`) when the write fails."""
    problems = announce_problems(tenant, dataset, key_root)
    if problems:
        raise ValueError("; ".join(f"{name} {problem}" for name, problem in problems.items()))
    committed = int(time.time() * 1000) if committed_ms is None else committed_ms
    record = Announcement(table_uri, version, writer, committed)
    return metadata.put(announcement_key(tenant, dataset, key_root), record.to_json())
