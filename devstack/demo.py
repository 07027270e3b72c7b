"""The one-command demo (`./demo.sh`, i.e. `python -m devstack demo`).

Starts the embedded defaults (etcd + our broker on local storage, `devstack.broker_stack`),
registers the `orders` JSON schema through the broker's schema registry and publishes a sample
order stream stamped with it, both with the official `danube-client` (every 10th order is
broken in some way), runs
`conf/pipelines/orders.yaml` once (availableNow) and shows what landed: the Delta table's row
count and a few rows, the quarantine by reason, and the subscription cursor in etcd. Then the
speed layer takes over (`devstack.speedlayer_stack`: one master, one worker and one gateway, each a
process): the Delta table is admitted, and two queries go through the gateway, their rows and
latency printed. Then it stops everything it started. This module is a command: its output is the point, so it
writes to stdout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

from danube_core.keys import cursor_key
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.records import parse_cursor
from devstack import REPO_ROOT
from devstack.broker_stack import EmbeddedStack
from pipelines.config import load_config

logger = logging.getLogger(__name__)

TOPIC = "/default/orders"
SUBJECT = "orders"
PIPELINE_FILE = REPO_ROOT / "conf" / "pipelines" / "orders.yaml"
CONSOLE_PORT = 0  # a free port: the URL is printed
ORDER_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "customer": {"type": "string"},
        "amount": {"type": "number"},
        "currency": {"type": "string"},
        "items": {"type": "integer"},
    },
    "required": ["order_id", "amount"],
}
_BROKEN = (
    lambda o: b"this is not json",                                   # decode failure
    lambda o: json.dumps({**o, "amount": -5.0}).encode(),            # amount below 0
    lambda o: json.dumps({**o, "currency": "XXX"}).encode(),         # currency not in set
    lambda o: json.dumps({k: v for k, v in o.items() if k != "order_id"}).encode(),  # no id
)


def sample_orders(count: int, seed: int = 7, invalid_every: int = 10) -> list[tuple[bytes, bool]]:
    """`count` order payloads and whether each is valid; every `invalid_every`-th is broken."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        order = {"order_id": f"o-{i:06d}", "customer": f"c-{rng.randrange(100):03d}",
                 "amount": round(rng.uniform(1, 500), 2), "currency": rng.choice(["EUR", "USD", "GBP"]),
                 "items": rng.randrange(1, 6)}
        if invalid_every and i % invalid_every == invalid_every - 1:
            out.append((_BROKEN[(i // invalid_every) % len(_BROKEN)](order), False))
        else:
            out.append((json.dumps(order).encode(), True))
    return out


async def register_json_schema(service_url: str, subject: str, schema: dict) -> tuple[int, int]:
    """Register `schema` under `subject` through the broker's SchemaRegistry service; (id, version)."""
    from danube import DanubeClientBuilder, SchemaType

    client = await DanubeClientBuilder().service_url(service_url).build()
    registry = client.schema()
    await (registry.register_schema(subject).with_type(SchemaType.JSON_SCHEMA)
           .with_schema_data(json.dumps(schema).encode()).with_description("demo orders").execute())
    latest = await registry.get_latest_schema(subject)
    return latest.schema_id, latest.version


async def produce(service_url: str, topic: str, payloads: list[bytes], *, partitions: int = 0,
                  producer_name: str = "demo-producer", concurrency: int = 32,
                  schema_subject: str | None = None) -> None:
    """Publish `payloads` to a reliable topic with the official danube-client.

    With `schema_subject` the producer stamps each message with the subject's latest schema id
    and version, as Danube producers built `with_schema_subject` do.
    """
    from danube import DanubeClientBuilder, DispatchStrategy

    client = await DanubeClientBuilder().service_url(service_url).build()
    builder = client.new_producer().with_topic(topic).with_name(producer_name)
    builder = builder.with_dispatch_strategy(DispatchStrategy.RELIABLE)
    if partitions:
        builder = builder.with_partitions(partitions)
    if schema_subject:
        builder = builder.with_schema_subject(schema_subject)
    producer = builder.build()
    await producer.create()
    try:
        for start in range(0, len(payloads), concurrency):
            await asyncio.gather(*(producer.send(p, {"source": "demo"}) for p in payloads[start:start + concurrency]))
    finally:
        await producer.close()


def run_demo(data_dir: str | None = None, messages: int = 200, console: bool = True) -> int:
    """Run the whole demo; returns the process exit code. `console`: at the end, serve the
    console on the demo's stack until Ctrl-C (off under CI, where the demo stops at once)."""
    owned = data_dir is None
    root = Path(data_dir or tempfile.mkdtemp(prefix="danube-demo-")).resolve()
    say(f"== danube-spark demo (data in {root})")
    stack = EmbeddedStack(root).start()
    try:
        say(f"etcd {stack.etcd_endpoint}, broker {stack.service_url}")
        schema_id, version = asyncio.run(register_json_schema(stack.service_url, SUBJECT, ORDER_SCHEMA))
        say(f"registered JSON schema {SUBJECT!r} with danube-client (id {schema_id}, version {version})")
        orders = sample_orders(messages)
        asyncio.run(produce(stack.service_url, TOPIC, [p for p, _ in orders], schema_subject=SUBJECT))
        valid = sum(ok for _, ok in orders)
        say(f"published {len(orders)} orders to {TOPIC} with danube-client ({len(orders) - valid} broken on purpose)")
        _run_pipeline(stack, root, console and not os.environ.get("CI"))
    finally:
        stack.stop()
        if owned:
            shutil.rmtree(root, ignore_errors=True)
    say("== done: everything the demo started is stopped")
    return 0


def _run_pipeline(stack: EmbeddedStack, root: Path, console: bool) -> None:
    from pipelines.runner import PipelineRunner

    env = {"DANUBE_ETCD_ENDPOINTS": stack.etcd_endpoint, "DANUBE_STORAGE_URL": stack.storage_url,
           "DANUBE_DELTA_ROOT": str(root / "delta")}
    config = load_config(PIPELINE_FILE, env=env)
    runner = PipelineRunner(config)
    try:
        say(f"running pipeline {config.name} ({PIPELINE_FILE.relative_to(REPO_ROOT)}, availableNow) ...")
        metrics = runner.run()
        say(f"pipeline finished: {metrics.totals()}")
        _show_results(runner, config)
        assert config.target.path is not None, f"{PIPELINE_FILE} writes its target by path"
        _query_speed_layer(stack, root, config.target.path, env if console else None)
    finally:
        runner.stop()
        runner.spark.stop()


def _show_results(runner, config) -> None:
    from pyspark.sql import functions as F

    spark = runner.spark
    target = spark.read.format("delta").load(config.target.path)
    say(f"\nDelta table {config.target.path}: {target.count()} rows")
    columns = ("_offset", "order_id", "customer", "amount", "currency", "items")
    say(_table(target.orderBy("_offset").select(*columns).limit(5)))
    quarantine = spark.read.format("delta").load(config.quarantine.path)
    say(f"quarantine {config.quarantine.path}: {quarantine.count()} rows")
    reason = F.coalesce(F.col("_decode_error"), F.concat_ws(" & ", "_failed_expectations"))
    reasons = quarantine.select(reason.alias("reason"))
    say(_table(reasons.groupBy("reason").count().orderBy("reason")))
    with EtcdMetadataStore(config.source.etcd_endpoints) as metadata:
        key = cursor_key(TOPIC, config.source.subscription)
        raw = metadata.get(key)
        say(f"etcd cursor {key} = {parse_cursor(raw, key) if raw is not None else 'none'}")


SPEED_LAYER_QUERIES = (
    "SELECT currency, count(*) AS orders, round(sum(amount), 2) AS amount FROM orders "
    "GROUP BY currency ORDER BY currency",
    "SELECT order_id, customer, amount, currency FROM orders WHERE order_id = 'o-000042'",
)


def _query_speed_layer(stack: EmbeddedStack, root: Path, table_path: str,
                       console_env: dict[str, str] | None) -> None:
    import statistics
    import time

    from devstack.speedlayer_stack import EmbeddedSpeedLayer
    from speedlayer.clients import QueryClient
    from speedlayer.clients.query_cli import render_rows

    say("\n== speed layer: one master, one worker, one gateway (processes)")
    layer = EmbeddedSpeedLayer(root / "speedlayer", stack.etcd_endpoint)
    try:
        layer.start(workers=1)
        epoch = layer.admit("orders", table_path)
        say(f"admitted {table_path} as dataset 'orders' of tenant 'demo': epoch {epoch} READY in worker memory")
        layer.wait_queryable("orders")
        with QueryClient(layer.gateway, "demo") as client:
            for sql in SPEED_LAYER_QUERIES:
                started = time.perf_counter()
                table = client.query("orders", sql)
                first_ms = (time.perf_counter() - started) * 1000
                warm = []
                for _ in range(20):
                    started = time.perf_counter()
                    client.query("orders", sql)
                    warm.append((time.perf_counter() - started) * 1000)
                say(f"\ngateway {layer.gateway}> {sql}")
                say(render_rows(table.column_names, table.to_pylist()))
                say(f"{table.num_rows} row(s) in {first_ms:.1f} ms (then p50 {statistics.median(warm):.1f} ms "
                    f"over {len(warm)} runs)")
        if console_env is not None:
            _serve_console(stack, layer, console_env)
    finally:
        layer.stop()
        say("speed layer stopped")


def _serve_console(stack: EmbeddedStack, layer, pipeline_env: dict[str, str]) -> None:
    """The console on the demo's stack until Ctrl-C: its URL printed, everything still running."""
    import time

    from console.config import ConsoleConfig, SpeedLayerSection
    from console.server import ConsoleServer
    from danube_core.etcd_settings import EtcdSettings

    server = ConsoleServer(ConsoleConfig(
        port=CONSOLE_PORT, etcd=EtcdSettings(stack.etcd_endpoint), storage_url=stack.storage_url,
        pipelines=(str(PIPELINE_FILE),), pipeline_env=pipeline_env, history_interval_s=2.0,
        speedlayer=SpeedLayerSection("/speedlayer", (layer.master,)))).start()
    say(f"\n== the console: {server.url}  (Ctrl-C stops it and the demo; --no-console stops at once)")
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        say("")
    finally:
        server.stop()


def _table(df) -> str:
    rows = df.collect()
    columns = df.columns
    cells = [[str(r[c]) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths))  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths]), *map(line, cells)])


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
