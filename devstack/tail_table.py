"""A pipeline's Delta table and topic made without Spark, for tests and benchmarks of a dataset's
topic tail: JSON orders published with danube-client, then the first of them read and split by
the pipeline's own tail feed (`pipelines.tail_feed.TailFeed`, the rows the pipeline would write)
and committed with deltalake, the commit's `userMetadata` naming the offsets it holds as the
pipeline's commits do (`speedlayer.sources.delta_offsets`).

No pipeline runs, so no newer epoch takes the tail's rows over unless the caller commits one
(`commit_epoch` again, with a greater `head`).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

CURRENCIES = ("EUR", "USD", "GBP")


def order(i: int) -> bytes:
    """Order `i` as JSON (the demo's order schema, `devstack.demo.ORDER_SCHEMA`)."""
    return json.dumps({"order_id": f"o{i}", "customer": f"c{i % 5000}", "amount": float(i % 997),
                       "currency": CURRENCIES[i % 3], "items": i % 7}).encode()


async def produce_orders(url: str, topic: str, first: int, count: int, *, in_flight: int = 256,
                         name: str = "tail-table") -> int:
    """Orders first..first+count-1 to `topic`, acknowledged (one producer, reliable dispatch, so
    on a topic it alone writes order i gets offset i); returns `count`."""
    from danube import DanubeClientBuilder, DispatchStrategy

    client = await DanubeClientBuilder().service_url(url).build()
    producer = (client.new_producer().with_topic(topic).with_name(f"{name}-{first}")
                .with_dispatch_strategy(DispatchStrategy.RELIABLE).build())
    await producer.create()
    slots = asyncio.Semaphore(in_flight)

    async def send(i: int) -> None:
        try:
            await producer.send(order(i))
        finally:
            slots.release()

    tasks = []
    for i in range(first, first + count):
        await slots.acquire()
        tasks.append(asyncio.create_task(send(i)))
    await asyncio.gather(*tasks)
    await producer.close()
    return count


def pipeline_file(etcd_endpoint: str, storage_url: str, root: Path, name: str, topic: str) -> dict[str, Any]:
    """A pipeline reading `topic` as JSON of subject `name` into `root/name/target`."""
    return {
        "name": name,
        "source": {"etcd_endpoints": etcd_endpoint, "storage_url": storage_url, "topics": [topic],
                   "subscription": name, "starting_offsets": "earliest"},
        "decode": {"format": "json", "subject": name},
        "target": {"path": str(root / name / "target")},
        "quarantine": {"path": str(root / name / "quarantine")},
        "checkpoint": str(root / name / "checkpoint"),
    }


def commit_epoch(data: dict[str, Any], head: int, rows: int | None = None) -> str:
    """Commit the topic's offsets [0, head) to the pipeline's table as the tail splits them (with
    `rows`, repeated to that many rows with unique `order_id`s and offsets: a bigger epoch for the
    same topic); returns the topic partition's name."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import CommitProperties, DeltaTable, write_deltalake

    from pipelines.config import parse_config
    from pipelines.tail_feed import TailFeed

    target = data["target"]["path"]
    feed = TailFeed(parse_config(data, "<devstack.tail_table>"))
    try:
        (partition,) = feed.topics()
        held = 0
        if (Path(target) / "_delta_log").exists():
            held = DeltaTable(target).to_pyarrow_table(columns=["_offset"]).num_rows
        table = feed.read({partition: held}, {partition: head}).rows
    finally:
        feed.close()
    if rows is not None:
        table = pa.concat_tables([table] * (rows // max(table.num_rows, 1) + 1)).slice(0, rows)
        index = pa.array(range(rows), pa.int64())
        table = table.set_column(table.schema.get_field_index("order_id"), "order_id",
                                 pc.binary_join_element_wise("e", pc.cast(index, pa.string()), ""))
        table = table.set_column(table.schema.get_field_index("_offset"), "_offset", index)
    meta = json.dumps({"pipeline": data["name"], "offsets": {partition: {"start": held, "end": head}}})
    write_deltalake(target, table, mode="append",
                    commit_properties=CommitProperties(custom_metadata={"userMetadata": meta}))
    return partition
