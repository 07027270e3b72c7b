"""Computes each written Delta table's state in the background, ahead of the sink's next write.

Why: the sink appends with Delta's idempotent-write options (`txnAppId`/`txnVersion`), so every
write asks Delta which batch the pipeline last committed to the table. Delta (4.x) answers that
from the snapshot's full state (`Snapshot.transactions` -> `computedState`), and computes it with
three Spark jobs over the transaction log for every new table version, even though the version's
checksum file holds the same transactions. Those jobs were about 0.8 s of each write on a
two-core machine, paid again by the quarantine write, more than the 500 ms trigger.

The state is computed once per snapshot and kept on it, and the sink's own commit installs the
snapshot its next write to that table starts from. So right after a write, a background thread
asks Delta for the table's details (`DeltaTable.detail()`, which reads the same state), and those
jobs overlap with the rest of the micro-batch, Spark's offset commit and the next batch's read
and decode. The next write finds the state computed and runs one job instead of four.

Nothing depends on the warm-up for correctness: if it has not finished when the write needs the
state, the write waits for it (Delta computes a snapshot's state once, under the snapshot's
lock); if it failed, or another writer committed in between, the write computes the state itself
as it always did. Failures are logged at DEBUG level and otherwise ignored.
"""

from __future__ import annotations

import logging
import queue
import threading

from pyspark.sql import SparkSession

from pipelines.config import TableConfig

logger = logging.getLogger(__name__)


class TableStateWarmer:
    """One daemon thread computing the state of the tables handed to `warm`, in order.

    Requests for a table already waiting in the queue are dropped: the queued one reads the
    newest version when it runs."""

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[SparkSession, TableConfig]] = queue.Queue()
        self._queued: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def warm(self, spark: SparkSession, table: TableConfig) -> None:
        """Compute `table`'s current state soon, off the caller's thread."""
        with self._lock:
            if table.location in self._queued:
                return
            self._queued.add(table.location)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="delta-state-warmer", daemon=True)
                self._thread.start()
        self._requests.put((spark, table))

    def wait(self) -> None:
        """Block until every requested warm-up has run (tests, and a caller about to measure)."""
        self._requests.join()

    def _run(self) -> None:
        while True:
            spark, table = self._requests.get()
            with self._lock:
                self._queued.discard(table.location)
            try:
                compute_state(spark, table)
            except Exception as exc:  # the next write computes the state itself; nothing is lost
                logger.debug("state of %s not computed ahead of the next write: %s", table.location, exc)
            finally:
                self._requests.task_done()


def compute_state(spark: SparkSession, table: TableConfig) -> None:
    """Have Delta compute (and keep) the state of `table`'s newest snapshot."""
    from delta.tables import DeltaTable

    found = DeltaTable.forPath(spark, table.path) if table.path is not None else DeltaTable.forName(spark, table.table_name)
    found.detail().collect()
