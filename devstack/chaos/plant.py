"""The soak's negative control: a defect planted on purpose, which the checker must catch
(so a passing soak is shown able to fail).

* `duplicate`: one row of pipeline B's target appended again as a new Delta commit, what a
  replay does when the sink's duplicate guard (Delta's txnAppId/txnVersion) is skipped;
* `lose`: one acknowledged message deleted from pipeline B's target, what a sink that drops
  a row does.

Both are written with delta-rs beside the running pipeline (Delta's optimistic concurrency
lets both writers commit), in the middle of the fault window, so the speed layer serves the
planted version too.
"""

from __future__ import annotations

import json
from pathlib import Path

PLANTS = ("duplicate", "lose")


def plant(kind: str, table: Path) -> dict:
    """Plant `kind` in the Delta table at `table`; what was planted (id, topic, offset)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable, write_deltalake

    newest = _newest_data_file(table)
    rows = pq.read_table(table / newest)
    first = rows.slice(0, 1)
    row = first.to_pylist()[0]
    planted = {"kind": kind, "table": str(table), "n": row.get("n"), "topic": row.get("_topic"),
               "offset": row.get("_offset")}
    if kind == "duplicate":
        # as the table declares it (Spark writes timestamps as INT96, which pyarrow reads as ns)
        schema = pa.schema(DeltaTable(str(table)).schema().to_arrow())
        write_deltalake(str(table), first.select(schema.names).cast(schema), mode="append")
    elif kind == "lose":
        DeltaTable(str(table)).delete(f"n = {int(row['n'])}")
    else:
        raise ValueError(f"--plant {kind!r}: expected one of {', '.join(PLANTS)}")
    return planted


def _newest_data_file(table: Path) -> str:
    """The path of the last file added by the table's newest commit that added one with rows."""
    from urllib.parse import unquote

    log = Path(table) / "_delta_log"
    for path in sorted(log.glob("*.json"), key=lambda p: int(p.stem), reverse=True):
        actions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        adds = [a["add"] for a in actions if "add" in a]
        adds = [a for a in adds if json.loads(a.get("stats") or "{}").get("numRecords", 1) > 0]
        if adds:
            return unquote(adds[-1]["path"])
    raise RuntimeError(f"no data file in {table} to plant a defect in")
