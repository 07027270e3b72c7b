"""Why a pipeline's recent payloads did not decode, from its quarantine table: the rows of the
batches a pipeline page shows, counted by their `_decode_error`.

A batch's commit records its decode failures as one reason, `decode` (`pipelines.batch_summary`
counts them without a group-by over the batch); the error of each row is only in the
quarantine table (`pipelines.delta_sink.quarantine_rows`: `_pipeline`, `_batch_id`,
`_decode_error`). This is read only when the batches shown recorded decode failures: three
columns of the files whose `_batch_id` statistics may hold those batches, through delta-rs
and a pyarrow dataset filter, no Spark.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

DECODE_REASON = "decode"  # the reason a commit records for payloads that did not decode
DECODE_ERROR = "_decode_error"


@dataclass(frozen=True)
class DecodeErrors:
    """Rows by decode error (most first); `problem`: why the quarantine table could not be read."""

    by_error: dict[str, int] = field(default_factory=dict)
    problem: str | None = None


def decode_errors(location: str | None, pipeline: str, batch_ids: list[int],
                  storage_options: Mapping[str, str] | None = None) -> DecodeErrors:
    """The quarantined rows of `pipeline`'s `batch_ids` that did not decode, by their error."""
    if location is None:
        return DecodeErrors(problem="the quarantine is a metastore table: its rows are read through Spark only")
    try:
        import pyarrow.compute as pc
        from deltalake import DeltaTable

        table = DeltaTable(location, storage_options=dict(storage_options or {}) or None)
        rows = table.to_pyarrow_dataset().to_table(
            columns=[DECODE_ERROR],
            filter=(pc.field("_pipeline") == pipeline) & pc.field("_batch_id").isin(batch_ids)
            & pc.field(DECODE_ERROR).is_valid())
    except Exception as exc:  # noqa: BLE001 (delta-rs and pyarrow raise their own and OSError types)
        return DecodeErrors(problem=f"quarantine table {location} unreadable: {str(exc).splitlines()[0][:300]}")
    counts = rows.group_by(DECODE_ERROR).aggregate([(DECODE_ERROR, "count")]).to_pylist()
    found = {str(r[DECODE_ERROR]): int(r[f"{DECODE_ERROR}_count"]) for r in counts}
    return DecodeErrors(dict(sorted(found.items(), key=lambda item: (-item[1], item[0]))))


def with_decode_errors(reasons: Mapping[str, int], errors: DecodeErrors) -> dict[str, int]:
    """`reasons` with the one `decode` entry split by decode error (`decode: <error>`); the rows
    the quarantine table does not explain (written by another run, or unreadable) stay `decode`."""
    total = reasons.get(DECODE_REASON, 0)
    if not total or not errors.by_error:
        return dict(reasons)
    split = {f"{DECODE_REASON}: {error}": count for error, count in errors.by_error.items()}
    rest = total - sum(split.values())
    out = {k: v for k, v in reasons.items() if k != DECODE_REASON}
    out.update(split)
    if rest > 0:
        out[DECODE_REASON] = rest
    return dict(sorted(out.items(), key=lambda item: (-item[1], item[0])))
