"""An answer over an epoch and its tail: the view a query reads, and what its metadata says.

The dataset's view is the epoch's table `UNION ALL BY NAME` the pinned tail rows (the rows of
the tail's table in the snapshot's offset ranges, read in the transaction the snapshot started
on the query's cursor: `speedlayer.worker.tail_table`): by name,
because the pipeline's rows come out of Spark with its column order, and a column a newer schema
version adds is in the tail before it is in an epoch (the epoch's rows read NULL there, as Delta's
schema merge would give them).

The answer's schema metadata says what it counts, so a caller can tell a committed answer from a
fresher one: `speedlayer.epoch` (the epoch id) and `speedlayer.tail` (JSON: the tail's state, its
last offset per topic partition, its age in milliseconds, the rows it added to this answer and the
rows it holds; or why it added none).
"""

from __future__ import annotations

import json
import pyarrow as pa

from speedlayer.worker.loader import quote
from speedlayer.worker.tails import PinnedTail

EPOCH_KEY = b"speedlayer.epoch"
TAIL_KEY = b"speedlayer.tail"


def bind_tail(table: str, tail: PinnedTail | None) -> str:
    """The SELECT the dataset's view is: the epoch's table, plus the tail's rows when there are some."""
    epoch = f"SELECT * FROM main.{quote(table)}"
    if tail is None or tail.snapshot is None or tail.snapshot.relation is None:
        return epoch
    return f"{epoch} UNION ALL BY NAME {tail.snapshot.relation}"


def answer_schema(schema: pa.Schema, epoch: str, tail: PinnedTail | None, committed_only: bool) -> pa.Schema:
    """`schema` with the answer's epoch and tail in its metadata (unchanged for a dataset without a tail)."""
    if tail is None and not committed_only:
        return schema
    if committed_only:
        described: dict = {"state": "off: the committed epoch alone was asked for"}
    elif tail is not None and tail.snapshot is not None:
        described = tail.snapshot.metadata()
    else:
        described = {"state": f"none: {tail.note}" if tail is not None and tail.note else "none"}
    return schema.with_metadata({**(schema.metadata or {}), EPOCH_KEY: epoch.encode(),
                                 TAIL_KEY: json.dumps(described, sort_keys=True).encode()})
