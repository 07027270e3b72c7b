"""The fault battery: each fault against real processes on loopback, bounded in time; a table
of messages produced, acknowledged, rows in Delta, lost, duplicated and time to recover.

    python bench/faults.py [--only broker_kill9,driver_during_target_write] [--before 300] [--after 200] [--jobs 3]

Every case starts what it needs (a broker process with durable acks, `python -m pipelines run`
processes, moto, proxies) under one shared etcd, on free loopback ports, in a temp dir:

| case | fault | recovery_s |
|---|---|---|
| broker_kill9 | kill -9 of the broker while the official client produces; restart on its WAL | restart -> first acknowledged send (goal <= 3 s) |
| driver_<step> | the driver SIGKILLed at one step of a batch (`devstack/faults/hook.py`) | the restarted run |
| worker_kill9 | a PySpark Python worker SIGKILLed mid-task | the pipeline's whole run |
| etcd_kill_restart | etcd kill -9 under a streaming pipeline, restarted after --fault-s | etcd back -> first ack |
| etcd_slow | etcd behind a proxy delaying 6 s per chunk (past the 5 s timeout) | proxy passing -> first ack |
| s3_faults | S3 (moto) answering 503 SlowDown, then resetting connections | S3 back -> next upload |
| object_deleted | an uploaded object deleted under a running pipeline: must stop naming it, not skip | - |
| checkpoint_deleted | checkpoint deleted, pipeline restarted: refused, then resumed as the error says | the resumed run |
| same_subscription_twice | the same pipeline started twice at once | both ended |
| lock_lease_lost | the subscription lock's lease revoked mid-query | restart -> all in Delta |

lost = acknowledged messages missing from the target + quarantine tables; duplicated = extra
copies of any message; both must be 0. Prints the table (with the load average it ran under)
and writes bench/results/faults.json. A case that fails is a row with its error.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from common import Column, machine_info, print_table, write_results  # noqa: E402

from devstack.faults import cases  # noqa: E402
from devstack.faults import cases_infra as infra  # noqa: E402
from devstack.faults.kit import Etcd, remove_tree  # noqa: E402
from pipelines.batch_hooks import STEPS  # noqa: E402

CASES = {
    "broker_kill9": cases.broker_kill9,
    **{f"driver_{step}": partial(cases.driver_kill9, steps=(step,)) for step in STEPS},
    "worker_kill9": infra.worker_kill9,
    "etcd_kill_restart": infra.etcd_kill_restart,
    "etcd_slow": infra.etcd_slow,
    "s3_faults": infra.s3_faults,
    "object_deleted": infra.object_deleted,
    "checkpoint_deleted": cases.checkpoint_deleted,
    "same_subscription_twice": cases.same_subscription_twice,
    "lock_lease_lost": cases.lock_lease_lost,
}

COLUMNS = [
    Column("fault", "fault"), Column("produced", "produced"), Column("acked", "acked"),
    Column("rows in Delta", "rows"), Column("lost", "lost"), Column("duplicated", "duplicated"),
    Column("recovery s", "recovery_s", "{:.2f}"), Column("goal", "goal"), Column("case s", "case_s", "{:.0f}"),
    Column("load", "load_1m", "{:.1f}"), Column("outcome", "outcome"),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help=f"comma-separated cases (default all): {', '.join(CASES)}")
    parser.add_argument("--before", type=int, default=300, help="messages acknowledged before each fault")
    parser.add_argument("--after", type=int, default=200, help="messages acknowledged after recovery")
    parser.add_argument("--batch", type=int, default=200, help="pipeline max_messages_per_trigger")
    parser.add_argument("--fault-s", type=float, default=10.0, help="length of timed faults (etcd, S3)")
    parser.add_argument("--send-rate", type=float, default=None,
                        help="messages a second from the producers that run through a fault (default: unpaced)")
    parser.add_argument("--register-ttl-s", type=int, default=32, help="broker registration lease (Danube: 32)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="cases run at once (each with its own etcd, broker, ports and pipelines)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, tables)")
    parser.add_argument("--results", default="faults", help="bench/results/<name>.json (default faults)")
    args = parser.parse_args(argv)
    chosen = args.only.split(",") if args.only else list(CASES)
    unknown = [c for c in chosen if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    sizes = cases.Sizes(args.before, args.after, args.batch, args.register_ttl_s, args.fault_s, args.send_rate)
    workdir = Path(tempfile.mkdtemp(prefix="danube-faults-"))
    etcd = Etcd(workdir / "etcd").start()
    started = time.monotonic()
    printing = threading.Lock()

    def one(name: str) -> dict:
        result = run_case(name, workdir, etcd, sizes, own_etcd=args.jobs > 1)
        with printing:
            print_table([result], COLUMNS)
        return result

    try:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            rows = list(pool.map(one, chosen))
    finally:
        etcd.stop()
        if not args.keep:
            remove_tree(workdir)
    print()
    wall_s = time.monotonic() - started
    cpu_s = _cpu_seconds()
    print_table(rows, COLUMNS, title=f"fault battery: {len(rows)} cases in {wall_s:.0f} s wall, {cpu_s:.0f} CPU s, "
                                     f"{args.jobs} at once (machine: {machine_info()})")
    write_results(args.results, {"machine": machine_info(), "sizes": vars(sizes), "jobs": args.jobs,
                                 "wall_s": round(wall_s, 1), "cpu_s": round(cpu_s, 1), "workdir": str(workdir),
                                 "rows": rows})
    bad = [r for r in rows if r.get("lost") != 0 or r.get("duplicated") != 0]
    return 1 if bad else 0


def _cpu_seconds() -> float:
    """CPU seconds of this process and the processes it reaped (brokers, pipeline drivers and
    what they reaped; a JVM whose driver was killed -9 is not counted)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_case(name: str, workdir: Path, etcd: Etcd, sizes: cases.Sizes, own_etcd: bool = False) -> dict:
    """One case as a row. `own_etcd`: on an etcd of its own (cases run at once must not share
    one: their brokers would form one cluster and take over each other's topics, uploading them
    to another case's storage)."""
    started = time.monotonic()
    if own_etcd:
        etcd = Etcd(workdir / f"etcd-{name}").start()
    try:
        result = CASES[name](workdir, etcd, sizes)
    except Exception as exc:  # a failed case is a row, the battery goes on
        traceback.print_exc()
        result = {"fault": name, "outcome": f"CASE FAILED: {type(exc).__name__}: {str(exc)[:300]}"}
    finally:
        if own_etcd:
            etcd.stop()
    result.update(case=name, case_s=time.monotonic() - started, load_1m=machine_info()["load_average_1m"],
                  goal="<= 3 s" if name == "broker_kill9" else None)
    return result


if __name__ == "__main__":
    sys.exit(main())
