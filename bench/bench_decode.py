"""Benchmark: WAL frames -> Arrow RecordBatch, C decoder vs its pure fallback and the pure-Python reference.

Usage: python bench/bench_decode.py [--frames N] [--reference-frames M] [--repeat R] [--pure-repeat P]

Builds N frames of a typical broker message (topic "/default/orders", broker_addr
"http://127.0.0.1:6650/", producer "producer-1", 100-byte payload, 1-2 attributes,
subscription Some("")), decodes them in one call and reports messages per second on one
core: rates are per CPU second of this process (best of R runs), which is what "per core"
means and what stays meaningful on a shared, busy machine; wall-clock rates and the load
average are recorded next to them. The reference decoder is ~200x slower, so it runs on the
first M frames and is scaled. The pure decoder (`danube_core.pure_decode`, what readers use
where the C extension was not built) decodes the same N frames, best of P runs, and its
rate is reported against the C decoder's (`ratio_c_over_pure`). Writes
bench/results/decode.json. The target is >= 3 M msgs/s for the full-column decode.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from danube_core import _fastdecode, pure_decode  # noqa: E402
from danube_core.arrow_decode import (  # noqa: E402
    decode_frames,
    decode_frames_reference,
    scan_frame_offsets,
)
from danube_core.frames import encode_frame  # noqa: E402
from danube_core.message import MessageID, StreamMessage, encode_message  # noqa: E402
from bench.common import profile_top  # noqa: E402

RESULTS_PATH = REPO_ROOT / "bench" / "results" / "decode.json"
PAYLOAD_SIZE = 100
TARGET_MSGS_PER_S = 3_000_000
# What the Spark connector asks for: no broker_addr, subscription_name or frame_pos.
CONNECTOR_COLUMNS = [
    "offset", "request_id", "producer_id", "topic_name", "payload", "publish_time",
    "producer_name", "attributes", "schema_id", "schema_version",
]


def build_frames(count: int, seed: int = 7) -> bytes:
    """`count` back-to-back frames with offsets 0..count-1, as the broker writes them."""
    rng = random.Random(seed)
    payloads = [rng.randbytes(PAYLOAD_SIZE) for _ in range(256)]
    attribute_sets = [{"content-type": "application/json"}, {"key": "k1", "region": "eu-west-1"}]
    producer_id = rng.getrandbits(64)
    frames = []
    for offset in range(count):
        msg = StreamMessage(
            request_id=offset + 1,
            msg_id=MessageID(producer_id, "/default/orders", "http://127.0.0.1:6650/", offset),
            payload=payloads[offset & 255],
            publish_time=1_700_000_000_000 + offset,
            producer_name="producer-1",
            subscription_name="",
            attributes=attribute_sets[offset & 1],
        )
        frames.append(encode_frame(offset, encode_message(msg)))
    return b"".join(frames)


def best_times(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Best (CPU seconds, wall seconds) over `repeat` calls."""
    best_cpu = best_wall = float("inf")
    for _ in range(repeat):
        cpu, wall = time.process_time(), time.perf_counter()
        fn()
        best_cpu = min(best_cpu, time.process_time() - cpu)
        best_wall = min(best_wall, time.perf_counter() - wall)
    return best_cpu, best_wall


def measure(name: str, fn: Callable[[], object], repeat: int, frames: int, nbytes: int) -> dict:
    """Rates for decoding `frames` frames (`nbytes` bytes) with `fn`."""
    cpu, wall = best_times(fn, repeat)
    return {
        "case": name,
        "frames_decoded": frames,
        "cpu_seconds": cpu,
        "wall_seconds": wall,
        "msgs_per_s": frames / cpu,
        "wall_msgs_per_s": frames / wall,
        "mb_per_s": nbytes / cpu / 1e6,
    }


def run(frames: int, reference_frames: int, repeat: int, pure_repeat: int) -> dict:
    start = time.perf_counter()
    buf = build_frames(frames)
    build_s = time.perf_counter() - start
    sample = memoryview(buf)[: decode_frames(buf, max_frames=reference_frames, columns=["offset"]).consumed]

    full = decode_frames(buf, _decoder=_fastdecode)
    assert full.batch.num_rows == frames and full.stop_reason == "end", full.stop_detail
    reference = decode_frames_reference(sample)
    assert decode_frames(sample, _decoder=_fastdecode).batch.equals(reference.batch), "fast and reference differ"
    assert decode_frames(buf, _decoder=pure_decode).batch.equals(full.batch), "pure and fast differ"

    size = len(buf)
    cases = [
        measure("fast, all columns", lambda: decode_frames(buf, _decoder=_fastdecode), repeat, frames, size),
        measure(
            "fast, connector columns",
            lambda: decode_frames(buf, columns=CONNECTOR_COLUMNS, _decoder=_fastdecode),
            repeat,
            frames,
            size,
        ),
        measure("scan_frame_offsets (CRC only)", lambda: scan_frame_offsets(buf, _decoder=_fastdecode), repeat,
                frames, size),
        measure("pure, all columns", lambda: decode_frames(buf, _decoder=pure_decode), pure_repeat, frames, size),
        measure(
            "pure, connector columns",
            lambda: decode_frames(buf, columns=CONNECTOR_COLUMNS, _decoder=pure_decode),
            pure_repeat,
            frames,
            size,
        ),
        measure("pure scan_frame_offsets", lambda: scan_frame_offsets(buf, _decoder=pure_decode), pure_repeat,
                frames, size),
        measure(
            "reference (pure Python)",
            lambda: decode_frames_reference(sample),
            1,
            reference.batch.num_rows,
            len(sample),
        ),
    ]
    fast_rate, ref_rate = cases[0]["msgs_per_s"], cases[-1]["msgs_per_s"]
    by_case = {case["case"]: case["msgs_per_s"] for case in cases}
    c_over_pure = {
        "all columns": by_case["fast, all columns"] / by_case["pure, all columns"],
        "connector columns": by_case["fast, connector columns"] / by_case["pure, connector columns"],
        "scan_frame_offsets": by_case["scan_frame_offsets (CRC only)"] / by_case["pure scan_frame_offsets"],
    }
    # The hot path as the connector calls it (C decoder plus its Python wrapper), untimed.
    profile = profile_top(lambda: decode_frames(buf, columns=CONNECTOR_COLUMNS, _decoder=_fastdecode), top=10)
    return {
        "frames": frames,
        "buffer_bytes": len(buf),
        "payload_bytes": PAYLOAD_SIZE,
        "build_seconds": build_s,
        "repeat": repeat,
        "pure_repeat": pure_repeat,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "cases": cases,
        "ratio_fast_over_reference": fast_rate / ref_rate,
        "ratio_c_over_pure": c_over_pure,
        "target_msgs_per_s": TARGET_MSGS_PER_S,
        "meets_target": fast_rate >= TARGET_MSGS_PER_S,
        "profile": {"case": "fast, connector columns, untimed", "tool": "cProfile", "top_own_time": profile},
    }


def print_table(result: dict) -> None:
    print(f"{result['frames']:,} frames, {result['buffer_bytes'] / 1e6:.1f} MB, "
          f"{result['payload_bytes']}-byte payloads (built in {result['build_seconds']:.1f} s)")
    print(f"{'case':<32} {'frames':>10} {'cpu s':>8} {'msgs/cpu-s':>12} {'MB/cpu-s':>9} "
          f"{'wall msgs/s':>12}")
    for case in result["cases"]:
        print(f"{case['case']:<32} {case['frames_decoded']:>10,} {case['cpu_seconds']:>8.3f} "
              f"{case['msgs_per_s']:>12,.0f} {case['mb_per_s']:>9.1f} "
              f"{case['wall_msgs_per_s']:>12,.0f}")
    print("C / pure decoder: " + ", ".join(f"{name} {ratio:.1f}x" for name, ratio in result["ratio_c_over_pure"].items()))
    print(f"fast / reference: {result['ratio_fast_over_reference']:.0f}x; "
          f"target {TARGET_MSGS_PER_S:,} msgs/s per core met: {result['meets_target']} "
          f"(1-minute load average {result['load_average_1m']:.1f} on {result['cpu_count']} CPUs)")
    print("hot path (own time, cProfile):")
    for row in result["profile"]["top_own_time"][:5]:
        print(f"  {row['share']:>6.1%}  {row['function']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--reference-frames", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pure-repeat", type=int, default=3)
    args = parser.parse_args()
    if min(args.frames, args.reference_frames, args.repeat, args.pure_repeat) < 1:
        parser.error("--frames, --reference-frames, --repeat and --pure-repeat must be >= 1")
    result = run(args.frames, args.reference_frames, args.repeat, args.pure_repeat)
    print_table(result)
    RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_PATH.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS_PATH.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()
