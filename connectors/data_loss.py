"""The one place where the connector reports data loss and obeys `failOnDataLoss`.

Data loss is detected in two places: the driver while planning (a gap in the descriptor chain,
offsets that go backwards, a WAL that does not reach back to the last object) and the
executors while reading (a CRC error, a missing object, an offset missing from a byte range).
Both call `report`, as Spark's Kafka source funnels every case through `reportDataLoss`: with
`fail_on_data_loss` the query fails with a `DataLossError` naming the topic, the offset range
and the object; without it a warning is logged and the lost range is returned, so the caller
can count what was skipped instead of skipping it silently.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from danube_core.errors import DataLossError

logger = logging.getLogger(__name__)

_ADVICE_FAIL = (
    "Set failOnDataLoss=false to skip the lost offsets and continue (they are logged and counted)."
)
_ADVICE_SKIP = "Skipping them because failOnDataLoss=false."


@dataclass(frozen=True)
class LostRange:
    """Offsets `[start_offset, end_offset)` of `topic` (end-exclusive) that will not be read.

    `source` names where they should have come from (object id, file URL or "wal") when known;
    `reason` says how the loss was detected.
    """

    topic: str
    start_offset: int
    end_offset: int
    reason: str
    source: str | None = None

    @property
    def count(self) -> int:
        """Number of offsets lost (0 for an empty or inverted range)."""
        return max(0, self.end_offset - self.start_offset)

    def describe(self) -> str:
        where = f" in {self.source}" if self.source else ""
        return (
            f"data loss in topic {self.topic}: offsets [{self.start_offset}, {self.end_offset}) "
            f"({self.count} offsets){where}: {self.reason}"
        )


def report(
    topic: str,
    start_offset: int,
    end_offset: int,
    reason: str,
    *,
    fail_on_data_loss: bool,
    source: str | None = None,
    cause: BaseException | None = None,
) -> LostRange:
    """Raise `DataLossError` (chained from `cause`) or warn and return the lost range.

    `end_offset` is exclusive. Callers continue past the range only when this returns.
    """
    lost = LostRange(topic, start_offset, end_offset, reason, source)
    if fail_on_data_loss:
        raise DataLossError(f"{lost.describe()}. {_ADVICE_FAIL}") from cause
    logger.warning("%s. %s", lost.describe(), _ADVICE_SKIP)
    return lost


def total_lost(ranges: list[LostRange]) -> dict[str, int]:
    """Lost offsets per topic, for progress metrics and logs."""
    totals: dict[str, int] = {}
    for lost in ranges:
        totals[lost.topic] = totals.get(lost.topic, 0) + lost.count
    return totals
