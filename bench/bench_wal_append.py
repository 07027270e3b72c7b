"""WAL append throughput with and without fsync(2) (broker.wal).

Appends N messages with a 100-byte payload from one thread, then closes the WAL (final flush
included in the time), for `durable` on and off at a short and the default flush interval.
Prints a table (msgs/s, CPU and wall seconds, MB/s of frame bytes written, flushes, fsync(2)
calls) and the durable / non-durable throughput ratio per interval, and writes
bench/results/wal_append.json with the load it ran under and a cProfile of the durable append
path (a separate, untimed run).

    python bench/bench_wal_append.py [--messages 200000] [--root /tmp/dir]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Column, machine_info, print_table, profile_top, timed, write_results  # noqa: E402
from broker.wal import Wal, WalConfig  # noqa: E402
from danube_core.message import MessageID, StreamMessage  # noqa: E402
from danube_core.topics import TopicName  # noqa: E402

PROFILE_MESSAGES = 50_000
PAYLOAD = bytes(range(100))
INTERVALS_MS = (5, 5000)


def append_all(root: str, messages: int, durable: bool, interval_ms: int, label: str = "") -> Wal:
    """Append `messages` messages into a fresh topic dir and close the WAL (final flush included)."""
    topic = TopicName("bench", f"wal-{'durable' if durable else 'plain'}-{interval_ms}ms{label}")
    config = WalConfig(root=root, durable=durable, fsync_interval_ms=interval_ms)
    template = MessageID(producer_id=1, topic_name=topic.broker_name, broker_addr="", topic_offset=0)
    wal = Wal.open(topic, config)
    for i in range(messages):
        wal.append(StreamMessage(i, template, PAYLOAD, 1_700_000_000_000 + i, "bench"))
    wal.close()
    return wal


def run_case(root: str, messages: int, durable: bool, interval_ms: int) -> dict:
    """Append `messages` messages into a fresh topic dir; returns the measurements."""
    with timed() as t:
        wal = append_all(root, messages, durable, interval_ms)
    elapsed = t.wall_s
    written = sum(os.path.getsize(s.path) for s in wal.segments())
    return {
        "durable": durable,
        "fsync_interval_ms": interval_ms,
        "messages": messages,
        "seconds": round(elapsed, 3),
        "cpu_s": round(t.cpu_s, 3),
        "msgs_per_s": round(messages / elapsed),
        "msgs_per_cpu_s": round(messages / max(t.cpu_s, 1e-9)),
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
    load_start = round(os.getloadavg()[0], 2)
    root = args.root or tempfile.mkdtemp(prefix="bench-wal-")
    try:
        cases = [
            run_case(root, args.messages, durable, interval)
            for interval in INTERVALS_MS
            for durable in (False, True)
        ]
        profile = profile_top(lambda: append_all(root, PROFILE_MESSAGES, True, INTERVALS_MS[0], "-profile"), top=12)
    finally:
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)
    ratios = {}
    for interval in INTERVALS_MS:
        plain, durable = (next(c for c in cases if c["durable"] is d and c["fsync_interval_ms"] == interval)
                          for d in (False, True))
        ratios[f"{interval}ms"] = round(durable["msgs_per_s"] / plain["msgs_per_s"], 3)
    print_table(cases, [Column("durable", "durable"), Column("interval ms", "fsync_interval_ms"),
                        Column("msgs/s", "msgs_per_s", "{:,}"), Column("msgs/CPU s", "msgs_per_cpu_s", "{:,}"),
                        Column("wall s", "seconds"), Column("CPU s", "cpu_s"), Column("MB/s", "mb_per_s"),
                        Column("flushes", "flushes"), Column("fsyncs", "fsyncs")])
    for interval, ratio in ratios.items():
        print(f"durable / non-durable throughput at {interval}: {ratio}")
    print(f"load average at start {load_start}; hot path (durable, {INTERVALS_MS[0]} ms, "
          f"{PROFILE_MESSAGES:,} messages, own time):")
    for row in profile[:6]:
        print(f"  {row['share']:>6.1%}  {row['function']}")
    write_results("wal_append", {
        "benchmark": "wal_append",
        "payload_bytes": len(PAYLOAD),
        "machine": machine_info(),
        "load_average_1m_start": load_start,
        "cases": cases,
        "durable_over_plain_ratio": ratios,
        "profile": {"case": f"durable, {INTERVALS_MS[0]} ms interval, {PROFILE_MESSAGES} messages",
                    "tool": "cProfile", "top_own_time": profile},
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
