"""A broker's lookup cache and lookups against the size of the cluster around it (issue 25).

Any broker answers TopicLookup for any topic (Connect, or Redirect to the owner), so its
lookup cache holds the cluster's registrations, assignments and namespace index: two keys per
topic of the cluster. A topic's `/topics` keys (delivery, policy, producers, subscriptions,
cursors) it holds only while it serves the topic (`broker.lookup_cache`). This measures a
broker serving a fixed `--served` (50) topics in clusters of `--topics` (100 and 10,000).

Setup, one etcd per cluster size (keys written straight into it, in transactions of 128
puts): `--brokers` (10) registered brokers with their state keys; per topic its namespace-index
entry, its assignment (the measured broker holds the first `--served` topics, the others are
spread over the other brokers), its delivery, a producer, a subscription and its cursor.

Each case runs in a fresh Python process of its own (its RSS growth is the cache's): open the
lookup cache and serve the broker's topics as the broker does (`open_lookup_cache`, then
`ServedTopicKeys.serve` per topic, as `BrokerService` does when a topic loads), then time
`owner` and `exists` of random topics of the cluster through a `TopicRegistry` over the
`CachedMetadataStore`, then let another process write `--foreign-writes` (2,000) cursor
updates of topics the broker does not serve and measure the CPU the cache spends on them
(its watch is on `/`, so it receives every write of the cluster). Two wirings:

* `served`: the broker's: `/cluster/` and `/namespaces/` whole, `/topics/` of its own
  topics; `owner` one point read per broker (`broker.topics_registry.broker_ids`);
* `whole tree` (baseline, the broker before issue 25, reproduced here): `/cluster/`,
  `/namespaces/` and `/topics/` whole; `owner` scanning every assignment of the cluster.

Per case: cache start (load + serve, wall and CPU ms), keys held, RSS growth (MB), lookup
times (median and p99 µs), CPU µs per foreign write, and (JSON only) a cProfile of
`owner` lookups from an untimed run; the largest cluster's figures over the smallest's (`x`),
and the baseline's over the broker's at each size.

    python bench/bench_broker_lookups.py [--topics 100,10000] [--served 50] [--brokers 10]

Prints a table and writes bench/results/broker_lookups.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR.parent), str(BENCH_DIR)]

from common import Column, machine_info, print_table, profile_top, rss_mb, timed, write_results  # noqa: E402
from danube_core import keys  # noqa: E402
from danube_core.records import (  # noqa: E402
    NULL_JSON, RELIABLE, BrokerRegistration, BrokerState, Policies, ProducerRecord, SubscriptionRecord,
    dump_cursor, dump_delivery,
)
from danube_core.topics import TopicName  # noqa: E402

NAMESPACE = "bench"
SELF = 1  # the measured broker; the others are 2 .. --brokers
ETCD_FLAGS = ("--unsafe-no-fsync",)
MODES = ("served", "whole tree")
PROFILED_LOOKUPS = 50
WHOLE_TREE_PREFIXES = [keys.CLUSTER_PREFIX, keys.NAMESPACES_PREFIX, keys.TOPICS_PREFIX]


def topic_name(i: int) -> TopicName:
    return TopicName(NAMESPACE, f"t-{i:06d}")


def owner_of(i: int, served: int, brokers: int) -> int:
    return SELF if i < served else 2 + i % (brokers - 1)


def cluster_keys(topics: int, served: int, brokers: int) -> Iterator[tuple[str, bytes]]:
    """Every key of a cluster of `topics` topics on `brokers` brokers (spec §5.3-§5.5)."""
    yield keys.namespace_policy_key(NAMESPACE), Policies().to_json()
    for b in range(1, brokers + 1):
        yield keys.register_key(b), BrokerRegistration(f"http://10.0.0.{b}:50051", f"http://10.0.0.{b}:6650",
                                                       f"http://10.0.0.{b}:6650").to_json()
        yield keys.broker_state_key(b), BrokerState("active", "boot").to_json()
    for i in range(topics):
        topic = topic_name(i)
        yield keys.namespace_topic_key(topic), NULL_JSON
        yield keys.assignment_key(owner_of(i, served, brokers), topic), NULL_JSON
        yield keys.delivery_key(topic), dump_delivery(RELIABLE)
        yield keys.producer_key(topic, 1000 + i), ProducerRecord(0, 1000 + i, f"producer-{i}", True,
                                                                 topic.broker_name).to_json()
        yield keys.subscription_key(topic, "sub"), SubscriptionRecord(None, "consumer", "sub", 0).to_json()
        yield keys.cursor_key(topic, "sub"), dump_cursor(i)


def foreign_writes(topics: int, served: int, count: int) -> Iterator[tuple[str, bytes]]:
    """Cursor flushes of topics the measured broker does not serve, as their owners write them."""
    others = list(range(served, topics)) or [0]
    for n in range(count):
        yield keys.cursor_key(topic_name(others[n % len(others)]), "sub"), dump_cursor(topics + n)


# ---- one case, in a process of its own --------------------------------------------------------


def scan_owner(metadata, topic: TopicName) -> int | None:
    """`TopicRegistry.owner` before issue 25: every assignment key of the cluster, per lookup."""
    for key, _ in metadata.get_prefix(keys.BROKERS_PREFIX, keys_only=True):
        parsed = keys.parse_assignment_key(key)
        if parsed is not None and parsed[1] == topic:
            return parsed[0]
    return None


def percentile_us(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return round(ordered[int(q * (len(ordered) - 1))] * 1e6, 1)


def time_lookups(call, names: list[TopicName], budget_s: float) -> list[float]:
    """Seconds per call over `names`, stopping early once `budget_s` is spent (slow lookups)."""
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    for name in names:
        start = time.perf_counter()
        call(name)
        samples.append(time.perf_counter() - start)
        if time.perf_counter() > deadline and len(samples) >= 20:
            break
    return samples


def run_case(spec: dict) -> dict:
    """One broker's lookup cache, served topics and lookups. Runs in the child."""
    from broker.lookup_cache import ServedTopicKeys, open_lookup_cache
    from broker.topics_registry import TopicRegistry
    from danube_core.cached_store import CachedMetadataStore
    from danube_core.local_cache import LocalCache
    from danube_core.metadata_etcd import EtcdMetadataStore

    store = EtcdMetadataStore(spec["endpoint"])
    topics, served, whole_tree = spec["topics"], spec["served"], spec["mode"] == "whole tree"
    gc.collect()
    rss_before = rss_mb()
    with timed() as started:  # what BrokerServer.start, then the topics' loads, do
        if whole_tree:
            cache = LocalCache(store, WHOLE_TREE_PREFIXES, name="bench").start()
        else:
            cache = open_lookup_cache(store, "bench")
            keys_served = ServedTopicKeys(cache)
            for i in range(served):
                keys_served.serve(topic_name(i))
    gc.collect()
    rss_started = rss_mb()
    lookups = CachedMetadataStore(store, cache)
    registry = TopicRegistry(lookups)
    owner = (lambda name: scan_owner(lookups, name)) if whole_tree else registry.owner
    rng = random.Random(25)
    names = [topic_name(rng.randrange(topics)) for _ in range(spec["lookups"])]
    assert owner(names[0]) == owner_of(int(names[0].topic[2:]), served, spec["brokers"])
    owner_s = time_lookups(owner, names, spec["budget_s"])
    exists_s = time_lookups(registry.exists, names, spec["budget_s"])
    watch_cpu_us = foreign_write_cpu_us(cache, spec)
    profile = profile_top(lambda: [owner(name) for name in names[:PROFILED_LOOKUPS]])  # untimed
    row = {
        "start_wall_ms": round(started.wall_s * 1000, 1), "start_cpu_ms": round(started.cpu_s * 1000, 1),
        "keys_held": cache.keys_held, "rss_growth_mb": round(rss_started - rss_before, 1),
        "owner_median_us": percentile_us(owner_s, 0.5), "owner_p99_us": percentile_us(owner_s, 0.99),
        "owner_lookups": len(owner_s),
        "exists_median_us": percentile_us(exists_s, 0.5), "exists_p99_us": percentile_us(exists_s, 0.99),
        "watch_cpu_us_per_foreign_write": watch_cpu_us,
        "profile": {"case": f"{PROFILED_LOOKUPS} owner lookups, untimed", "top": profile},
    }
    cache.close()
    store.close()
    return row


def foreign_write_cpu_us(cache, spec: dict) -> float:
    """CPU this process spends per write to a topic it does not serve (another process writes;
    this one only receives the watch events), in µs."""
    cpu = time.process_time()
    done = subprocess.run([sys.executable, __file__, "--write-foreign", json.dumps(spec)], capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"writing the foreign cursor updates failed:\n{done.stderr[-4000:]}")
    cache.wait_for_revision(int(done.stdout.strip().splitlines()[-1]), 120.0)
    return round((time.process_time() - cpu) / spec["foreign_writes"] * 1e6, 2)


def write_foreign_main(spec_json: str) -> int:
    """Child of a case: write the foreign cursor updates one put each (as cursor flushes are),
    print the revision of the last one."""
    from danube_core.metadata_etcd import EtcdMetadataStore

    spec = json.loads(spec_json)
    store = EtcdMetadataStore(spec["endpoint"])
    try:
        revision = 0
        for key, value in foreign_writes(spec["topics"], spec["served"], spec["foreign_writes"]):
            revision = store.put(key, value)
        print(revision)
    finally:
        store.close()
    return 0


def child_main(spec_json: str) -> int:
    import broker.lookup_cache  # noqa: F401  # imports first: the RSS growth is the cache's own
    import broker.topics_registry  # noqa: F401
    import danube_core.metadata  # noqa: F401

    print(json.dumps(run_case(json.loads(spec_json))))
    return 0


# ---- the run ----------------------------------------------------------------------------------


def measure(spec: dict) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                          timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"case {spec['mode']} {spec['topics']} failed:\n{done.stderr[-4000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row.update(mode=spec["mode"], topics=spec["topics"], case=f"{spec['mode']}, {spec['topics']:,} topics")
    print(f"  {row['case']}: {row['keys_held']:,} keys, rss +{row['rss_growth_mb']} MB, owner "
          f"{row['owner_median_us']:,.0f} us", flush=True)
    return row


def add_ratios(results: list[dict], sizes: list[int]) -> dict:
    """Per wiring, the largest cluster's figures over the smallest's; per size, the baseline's
    over the broker's."""
    figures = ("start_wall_ms", "keys_held", "rss_growth_mb", "owner_median_us", "exists_median_us",
               "watch_cpu_us_per_foreign_write")
    by = {(r["mode"], r["topics"]): r for r in results}
    ratios: dict = {"largest_over_smallest": {}, "whole_tree_over_served": {}}
    for mode in MODES:
        small, large = by[(mode, sizes[0])], by[(mode, sizes[-1])]
        large["x"] = round(large["keys_held"] / small["keys_held"], 2)
        ratios["largest_over_smallest"][mode] = {f: round(large[f] / small[f], 2) if small[f] else None
                                                 for f in figures}
    for size in sizes:
        base, ours = by[("whole tree", size)], by[("served", size)]
        ratios["whole_tree_over_served"][str(size)] = {f: round(base[f] / ours[f], 2) if ours[f] else None
                                                       for f in figures}
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--write-foreign", help=argparse.SUPPRESS)
    parser.add_argument("--topics", default="100,10000", help="cluster sizes in topics, smallest first")
    parser.add_argument("--served", type=int, default=50, help="topics the measured broker serves")
    parser.add_argument("--brokers", type=int, default=10, help="registered brokers, the measured one included")
    parser.add_argument("--lookups", type=int, default=2000, help="lookups timed per kind (random topics)")
    parser.add_argument("--budget-s", type=float, default=5.0, help="time cap per kind of lookup")
    parser.add_argument("--foreign-writes", type=int, default=2000)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args.child)
    if args.write_foreign:
        return write_foreign_main(args.write_foreign)
    from bench_connector import put_all
    from danube_core.embedded_etcd import EmbeddedEtcd

    sizes = [int(n) for n in args.topics.split(",")]
    if min(sizes) < args.served or args.brokers < 2:
        parser.error("every cluster size must hold the served topics, and --brokers must be >= 2")
    load_start = round(os.getloadavg()[0], 2)
    results: list[dict] = []
    writes: dict[str, float] = {}
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-lookups-") as work, \
                EmbeddedEtcd(data_dir=f"{work}/etcd", extra_flags=ETCD_FLAGS) as etcd:
            with timed() as t:
                put_all(etcd.endpoint, cluster_keys(size, args.served, args.brokers))
            writes[str(size)] = round(t.wall_s, 1)
            print(f"wrote a cluster of {size:,} topics in {t.wall_s:.1f}s", flush=True)
            for mode in MODES:
                results.append(measure({
                    "endpoint": etcd.endpoint, "mode": mode, "topics": size, "served": args.served,
                    "brokers": args.brokers, "lookups": args.lookups, "budget_s": args.budget_s,
                    "foreign_writes": args.foreign_writes,
                }))
    ratios = add_ratios(results, sizes)
    load_end = round(os.getloadavg()[0], 2)
    print_table(results, [
        Column("case", "case"), Column("start ms", "start_wall_ms", "{:,.1f}"),
        Column("start cpu ms", "start_cpu_ms", "{:,.1f}"), Column("keys held", "keys_held", "{:,}"),
        Column("x", "x", "{:.2f}"), Column("rss +MB", "rss_growth_mb", "{:.1f}"),
        Column("owner us", "owner_median_us", "{:,.1f}"), Column("p99", "owner_p99_us", "{:,.1f}"),
        Column("exists us", "exists_median_us", "{:,.1f}"), Column("p99", "exists_p99_us", "{:,.1f}"),
        Column("cpu us/foreign write", "watch_cpu_us_per_foreign_write", "{:.1f}"),
    ], title=f"a broker serving {args.served} topics, {args.brokers} brokers; x = keys held over the "
             f"{sizes[0]:,}-topic cluster's; load at start {load_start}, at end {load_end}")
    for kind, table in ratios.items():
        for case, figures in table.items():
            shown = ", ".join(f"{k} {v}" for k, v in figures.items())
            print(f"{kind.replace('_', ' ')} [{case}]: {shown}")
    write_results("broker_lookups", {
        "machine": machine_info(), "load_average_1m_start": load_start, "load_average_1m_end": load_end,
        "arguments": vars(args), "write_seconds": writes, "results": results, "ratios": ratios,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
