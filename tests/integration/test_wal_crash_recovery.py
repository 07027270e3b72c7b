"""A WAL writer killed with SIGKILL loses nothing it reported flushed and never reuses an offset."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from broker.wal import Wal, WalConfig
from danube_core.message import MessageID, StreamMessage
from danube_core.topics import TopicName
from tests.conftest import REPO_ROOT

# Appends without pause (the background flusher also runs every 2 ms, so a kill can land in
# the middle of a write) and prints the offset returned by each explicit flush.
CHILD = r"""
import sys
from broker.wal import Wal, WalConfig
from danube_core.message import MessageID, StreamMessage
from danube_core.topics import TopicName

root, topic = sys.argv[1], sys.argv[2]
config = WalConfig(root=root, durable=True, fsync_interval_ms=2, rotate_max_bytes=30_000)
wal = Wal.open(TopicName.parse(topic), config)
print("start", wal.next_offset, flush=True)
n = 0
while True:
    for _ in range(37):
        msg = StreamMessage(n, MessageID(1, topic, "", 0), b"x" * (n % 300), n, "crash")
        wal.append(msg)
        n += 1
    print("flushed", wal.flush(), flush=True)
"""


def run_and_kill(root: str, topic: str, flushes: int) -> tuple[int, list[int]]:
    """Start the child, SIGKILL it after `flushes` reports; returns (start offset, flushed)."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, root, topic], cwd=REPO_ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    reported: list[int] = []
    deadline = time.monotonic() + 120
    try:
        kind, start = child.stdout.readline().split()
        assert kind == "start"
        while len(reported) < flushes and time.monotonic() < deadline:
            line = child.stdout.readline()
            assert line, f"child died: {child.stderr.read()}"
            reported.append(int(line.split()[1]))
    finally:
        os.kill(child.pid, signal.SIGKILL)
        remaining, _ = child.communicate(timeout=60)
    reported += [int(line.split()[1]) for line in remaining.splitlines() if line.startswith("flushed")]
    assert child.returncode == -signal.SIGKILL
    assert len(reported) >= flushes, "child too slow"
    return int(start), reported


def test_sigkill_loses_no_flushed_offset_and_reuses_none(tmp_path, unique_name):
    root, topic = str(tmp_path / "wal"), f"/default/{unique_name('crash')}"
    start1, flushed1 = run_and_kill(root, topic, flushes=40)
    start2, flushed2 = run_and_kill(root, topic, flushes=40)
    assert start1 == 0
    assert start2 > max(flushed1)  # the restarted writer continued after everything flushed

    config = WalConfig(root=root, durable=False, fsync_interval_ms=3_600_000)
    with Wal.open(TopicName.parse(topic), config) as wal:
        offsets = [m.msg_id.topic_offset for m in wal.read(0)]
        assert len(offsets) == len(set(offsets))
        assert offsets == sorted(offsets)
        assert set(flushed1 + flushed2) <= set(offsets)
        # Every offset up to the last one reported flushed is there, from both runs.
        assert set(range(max(flushed1) + 1)) <= set(offsets)
        assert set(range(start2, max(flushed2) + 1)) <= set(offsets)
        assert wal.next_offset == offsets[-1] + 1
        assert wal.append(StreamMessage(0, MessageID(1, topic, "", 0), b"", 0, "after")) == offsets[-1] + 1
        assert len(wal.segments()) > 2
