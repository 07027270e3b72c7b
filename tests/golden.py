"""The real Danube v0.7.3 broker's golden corpus (`../shared/golden`), replayed for tests.

Each scenario's `etcd.jsonl` is put into an etcd of its own (the keys are cluster-wide:
`/cluster/leader`, registrations, ...; they must not meet the suite's brokers), and its
`cloud/` and WAL directories are read in place: nothing here writes under the corpus.
`expected()` gives what the client received for the current run, per (topic, offset), in
the shape `message_key` builds from a decoded row.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from danube_core.metadata import MetadataStore

# The one definition of where the corpus is: `../shared/golden` beside the checkout, as CI has
# it, or DANUBE_GOLDEN_DIR.
GOLDEN_DIR = Path(os.environ.get("DANUBE_GOLDEN_DIR") or Path(__file__).resolve().parents[2] / "shared" / "golden")


def require_golden() -> Path:
    """The corpus directory. Missing, it fails the test under CI (where it must be, and a skip
    would pass a run that checked nothing against the real broker) and skips it elsewhere."""
    if GOLDEN_DIR.is_dir():
        return GOLDEN_DIR
    message = f"the golden corpus is not at {GOLDEN_DIR} (../shared/golden beside the checkout, or DANUBE_GOLDEN_DIR)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
SCENARIOS = ("normal", "rotated", "rotated-one-object", "moved", "partitioned")
TOPICS = {"normal": "/default/normal", "rotated": "/default/rotated", "rotated-one-object": "/default/rotated",
          "moved": "/default/moved", "partitioned": "/default/parts"}
# The subscription whose `received` records are the current run (moved: broker B's audit).
CURRENT_RUN_SUBSCRIPTION = {"moved": "audit-b"}
MOVED_OLD_OWNER_SUBSCRIPTION = "resume"
MOVED_ORPHAN = "data-0-1795442995.dnb1"
MOVED_STALE_DESCRIPTOR_OBJECT = "data-600-1795443005.dnb1"

Message = tuple  # (offset, payload sha256, sorted attributes, producer_name, publish_time, schema id, version)


def manifest(scenario: str) -> Iterator[dict]:
    with open(GOLDEN_DIR / scenario / "manifest.jsonl", encoding="utf-8") as fh:
        for line in fh:
            yield json.loads(line)


def header(scenario: str) -> dict:
    return next(manifest(scenario))


def received(scenario: str, subscription: str) -> dict[tuple[str, int], Message]:
    """What `subscription`'s consumer was given, by (broker topic name, offset)."""
    out = {}
    for record in manifest(scenario):
        if record["type"] == "received" and record["subscription"] == subscription:
            out[(record["topic_name"], record["offset"])] = (
                record["offset"], record["payload_sha256"], tuple(sorted(record["attributes"].items())),
                record["producer_name"], record["publish_time"], record["schema_id"], record["schema_version"])
    return out


def expected(scenario: str) -> dict[tuple[str, int], Message]:
    """The current run's messages: what a correct reader of the topic returns."""
    return received(scenario, CURRENT_RUN_SUBSCRIPTION.get(scenario, "audit"))


def message_key(topic: str, row: dict[str, Any]) -> tuple[tuple[str, int], Message]:
    """(topic, offset) and the compared fields of a decoded row (Arrow or Spark)."""
    attributes = row["attributes"]
    attributes = attributes.items() if isinstance(attributes, dict) else attributes
    payload = row["payload"]
    return (topic, int(row["offset"])), (
        int(row["offset"]), hashlib.sha256(bytes(payload)).hexdigest(), tuple(sorted(attributes)),
        row["producer_name"], int(row["publish_time"]), row["schema_id"], row["schema_version"])


def broker_ids(scenario: str) -> dict[str, int]:
    """WAL directory name -> the broker id that wrote it."""
    h = header(scenario)
    if scenario == "moved":
        return {h["broker_a"]["wal"]: h["broker_a"]["id"], h["broker_b"]["wal"]: h["broker_b"]["id"]}
    return {"wal": h["broker_id"]}


@dataclass
class GoldenScenario:
    """One scenario replayed into an etcd: the `danube` options that read it."""

    name: str
    etcd_endpoint: str

    @property
    def topic(self) -> str:
        return TOPICS[self.name]

    @property
    def storage_url(self) -> str:
        return (GOLDEN_DIR / self.name / "cloud").as_uri()

    def wal_map(self) -> str:
        """`walRoot` as a JSON map from broker id to the scenario's WAL directory."""
        return json.dumps({str(b): (GOLDEN_DIR / self.name / d).as_uri() for d, b in broker_ids(self.name).items()})

    def options(self, **extra: str) -> dict[str, str]:
        return {"etcd.endpoints": self.etcd_endpoint, "storage.url": self.storage_url,
                "topic": self.topic, **extra}


def replay(store: MetadataStore, scenario: str) -> None:
    """Make `store` hold exactly the scenario's keys, byte for byte."""
    store.delete_prefix("/")
    with open(GOLDEN_DIR / scenario / "etcd.jsonl", encoding="utf-8") as fh:
        for line in fh:
            record = json.loads(line)
            store.put(record["key"], record["value"].encode("utf-8"))
