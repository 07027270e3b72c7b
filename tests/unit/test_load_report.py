"""LoadReport values (spec §5.5) in the shape the real v0.7.3 broker writes, checked against the
`/cluster/load/<id>` values in the golden etcd dumps; and the /proc sampler's arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.load_report import LoadReporter, TopicLoad
from broker.resource_usage import RESOURCE_NAMES, ResourceSampler
from tests.golden import GOLDEN_DIR, require_golden



def golden_load_values() -> list[bytes]:
    values = []
    for dump in sorted(require_golden().glob("*/etcd.jsonl")):
        for line in dump.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row["key"].startswith("/cluster/load/"):
                values.append(row["value"].encode())
    return values


def shape(value) -> object:
    """Keys, list lengths and JSON types (int vs float) of a parsed value; not the numbers."""
    if isinstance(value, dict):
        return {key: shape(v) for key, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return value if isinstance(value, str) and value in RESOURCE_NAMES else type(value).__name__


def assert_shape_of_a_golden_load(raw: bytes) -> None:
    """`raw` has the keys, resource order and JSON types of the real broker's LoadReport."""
    goldens = [json.loads(g) for g in golden_load_values()]
    with_topic = next((g for g in goldens if g["topics"]), None)
    assert with_topic is not None, f"no /cluster/load value with a topic in the golden corpus at {GOLDEN_DIR}"
    ours = json.loads(raw)
    expected = shape(with_topic) | {"topics": [shape(with_topic["topics"][0])] * len(ours["topics"])}
    assert shape(ours) == expected, raw
    assert list(ours) == list(with_topic)


def topic_load(name: str, messages: int = 0, byte_count: int = 0) -> TopicLoad:
    return TopicLoad(topic_name=name, messages_in=messages, bytes_in=byte_count, producer_count=1,
                     consumer_count=2, subscription_count=2, backlog_messages=0)


@pytest.fixture(scope="module")
def golden_loads() -> list[bytes]:
    values = golden_load_values()
    assert values, f"no /cluster/load values in the golden corpus at {GOLDEN_DIR}"
    return values


def test_our_load_report_has_the_shape_of_every_golden_one(golden_loads):
    reporter = LoadReporter(5951367860471965214)
    reporter.report([])
    for raw in golden_loads:
        golden = json.loads(raw)
        ours = json.loads(reporter.report([topic_load(t["topic_name"]) for t in golden["topics"]]))
        assert shape(ours) == shape(golden)
        assert list(ours) == list(golden)  # sorted keys, as serde_json's map writes them
        assert [list(t) for t in ours["topics"]] == [list(t) for t in golden["topics"]]
        assert [r["resource"] for r in ours["resources_usage"]] == ["CPU", "Memory", "DiskIO", "NetworkIO"]


def test_u64_ids_stay_exact_and_empty_reports_sum_to_negative_zero_like_rust(golden_loads):
    broker_id = 7265007936279012863  # > 2^53
    raw = LoadReporter(broker_id).report([])
    assert raw.startswith(b'{"broker_id":7265007936279012863,"resources_usage":[{"resource":"CPU","usage":')
    assert raw.endswith(b'"topics":[],"total_lag_messages":0,"total_message_rate":0,"total_throughput_mbps":-0.0}')
    empty_golden = [g for g in golden_loads if b'"topics":[]' in g]
    assert empty_golden and all(g.endswith(b'"total_throughput_mbps":-0.0}') for g in empty_golden)


def test_topic_rates_are_integers_and_mbps_is_megabytes_per_second(monkeypatch):
    clock = iter([100.0, 102.0])
    monkeypatch.setattr("broker.load_report.time.monotonic", lambda: next(clock))
    reporter = LoadReporter(1, ResourceSampler(proc_dir="/nonexistent", sys_block_dir="/nonexistent"))
    reporter._previous = {"/default/a": topic_load("/default/a")}
    report = json.loads(reporter.report([topic_load("/default/a", messages=7, byte_count=3_000_001)]))
    (topic,) = report["topics"]
    assert (topic["message_rate"], topic["byte_rate"], topic["byte_rate_mbps"]) == (3, 1_500_000, 1.5)
    assert report["total_throughput_mbps"] == 1.5 and report["total_message_rate"] == 3
    assert [r["usage"] for r in report["resources_usage"]] == [0.0, 0.0, 0.0, 0.0]


def write_proc(root: Path, *, cpu: tuple[int, ...], disk_sectors: dict[str, tuple[int, int]],
               net: dict[str, tuple[int, int]]) -> None:
    (root / "net").mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text("cpu  " + " ".join(map(str, cpu)) + "\ncpu0 1 2 3 4\n")
    (root / "meminfo").write_text("MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    250 kB\n")
    (root / "diskstats").write_text("".join(
        f"   8       0 {name} 10 0 {read} 5 20 0 {written} 7 0 9 12\n" for name, (read, written) in disk_sectors.items()))
    (root / "net" / "dev").write_text(
        "Inter-|   Receive                            |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets\n"
        + "".join(f"{name:>6}: {rx} 1 0 0 0 0 0 0 {tx} 1 0 0 0 0 0 0\n" for name, (rx, tx) in net.items()))


def test_the_sampler_reports_rates_over_the_interval_from_proc(tmp_path):
    proc, sys_block = tmp_path / "proc", tmp_path / "block"
    for name in ("vda", "sdb"):
        (sys_block / name / "device").mkdir(parents=True)
    (sys_block / "loop0").mkdir()
    times = iter([10.0, 14.0])
    sampler = ResourceSampler(proc_dir=str(proc), sys_block_dir=str(sys_block), clock=lambda: next(times))
    # user nice system idle iowait irq softirq steal
    write_proc(proc, cpu=(100, 0, 50, 800, 50, 0, 0, 0),
               disk_sectors={"vda": (1000, 2000), "vda1": (1000, 2000), "sdb": (0, 8), "loop0": (99, 99)},
               net={"lo": (5000, 5000), "eth0": (100, 40)})
    first = sampler.sample()
    assert first == [{"resource": "CPU", "usage": 0.0}, {"resource": "Memory", "usage": 75.0},
                     {"resource": "DiskIO", "usage": 0.0}, {"resource": "NetworkIO", "usage": 0.0}]
    write_proc(proc, cpu=(130, 0, 80, 830, 60, 0, 0, 0),  # +60 busy of +100
               disk_sectors={"vda": (1008, 2000), "vda1": (1008, 2000), "sdb": (0, 16), "loop0": (999, 999)},
               net={"lo": (6000, 6000), "eth0": (103, 40)})
    usage = {r["resource"]: r["usage"] for r in sampler.sample()}
    assert usage["CPU"] == 60.0
    assert usage["DiskIO"] == float((8 + 8) * 512 // 4)  # whole physical disks only: not vda1, not loop0
    assert usage["NetworkIO"] == float(2003 // 4)  # truncated like the broker's u64 rate
    assert all(type(v) is float for v in usage.values())


def test_a_counter_that_went_backwards_counts_as_zero(tmp_path):
    times = iter([0.0, 1.0])
    sampler = ResourceSampler(proc_dir=str(tmp_path), sys_block_dir=str(tmp_path / "none"), clock=lambda: next(times))
    write_proc(tmp_path, cpu=(1, 0, 1, 1), disk_sectors={}, net={"eth0": (1000, 1000)})
    sampler.sample()
    write_proc(tmp_path, cpu=(1, 0, 1, 1), disk_sectors={}, net={"eth0": (10, 10)})
    assert [r["usage"] for r in sampler.sample()][2:] == [0.0, 0.0]


def test_an_unreadable_proc_gives_zeros_not_errors(tmp_path):
    sampler = ResourceSampler(proc_dir=str(tmp_path / "missing"), sys_block_dir=str(tmp_path / "missing"))
    sampler.sample()
    assert sampler.sample() == [{"resource": name, "usage": 0.0} for name in RESOURCE_NAMES]
