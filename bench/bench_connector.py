"""The `danube` Spark source against Spark's own Parquet reader and the Python data source ceiling.

Why one module of ~550 lines: a benchmark is read as one script, from the data it writes to
the table it prints; what all benchmarks share is `bench/common.py`.

One run, the same rows (`--messages` messages with 100-byte payloads in one sealed topic, as
`.dnb1` objects of 250,000 messages on local files, descriptors in a real etcd):

1. Spark's Parquet -> Delta (the rows were written to Parquet first, untimed);
2. a trivial Python data source that passes the same Arrow batches through from memory-mapped
   IPC files (`bench/passthrough_source.py`): the ceiling of the Python data source API;
3. topic -> Delta through `spark.read.format("danube")`.

Each is timed after a warm-up on one object, best of `--repeat` (interleaved), on a local[2]
SparkSession with Delta, as rows/s and as a ratio to (1); the goal is (3) >= 0.6x (1). CPU
seconds of the whole process tree (JVM, Python workers, etcd) are reported next to wall time:
on a shared machine they vary far less. Also measured, outside Spark:
* read() per CPU second: every planned task read in this process, `read_task` alone and with
  the conversion to Spark's schema, and a cProfile split of where the time goes;
* planning time (`latestOffset` + `partitions` of a stream) for topics with 10,000 and
  100,000 descriptors in etcd, near the head and for the whole backlog (goal <= 200 ms, flat);
* peak memory (VmHWM above the RSS after imports) of one task reading a
  `--big-object-mb` object in a fresh process (goal <= 128 MB).

    python bench/bench_connector.py [--messages 2000000] [--big-object-mb 512] [--repeat 2]

Prints tables and writes bench/results/connector.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR.parent), str(BENCH_DIR)]

from common import (  # noqa: E402
    Column, Timing, drain_timed, local_delta_builder, machine_info, print_table, profile_top, run_in_workdir,
    timed, tree_cpu_s,
    write_results,
)
from broker.uploader import INDEX_EVERY_FRAMES  # noqa: E402
from danube_core import keys  # noqa: E402
from danube_core.errors import DanubeError  # noqa: E402
from danube_core.bincode import encode_varint  # noqa: E402
from danube_core.frames import FRAME_HEADER_SIZE, encode_frame  # noqa: E402
from danube_core.message import MessageID, StreamMessage, encode_message  # noqa: E402
from danube_core.objectstore import ObjectStore, object_id_for  # noqa: E402
from danube_core.records import (  # noqa: E402
    NULL_JSON, RELIABLE, CurPointer, ObjectDescriptor, Policies, SealedState, dump_delivery,
)
from danube_core.topics import TopicName  # noqa: E402

PAYLOAD_BYTES = 100
OBJECT_MESSAGES = 250_000
GENERATE_CHUNK = 500_000  # even, so patched chunks start at even offsets
PATCH_FROM = 1 << 16  # from here offsets and request ids are 5-byte varints
TEMPLATE_OFFSET = 0x10203040  # even; its field encodings occur once in a frame
HISTORY_OBJECT_OFFSETS = 1000  # messages per descriptor of the planning topics
NEAR_HEAD_MESSAGES = 2500  # a stream this far behind the head spans the last 3 descriptors
TXN_OPS = 128  # etcd's default --max-txn-ops
BROKER_ID = 0x5EED
PRODUCER_ID = 0xF123456789ABCDEF
BASE_PUBLISH_MS = 1_700_000_000_000
MAIN_TOPIC, BIG_TOPIC = "/bench/orders", "/bench/big"
ATTRIBUTES = ({"content-type": "application/json"}, {"key": "k1", "region": "eu-west-1"})
BROKER_ADDR = "http://127.0.0.1:6650/"
PAYLOAD_POOL_BYTES = 1 << 24
GOAL_RATIO, GOAL_PLAN_MS, GOAL_MEMORY_MB = 0.6, 200.0, 128.0
CASES = ("parquet -> delta", "passthrough source -> delta", "danube source -> delta")

# ---- data: frames, objects, etcd keys -----------------------------------------------------


@lru_cache(maxsize=1)
def _payload_windows() -> np.ndarray:
    """Every PAYLOAD_BYTES window of a random pool: payload i is window (i * 101) mod len, so
    payloads differ message by message (no Parquet dictionary makes the baseline cheaper)."""
    pool = np.random.default_rng(7).integers(0, 256, PAYLOAD_POOL_BYTES, dtype=np.uint8)
    return np.lib.stride_tricks.sliding_window_view(pool, PAYLOAD_BYTES)


def payloads(offsets: np.ndarray) -> np.ndarray:
    """The payloads of these offsets, one row each."""
    windows = _payload_windows()
    return windows[(offsets * (PAYLOAD_BYTES + 1)) % len(windows)]


def message_at(offset: int) -> StreamMessage:
    """The benchmark's message at `offset`; request id, publish time and payload follow it."""
    payload = payloads(np.array([offset], np.int64))[0].tobytes()
    return StreamMessage(offset + 1, MessageID(PRODUCER_ID, MAIN_TOPIC, BROKER_ADDR, offset), payload,
                         BASE_PUBLISH_MS + offset, "producer-1", "", ATTRIBUTES[offset & 1])


def encode_frames(first: int, count: int) -> tuple[bytes, np.ndarray]:
    """Frames for offsets first..first+count-1 through the codec, and each frame's size."""
    frames = [encode_frame(o, encode_message(message_at(o))) for o in range(first, first + count)]
    return b"".join(frames), np.fromiter(map(len, frames), np.int64, count)


def _template(offset: int) -> tuple[np.ndarray, dict[str, int]]:
    """One frame from the codec, and where its per-message fields sit in it (each exactly once)."""
    frame = encode_frame(offset, encode_message(message_at(offset)))
    fields = {"offset": encode_varint(offset), "request_id": encode_varint(offset + 1),
              "publish_time": encode_varint(BASE_PUBLISH_MS + offset), "payload": payloads(np.array([offset], np.int64))[0].tobytes()}
    where = {name: frame.find(value, FRAME_HEADER_SIZE) for name, value in fields.items()}
    if any(at < 0 or frame.find(fields[name], at + 1) >= 0 for name, at in where.items()):
        raise RuntimeError(f"template frame {offset}: a field is missing or not unique ({where})")
    return np.frombuffer(frame, np.uint8), where


def _patched(offsets: np.ndarray, template: np.ndarray, where: dict[str, int]) -> np.ndarray:
    """Rows of `template` with each offset's fields written in (varint widths stay fixed)."""
    rows = np.tile(template, (len(offsets), 1))

    def put(at: int, values: np.ndarray) -> None:
        rows[:, at:at + values.itemsize] = values.view(np.uint8).reshape(len(values), values.itemsize)

    put(0, offsets.astype("<u8"))  # header offset; the length is the template's
    put(where["offset"] + 1, offsets.astype("<u4"))  # after the varint's 5-byte marker
    put(where["request_id"] + 1, (offsets + 1).astype("<u4"))
    put(where["publish_time"] + 1, (offsets + BASE_PUBLISH_MS).astype("<u8"))
    rows[:, where["payload"]:where["payload"] + PAYLOAD_BYTES] = payloads(offsets)
    crcs = np.fromiter((zlib.crc32(row) for row in rows[:, FRAME_HEADER_SIZE:]), np.uint32, len(offsets))
    put(12, crcs.astype("<u4"))
    return rows


def patched_frames(first: int, count: int) -> tuple[bytes, np.ndarray]:
    """The frames `encode_frames` gives, ~20x faster: two codec templates (even and odd offsets
    carry different attributes) patched with numpy. From PATCH_FROM on, offsets and request
    ids are 5-byte varints and publish times 9-byte ones, so every frame keeps its template's
    layout; `build_frames` checks a sample against the codec."""
    if first % 2 or first < PATCH_FROM or first + count >= 2**32 - 1:
        raise ValueError(f"patched frames {first}+{count}: expected an even first offset in [{PATCH_FROM}, 2^32)")
    n = count + count % 2
    pairs = [_patched(np.arange(first + p, first + n, 2, dtype=np.int64), *_template(TEMPLATE_OFFSET + p))
             for p in (0, 1)]
    sizes = np.tile([pairs[0].shape[1], pairs[1].shape[1]], n // 2)[:count]
    return np.concatenate(pairs, axis=1).tobytes()[: int(sizes.sum())], sizes


def build_frames(total: int) -> tuple[bytes, np.ndarray]:
    """`total` frames from offset 0 and the `total + 1` frame positions."""
    parts = [encode_frames(0, min(total, PATCH_FROM))]
    parts += [patched_frames(s, min(GENERATE_CHUNK, total - s)) for s in range(PATCH_FROM, total, GENERATE_CHUNK)]
    positions = np.zeros(total + 1, np.int64)
    np.cumsum(np.concatenate([sizes for _, sizes in parts]), out=positions[1:])
    data = b"".join(frames for frames, _ in parts)
    for o in {0, PATCH_FROM, PATCH_FROM + 1, total // 2, total - 1} & set(range(total)):
        if data[positions[o]:positions[o + 1]] != encode_frames(o, 1)[0]:
            raise RuntimeError(f"generated frame {o} differs from the codec's")
    return data, positions


def put_all(endpoint: str, items: Iterable[tuple[str, bytes]]) -> None:
    """Put keys in transactions of TXN_OPS puts: one round trip per put (~1 ms through
    `MetadataStore.put`) would spend ~2 minutes on the 110,000 descriptors written here."""
    import pyetcd

    host, port = endpoint.rsplit(":", 1)
    client = pyetcd.client(host=host, port=int(port))
    try:
        batch: list[tuple[str, bytes]] = []
        for item in [*items, None]:
            if item is not None:
                batch.append(item)
            if batch and (item is None or len(batch) == TXN_OPS):
                client.transaction(compare=[], failure=[],
                                   success=[client.transactions.put(k, v) for k, v in batch])
                batch = []
    finally:
        client.close()


def topic_items(topic: TopicName, descriptors: list[ObjectDescriptor], last_offset: int) -> list[tuple[str, bytes]]:
    """The etcd keys of a sealed reliable topic with these descriptors (spec §5)."""
    storage = keys.StorageKeys()
    items = [(keys.namespace_policy_key(topic.namespace), Policies().to_json()),
             (keys.namespace_topic_key(topic), NULL_JSON),
             (keys.delivery_key(topic), dump_delivery(RELIABLE))]
    items += [(storage.object_key(topic, d.start_offset), d.to_json()) for d in descriptors]
    items.append((storage.cur_key(topic), CurPointer.for_offset(descriptors[-1].start_offset).to_json()))
    items.append((storage.state_key(topic), SealedState(BROKER_ID, last_offset, True, int(time.time())).to_json()))
    return items


def write_object(store: ObjectStore, topic: TopicName, data: bytes | memoryview, first: int,
                 frame_pos: np.ndarray, created: int) -> ObjectDescriptor:
    """Write frames `first..` (positions relative to `data`) as one object; its descriptor."""
    object_id = object_id_for(first, created)
    with store.open_writer(topic, object_id) as writer:
        writer.write(bytes(data))
    index = [(first + i, int(frame_pos[i])) for i in range(0, len(frame_pos), INDEX_EVERY_FRAMES)]
    return ObjectDescriptor(object_id, first, first + len(frame_pos) - 1, len(data), None, created,
                            True, index)


def write_main_topic(store: ObjectStore, endpoint: str, data: bytes, positions: np.ndarray, messages: int) -> int:
    """The benchmark topic: `messages` frames in objects of OBJECT_MESSAGES; returns #objects."""
    topic, view, created = TopicName.parse(MAIN_TOPIC), memoryview(data), int(time.time())
    descriptors = []
    for k, first in enumerate(range(0, messages, OBJECT_MESSAGES)):
        stop = min(messages, first + OBJECT_MESSAGES)
        rel = positions[first:stop] - positions[first]
        descriptors.append(write_object(store, topic, view[positions[first]:positions[stop]], first, rel, created + k))
    put_all(endpoint, topic_items(topic, descriptors, messages - 1))
    return len(descriptors)


def write_history_topic(store: ObjectStore, endpoint: str, count: int) -> tuple[str, int]:
    """A topic with `count` descriptors of HISTORY_OBJECT_OFFSETS messages; only the first and
    the last three objects exist (planning reads etcd; lag reads publish times from those)."""
    topic, created, step = TopicName.parse(f"/bench/history-{count}"), int(time.time()), HISTORY_OBJECT_OFFSETS
    real = {}
    for k in sorted({0, max(0, count - 3), max(0, count - 2), count - 1}):
        data, sizes = encode_frames(k * step, step)
        real[k] = write_object(store, topic, data, k * step, np.cumsum(sizes) - sizes, created + k)
    size = real[0].size
    descriptors = [real.get(k) or ObjectDescriptor(object_id_for(k * step, created + k), k * step, (k + 1) * step - 1,
                                                   size, None, created + k, True, [(k * step, 0)])
                   for k in range(count)]
    put_all(endpoint, topic_items(topic, descriptors, count * step - 1))
    return str(topic), count * step


# ---- read(), in process -------------------------------------------------------------------


def measure_read(options: dict, arrow_dir: Path, parquet_dir: Path) -> dict:
    """Plan the batch read, read every task in this process (read_task alone, then the whole
    read() with the conversion to Spark's schema) and write what read() returned as the
    passthrough source's IPC files and Spark's Parquet input."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from connectors.partitions import READ_COLUMNS, read_partition
    from connectors.source import DanubeDataSource
    from connectors.task_reader import read_task

    source = DanubeDataSource(options)
    with timed() as plan:
        partitions = source.reader(source.schema()).partitions()
    for _ in read_task(partitions[0].tasks[0], READ_COLUMNS):
        break  # first use imports the decoder and fsspec: not per-message cost
    decode = Timing()
    rows = sum(b.num_rows for p in partitions for t in p.tasks for b in drain_timed(read_task(t, READ_COLUMNS), decode))
    full = Timing()
    for i, p in enumerate(partitions):
        batches = drain_timed(read_partition(p, False), full)
        with pa.ipc.new_file(str(arrow_dir / f"part-{i:04d}.arrow"), batches[0].schema) as ipc:
            for batch in batches:
                ipc.write_batch(batch)
        pq.write_table(pa.Table.from_batches(batches), str(parquet_dir / f"part-{i:04d}.parquet"))
    profile = profile_top(lambda: [b for p in partitions[:2] for b in read_partition(p, False)])
    return {"tasks": len(partitions), "messages": rows, "plan_wall_s": round(plan.wall_s, 3),
            "read_task_cpu_s": round(decode.cpu_s, 3), "read_cpu_s": round(full.cpu_s, 3),
            "read_wall_s": round(full.wall_s, 3),
            "read_task_msgs_per_cpu_s": round(rows / decode.cpu_s), "read_msgs_per_cpu_s": round(rows / full.cpu_s),
            "profile_first_2_tasks": profile}


# ---- planning ------------------------------------------------------------------------------


def measure_planning(endpoint: str, storage_url: str, topic: str, head: int, repeat: int) -> dict:
    """ms of a stream's `latestOffset` + `partitions` near the head and for the whole backlog."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from connectors.offsets import SourceOffset
    from connectors.source import DanubeDataSource

    source = DanubeDataSource({"etcd.endpoints": endpoint, "storage.url": storage_url, "walRoot": "none",
                               "topic": topic, "subscription": f"bench-{uuid.uuid4().hex[:8]}"})
    reader = source.streamReader(source.schema())

    def plan(start_offset: int) -> tuple[float, int]:
        start = SourceOffset({topic: start_offset}).to_json_dict()
        began = time.perf_counter()
        end = reader.latestOffset(start, ReadAllAvailable())
        partitions = reader.partitions(start, end)
        return (time.perf_counter() - began) * 1000, len(partitions)

    result: dict = {"descriptors": head // HISTORY_OBJECT_OFFSETS}
    try:
        result["first_call_ms"] = round(plan(head - NEAR_HEAD_MESSAGES)[0], 1)  # + etcd connect, lock
        near = [plan(head - NEAR_HEAD_MESSAGES) for _ in range(repeat)]  # median: etcd round trips jitter
        result.update(near_head_ms=round(statistics.median(ms for ms, _ in near), 1),
                      near_head_max_ms=round(max(ms for ms, _ in near), 1), near_head_tasks=near[0][1])
        try:
            full_ms, tasks = plan(0)
            result.update(full_backlog_ms=round(full_ms, 1), full_backlog_tasks=tasks)
        except DanubeError as exc:  # reported, so the other measurements still come out
            result["full_backlog_error"] = f"{type(exc).__name__}: {exc}"
    finally:
        reader.stop()
    return result


# ---- memory --------------------------------------------------------------------------------


def _status_mb(field: str) -> float:
    """A memory figure of this process from /proc/self/status (VmRSS, VmHWM = peak RSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"/proc/self/status has no {field}")


def memory_probe(task_json: str) -> None:
    """Child process: read one task and print its peak RSS above the RSS after imports.

    The peak is VmHWM, reset to the current RSS once imports are done (clear_refs 5), not
    ru_maxrss: Linux carries the parent's peak across fork + exec into ru_maxrss.
    """
    import danube_core.arrow_decode  # noqa: F401  (imported lazily by read(); part of the baseline)
    import danube_core.objectstore  # noqa: F401
    from connectors.partitions import DanubePartition, read_partition
    from connectors.read_task import ReadTask
    from connectors.schema import arrow_schema

    arrow_schema(False)
    task = ReadTask.from_dict(json.loads(task_json))
    Path("/proc/self/clear_refs").write_text("5")
    baseline, rows = _status_mb("VmRSS"), 0
    with timed() as t:
        for batch in read_partition(DanubePartition(0, [task]), False):
            rows += batch.num_rows
    peak = _status_mb("VmHWM")
    print(json.dumps({"rows": rows, "baseline_mb": round(baseline, 1), "peak_mb": round(peak, 1),
                      "task_peak_mb": round(peak - baseline, 1), "read_wall_s": round(t.wall_s, 2),
                      "read_cpu_s": round(t.cpu_s, 2)}))


def measure_memory(store: ObjectStore, data: bytes, positions: np.ndarray, target_bytes: int) -> dict:
    """Write the first frames reaching `target_bytes` as one object; read it as one task in a
    fresh process."""
    from connectors.read_task import ReadTask

    frames = min(int(np.searchsorted(positions, target_bytes)), len(positions) - 1)
    desc = write_object(store, TopicName.parse(BIG_TOPIC), memoryview(data)[: positions[frames]], 0,
                        positions[:frames], int(time.time()))
    url = store.object_url(TopicName.parse(BIG_TOPIC), desc.object_id)
    task = ReadTask(BIG_TOPIC, desc.object_id, url, {}, 0, None, 0, frames, True, True)
    child = subprocess.run([sys.executable, __file__, "--memory-probe", json.dumps(task.to_dict())],
                           capture_output=True, text=True, check=True)
    result = json.loads(child.stdout.strip().splitlines()[-1])
    if result["rows"] != frames:
        raise RuntimeError(f"memory probe read {result['rows']} of the {frames} messages in {url}")
    store.delete(url)
    return {"object_mb": round(desc.size / 2**20, 1), **result}


# ---- Spark ---------------------------------------------------------------------------------


def start_spark(warehouse: Path):
    """local[2] with Delta; `format("danube")` and `format("passthrough")` registered."""
    # Python workers must import passthrough_source (pickled by reference) and the repo.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH_DIR.parent), str(BENCH_DIR),
                                                             os.environ.get("PYTHONPATH")]))
    from delta import configure_spark_with_delta_pip

    import connectors
    from passthrough_source import PassthroughDataSource

    builder = local_delta_builder("bench-connector", warehouse)
    spark = configure_spark_with_delta_pip(builder).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    connectors.register(spark)
    spark.dataSource.register(PassthroughDataSource)
    return spark


def loaders(spark, work: Path, options: dict, first_rows: int | None = None) -> dict[str, Callable]:
    """The three inputs as DataFrame factories: all rows, or the first object's `first_rows`
    (the first file of each input holds the first task's rows, which is the first object)."""
    subset = "-first" if first_rows else ""
    for kind in ("arrow", "parquet") if first_rows else ():
        first = min((work / kind).iterdir())
        (work / f"{kind}{subset}").mkdir()
        (work / f"{kind}{subset}" / first.name).symlink_to(first)
    danube = {**options, **({"endingOffsets": json.dumps({MAIN_TOPIC: first_rows})} if first_rows else {})}
    return dict(zip(CASES, (
        lambda: spark.read.parquet(str(work / f"parquet{subset}")),
        lambda: spark.read.format("passthrough").option("path", str(work / f"arrow{subset}")).load(),
        lambda: spark.read.format("danube").options(**danube).load(),
    )))


def to_delta(spark, name: str, load: Callable, rows: int | None, out: Path) -> Timing:
    """Write `load()` to a new Delta table (row count checked unless `rows` is None, table
    removed): wall seconds and CPU seconds of this process and its children (the JVM, its
    Python workers, etcd)."""
    cpu = tree_cpu_s()
    with timed() as t:
        load().write.format("delta").mode("overwrite").save(str(out))
    t.cpu_s = tree_cpu_s() - cpu
    written = spark.read.format("delta").load(str(out)).count()
    shutil.rmtree(out)
    if rows is not None and written != rows:
        raise RuntimeError(f"{name}: the Delta table has {written} rows, expected {rows}")
    return t


def spark_cases(spark, work: Path, options: dict, rows: int, repeat: int) -> list[dict]:
    """Each input written to Delta after a warm-up on one object, best of `repeat` (interleaved);
    rates per wall second and per CPU second of the whole Spark process tree."""
    first_rows = min(rows, OBJECT_MESSAGES)
    for name, load in loaders(spark, work, options, first_rows).items():
        # JIT and class loading only: a Parquet or Arrow input's first file may hold more than
        # the first object's rows, so the count is not checked here (the timed runs check it).
        to_delta(spark, name, load, None, work / "delta")
    runs: dict[str, list[Timing]] = {name: [] for name in CASES}
    for _ in range(repeat):
        for name, load in loaders(spark, work, options).items():
            runs[name].append(to_delta(spark, name, load, rows, work / "delta"))
    best = {name: (min(t.wall_s for t in r), min(t.cpu_s for t in r)) for name, r in runs.items()}
    wall0, cpu0 = best[CASES[0]]
    return [{"case": name, "rows": rows, "seconds": round(wall, 2), "cpu_seconds": round(cpu, 2),
             "runs_s": [round(t.wall_s, 2) for t in runs[name]], "runs_cpu_s": [round(t.cpu_s, 2) for t in runs[name]],
             "rows_per_s": round(rows / wall), "rows_per_cpu_s": round(rows / cpu),
             "ratio_vs_parquet": round(wall0 / wall, 3), "cpu_ratio_vs_parquet": round(cpu0 / cpu, 3)}
            for name, (wall, cpu) in best.items()]


# ---- main ----------------------------------------------------------------------------------


def run(args: argparse.Namespace, work: Path) -> dict:
    big_bytes = args.big_object_mb * 2**20
    sample_frame = len(encode_frames(0, 1000)[0]) / 1000
    total = max(args.messages, math.ceil(big_bytes / sample_frame * 1.02) + 1000)
    with timed() as gen:
        data, positions = build_frames(total)
    print(f"built {total:,} frames ({len(data) / 2**20:.0f} MiB) in {gen.wall_s:.0f} s")
    storage_url = (work / "storage").as_uri()
    store = ObjectStore(storage_url)
    # etcd's data on tmpfs when there is one: only the setup's writes wait for its fsyncs.
    etcd_dir = tempfile.mkdtemp(prefix="bench-etcd-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    try:
        return _measure(args, work, store, data, positions, etcd_dir)
    finally:
        shutil.rmtree(etcd_dir, ignore_errors=True)


def _measure(args: argparse.Namespace, work: Path, store: ObjectStore, data: bytes, positions: np.ndarray,
             etcd_dir: str) -> dict:
    from danube_core.embedded_etcd import EmbeddedEtcd

    big_bytes, storage_url = args.big_object_mb * 2**20, store.url
    with EmbeddedEtcd(data_dir=etcd_dir) as etcd:
        objects = write_main_topic(store, etcd.endpoint, data, positions, args.messages)
        memory = measure_memory(store, data, positions, big_bytes)
        # The same on a 1 MiB object: what a task's first read costs whatever the object's size.
        memory["first_read_mb"] = measure_memory(store, data, positions, 2**20)["task_peak_mb"]
        history = [write_history_topic(store, etcd.endpoint, n) for n in args.descriptors]
        options = {"etcd.endpoints": etcd.endpoint, "storage.url": storage_url, "walRoot": "none",
                   "topic": MAIN_TOPIC}
        for sub in ("arrow", "parquet"):
            (work / sub).mkdir()
        read = measure_read(options, work / "arrow", work / "parquet")
        planning = [measure_planning(etcd.endpoint, storage_url, t, head, 20) for t, head in history]
        spark = start_spark(work / "warehouse")
        try:
            throughput = spark_cases(spark, work, options, args.messages, args.repeat)
        finally:
            spark.stop()
    danube = throughput[-1]
    return {
        "benchmark": "connector", **machine_info(), "messages": args.messages, "payload_bytes": PAYLOAD_BYTES,
        "objects": objects, "repeat": args.repeat, "throughput": throughput, "read": read,
        "planning": planning, "memory": memory,
        "goals": {"ratio_vs_parquet": GOAL_RATIO, "planning_ms": GOAL_PLAN_MS, "task_peak_mb": GOAL_MEMORY_MB},
        "meets": {"ratio_vs_parquet": danube["ratio_vs_parquet"] >= GOAL_RATIO,
                  "cpu_ratio_vs_parquet": danube["cpu_ratio_vs_parquet"] >= GOAL_RATIO,
                  "planning_ms": all(p["near_head_ms"] <= GOAL_PLAN_MS for p in planning),
                  "task_peak_mb": memory["task_peak_mb"] <= GOAL_MEMORY_MB},
    }


def report(result: dict) -> None:
    print(f"\n{result['messages']:,} messages ({result['payload_bytes']}-byte payloads, {result['objects']} "
          f"objects); load average {result['load_average_1m_start']} -> {result['load_average_1m']} on "
          f"{result['cpu_count']} CPUs: wall-clock rates suffer from other load, CPU rates far less")
    print_table(result["throughput"], [
        Column("case", "case"), Column("best s", "seconds", "{:.2f}"), Column("rows/s", "rows_per_s", "{:,}"),
        Column("x parquet", "ratio_vs_parquet", "{:.2f}"), Column("cpu s", "cpu_seconds", "{:.1f}"),
        Column("rows/cpu-s", "rows_per_cpu_s", "{:,}"), Column("x parquet (cpu)", "cpu_ratio_vs_parquet", "{:.2f}")])
    r = result["read"]
    print(f"\nread() in process, {r['messages']:,} messages in {r['tasks']} tasks: read_task "
          f"{r['read_task_msgs_per_cpu_s']:,} msgs/cpu-s, whole read() {r['read_msgs_per_cpu_s']:,} msgs/cpu-s")
    print_table(r["profile_first_2_tasks"], [Column("own time (cProfile, 2 tasks)", "function"),
                                             Column("calls", "calls", "{:,}"), Column("s", "tottime_s", "{:.3f}"),
                                             Column("share", "share", "{:.0%}")])
    print()
    print_table(result["planning"], [Column("descriptors", "descriptors", "{:,}"), Column("first ms", "first_call_ms"),
                                     Column("near-head ms", "near_head_ms"), Column("max ms", "near_head_max_ms"),
                                     Column("full-backlog ms", "full_backlog_ms"), Column("tasks", "full_backlog_tasks", "{:,}")],
                title="planning: latestOffset + partitions of a stream")
    m = result["memory"]
    print(f"\none task reading a {m['object_mb']} MiB object: peak RSS {m['task_peak_mb']} MiB above the "
          f"{m['baseline_mb']} MiB baseline ({m['rows']:,} rows in {m['read_wall_s']} s); reading a "
          f"1 MiB object: {m['first_read_mb']} MiB")
    for p in result["planning"]:
        if "full_backlog_error" in p:
            print(f"full-backlog plan of {p['descriptors']:,} descriptors failed: {p['full_backlog_error'][:300]}")
    print(f"goals met: {result['meets']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--big-object-mb", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=2, help="Spark runs per case (best is kept)")
    parser.add_argument("--descriptors", type=lambda s: [int(x) for x in s.split(",")], default=[10_000, 100_000],
                        help="comma-separated descriptor counts of the planning topics")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--memory-probe", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_probe:
        memory_probe(args.memory_probe)
        return 0
    if args.messages < 1 or args.big_object_mb < 1 or args.repeat < 1 or min(args.descriptors) < 4:
        parser.error("--messages, --big-object-mb and --repeat must be >= 1, --descriptors >= 4")
    result = run_in_workdir("bench-connector-", lambda work: run(args, work), keep=args.keep)
    report(result)
    write_results("connector", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
