"""`ReadTask`: everything one executor needs to read one byte range of one file.

Planning on the driver turns descriptors and WAL segments into these; Spark pickles them into
the input partitions. Executors never talk to etcd (style: the partition carries the object
URL, byte range and offset range), so every field is plain JSON-able data and the class
imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

WAL_SOURCE = "wal"


@dataclass(frozen=True)
class ReadTask:
    """Read offsets `[start_offset, end_offset)` (end-exclusive) of `topic` from `url`.

    * `topic`: broker topic name, e.g. `/ns/orders-part-2`.
    * `source`: lineage shown to users: the object id (`data-0-1700000030.dnb1`) or `"wal"`.
    * `url` + `storage_options`: the fsspec location of the object or WAL file.
    * `byte_start`: a frame boundary at or before the frame of `start_offset`.
    * `byte_end`: exclusive; None reads to the end of the object (objects) or to the end of
      the safe prefix (WAL files). Reading also stops once `end_offset - 1` has been read.
    * `strict`: True for sealed objects (a CRC error is corruption, spec §1.4); False for
      WAL files, whose torn tail is normal while the broker appends.
    * `fail_on_data_loss`: how the executor treats missing offsets and corrupt frames.
    * `size_hint`: the bytes the planner expects the task to read (for packing tasks into
      Spark partitions; exact at index entries and WAL frames, never used for reading).
    """

    topic: str
    source: str
    url: str
    storage_options: dict
    byte_start: int
    byte_end: int | None
    start_offset: int
    end_offset: int
    strict: bool
    fail_on_data_loss: bool
    size_hint: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.start_offset <= self.end_offset:
            raise ValueError(
                f"ReadTask for {self.topic} ({self.url}): offsets [{self.start_offset}, "
                f"{self.end_offset}) must satisfy 0 <= start <= end"
            )
        if self.byte_start < 0 or (self.byte_end is not None and self.byte_end < self.byte_start):
            raise ValueError(
                f"ReadTask for {self.topic} ({self.url}): byte range [{self.byte_start}, "
                f"{self.byte_end}) must satisfy 0 <= start <= end"
            )

    @property
    def is_wal(self) -> bool:
        return self.source == WAL_SOURCE

    @property
    def message_count(self) -> int:
        return self.end_offset - self.start_offset

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (for logs and for data sources that serialise partitions)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> "ReadTask":
        return cls(**value)
