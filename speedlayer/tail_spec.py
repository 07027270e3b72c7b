"""What a dataset's tail follows, as the master hands it to the workers in an epoch's LoadPlan.

A dataset admitted from a pipeline's Delta table with a tail (`TailOptions`) serves, beside its
epoch E, the topic's messages that E does not hold yet. The boundary between the two is an
offset, not a time: every commit the pipeline makes records in its `userMetadata` the offset
ranges per topic partition it holds, so E holds exactly `[.., offsets[p])` of each partition p
and the tail answers only offsets at or above them. The master works `offsets` out for each
epoch (`speedlayer.sources.delta_offsets`) and the worker serving E answers E + the tail rows
at or above them, pinned together for one statement.

The pipeline's file travels as text so that the workers decode and check rows with the very
settings the pipeline runs with (its `source`, `decode` and `expectations` sections) without
sharing a disk with the master.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Mapping

DEFAULT_LIMIT_ROWS = 1_000_000


@dataclass(frozen=True)
class TailSpec:
    """One epoch's tail: the pipeline to follow, the offsets (end-exclusive, per topic partition,
    by broker name `/ns/topic-part-N`) the epoch's table version holds, and the worker's limits."""

    pipeline_config: str
    limit_rows: int = DEFAULT_LIMIT_ROWS
    limit_bytes: int = 0  # 0: no byte limit
    offsets: Mapping[str, int] = field(default_factory=dict)

    def at(self, offsets: Mapping[str, int]) -> "TailSpec":
        """The same tail for an epoch holding `offsets`."""
        return replace(self, offsets=dict(sorted(offsets.items())))

    @property
    def follows(self) -> tuple[str, int, int]:
        """What identifies the follower a worker runs for it: the same pipeline and limits are
        one follower across epochs (only the offsets differ)."""
        return (self.pipeline_config, self.limit_rows, self.limit_bytes)

    def to_json(self) -> str:
        return json.dumps({"pipeline_config": self.pipeline_config, "limit_rows": self.limit_rows,
                           "limit_bytes": self.limit_bytes, "offsets": dict(sorted(self.offsets.items()))},
                          separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TailSpec":
        """Parse a spec; ValueError naming the field that is wrong."""
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"tail spec is not JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise ValueError("tail spec: expected a JSON object")
        config = value.get("pipeline_config")
        if not isinstance(config, str) or not config.strip():
            raise ValueError("tail spec: pipeline_config is required (the pipeline's YAML text)")
        offsets = value.get("offsets") or {}
        if not isinstance(offsets, dict) or not all(isinstance(v, int) and v >= 0 for v in offsets.values()):
            raise ValueError(f"tail spec: offsets must map topic partitions to offsets >= 0, got {offsets!r}")
        limit_rows, limit_bytes = value.get("limit_rows", DEFAULT_LIMIT_ROWS), value.get("limit_bytes", 0)
        if not isinstance(limit_rows, int) or limit_rows <= 0:
            raise ValueError(f"tail spec: limit_rows must be a positive integer, got {limit_rows!r}")
        if not isinstance(limit_bytes, int) or limit_bytes < 0:
            raise ValueError(f"tail spec: limit_bytes must be 0 (none) or positive, got {limit_bytes!r}")
        return cls(config, limit_rows, limit_bytes, {str(k): int(v) for k, v in offsets.items()})
