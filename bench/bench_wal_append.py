"""WAL append throughput with and without fsync(2) (broker.wal).

Appends N messages with a 100-byte payload from one thread, then closes the WAL (final flush
included in the time), for `durable` on and off at a short and the default flush interval.
Prints a table (msgs/s, MB/s of frame bytes written, flushes, fsync(2) calls) and the
durable / non-durable throughput ratio per interval, and writes bench/results/wal_append.json.

    python bench/bench_wal_append.py [--messages 200000] [--root /tmp/dir]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.wal import Wal, WalConfig  # noqa: E402
from danube_core.message import MessageID, StreamMessage  # noqa: E402
from danube_core.topics import TopicName  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "wal_append.json"
PAYLOAD = bytes(range(100))
INTERVALS_MS = (5, 5000)


def run_case(root: str, messages: int, durable: bool, interval_ms: int) -> dict:
    """Append `messages` messages into a fresh topic dir; returns the measurements."""
    topic = TopicName("bench", f"wal-{'durable' if durable else 'plain'}-{interval_ms}ms")
    config = WalConfig(root=root, durable=durable, fsync_interval_ms=interval_ms)
    template = MessageID(producer_id=1, topic_name=topic.broker_name, broker_addr="", topic_offset=0)
    wal = Wal.open(topic, config)
    started = time.perf_counter()
    for i in range(messages):
        wal.append(StreamMessage(i, template, PAYLOAD, 1_700_000_000_000 + i, "bench"))
    wal.close()
    elapsed = time.perf_counter() - started
    written = sum(os.path.getsize(s.path) for s in wal.segments())
    return {
        "durable": durable,
        "fsync_interval_ms": interval_ms,
        "messages": messages,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(messages / elapsed),
        "mb_per_s": round(written / elapsed / 1e6, 2),
        "bytes_written": written,
        "flushes": wal.flush_count,
        "fsyncs": wal.fsync_count,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--root", help="WAL root (default: a temporary directory, removed after)")
    args = parser.parse_args(argv)
    root = args.root or tempfile.mkdtemp(prefix="bench-wal-")
    try:
        cases = [
            run_case(root, args.messages, durable, interval)
            for interval in INTERVALS_MS
            for durable in (False, True)
        ]
    finally:
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)
    ratios = {}
    for interval in INTERVALS_MS:
        plain, durable = (next(c for c in cases if c["durable"] is d and c["fsync_interval_ms"] == interval)
                          for d in (False, True))
        ratios[f"{interval}ms"] = round(durable["msgs_per_s"] / plain["msgs_per_s"], 3)
    print(f"{'durable':>8} {'interval':>9} {'msgs/s':>10} {'MB/s':>8} {'flushes':>8} {'fsyncs':>8}")
    for c in cases:
        print(f"{str(c['durable']):>8} {c['fsync_interval_ms']:>7}ms {c['msgs_per_s']:>10} "
              f"{c['mb_per_s']:>8} {c['flushes']:>8} {c['fsyncs']:>8}")
    for interval, ratio in ratios.items():
        print(f"durable / non-durable throughput at {interval}: {ratio}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "wal_append",
        "payload_bytes": len(PAYLOAD),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "cases": cases,
        "durable_over_plain_ratio": ratios,
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
