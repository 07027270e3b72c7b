"""Offsets skipped on executors (failOnDataLoss=false), carried back to the driver as files.

The driver plans around losses it can see (gaps in the descriptor chain, reused offsets) and
counts them itself. Executors find the others while reading: an object deleted after it was
planned, a CRC error, a byte range that ends early. Their count must reach query progress
(`skippedOffsets`, the driver's `reportLatestOffset`) and the pipelines' metrics, yet an
executor never talks to etcd, and `read()` runs in a Python worker with no channel back to
the driver's source process (which is itself a separate Python process, so Spark
accumulators, which only reach the driver's own Python, do not help either).

What both sides can reach is storage. The driver names, in each partition, one record file
under the directory of the `lostOffsetsLocation` option (an fsspec URL; a pipeline sets it
under its checkpoint); an executor that skipped offsets writes there one small JSON record of
what it skipped when its partition ends; the driver folds every record it finds into its
count at the next trigger and deletes it. This works wherever the location is shared storage,
as a checkpoint is on any cluster, with no new service and no Spark internals.

* A record's name is fixed by the batch (a hash of its offset range) and the partition index,
  so a retried task overwrites its failed attempt's record instead of adding a second one.
* It is written to a temporary name and renamed, so the driver never reads half a record.
* A record from an earlier run of the query that was never folded (the driver died) is
  counted by the next run: what a query reports is what its executors skipped.

Skips recorded during batch N show in the progress of the next batch the driver plans (Spark
takes the source's `reportLatestOffset` when it plans a batch, before the batch runs);
`skippedOffsets` is cumulative for the query's run, as for driver-side skips.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from typing import TYPE_CHECKING, Iterable, Mapping

from connectors.data_loss import LostRange

if TYPE_CHECKING:
    from connectors.options import DanubeOptions

logger = logging.getLogger(__name__)

_SUFFIX = ".lost.json"


def record_url(location: str, start: Mapping[str, int], end: Mapping[str, int], index: int) -> str:
    """Where partition `index` of the batch `[start, end)` records what it skipped."""
    batch = json.dumps([sorted(start.items()), sorted(end.items())], separators=(",", ":"))
    digest = hashlib.sha1(batch.encode()).hexdigest()[:16]
    return f"{location.rstrip('/')}/{digest}-{index:05d}{_SUFFIX}"


def write_record(url: str, storage_options: Mapping[str, object], lost: Iterable[LostRange]) -> None:
    """Executor side: record the offsets a partition skipped (nothing is written for none)."""
    ranges = [{"topic": r.topic, "start": r.start_offset, "end": r.end_offset, "source": r.source}
              for r in lost if r.count]
    if not ranges:
        return
    import fsspec

    fs, path = fsspec.core.url_to_fs(url, **dict(storage_options))
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    staged = f"{path}.tmp-{uuid.uuid4().hex}"
    with fs.open(staged, "w") as out:
        json.dump({"ranges": ranges}, out)
    fs.mv(staged, path)


def collect(location: str, storage_options: Mapping[str, object]) -> dict[str, int]:
    """Driver side: offsets skipped per topic in every record under `location`, which are then
    deleted. A record that cannot be read is left for the next call (and logged)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(location, **dict(storage_options))
    try:
        names = [n for n in fs.ls(root, detail=False) if n.endswith(_SUFFIX)]
    except FileNotFoundError:
        return {}
    counts: dict[str, int] = {}
    for name in sorted(names):
        try:
            with fs.open(name, "r") as handle:
                ranges = json.load(handle)["ranges"]
            found = {(r["topic"], int(r["start"]), int(r["end"])) for r in ranges}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("lost-offsets record %s unreadable (left for the next trigger): %s", name, exc)
            continue
        for topic, start, end in found:
            counts[topic] = counts.get(topic, 0) + max(0, end - start)
        fs.rm(name)
    return counts


def location_storage_options(options: "DanubeOptions") -> dict:
    """`storage.*` options apply to the lost-offsets location when it is on the same kind of
    storage as the topic data (e.g. both `s3://`), not to a local or another filesystem."""
    from urllib.parse import urlsplit

    same = urlsplit(options.lost_offsets_location or "").scheme == urlsplit(options.storage_url).scheme
    return dict(options.storage_options) if same else {}


def fold(options: "DanubeOptions", skipped: dict[str, int]) -> None:
    """Driver side, each trigger: add what executors recorded since the last one to `skipped`."""
    assert options.lost_offsets_location is not None
    for topic, count in collect(options.lost_offsets_location, location_storage_options(options)).items():
        skipped[topic] = skipped.get(topic, 0) + count
        logger.warning("subscription %s: executors skipped %d lost offsets of %s (failOnDataLoss=false)",
                       options.subscription, count, topic)
