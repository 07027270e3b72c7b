"""The fault battery's infrastructure cases: a Python worker killed mid-task, etcd killed and
restarted or slowed past its request timeout, S3 answering 503 SlowDown and dropping
connections, an object deleted under a running stream. Rows as in `devstack.faults.cases`.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import time
import uuid
from functools import partial
from pathlib import Path

from devstack.faults.cases import PIPELINE_TIMEOUT_S, Rig, Sizes, edit_config, row, streaming
from devstack.faults.kit import AckingProducer, Etcd, Pipeline, delta_ids, poll
from devstack.faults.proxies import DELAY, HTTP503, PASS, RESET, FaultProxy


def worker_kill9(workdir: Path, etcd: Etcd, sizes: Sizes) -> dict:
    """SIGKILL of a PySpark Python worker while the pipeline's tasks run (the source's read()
    runs in Python workers). recovery_s: the pipeline's whole run, retries included."""
    with Rig(workdir, etcd, "worker-kill", sizes) as rig:
        producer = rig.produce(sizes.before + sizes.after)
        config = rig.pipeline_file("worker", sizes)
        started = time.monotonic()
        for attempt in range(4):  # a run that ends before a worker is killed is rerun, with more to read
            pipe = Pipeline(config, config.parent / f"run-{attempt}.log").start()
            try:
                daemon = poll(partial(_daemon_or_exit, pipe), PIPELINE_TIMEOUT_S, "the Python task workers' daemon",
                              0.2)
                victim = daemon if daemon is True else poll(
                    partial(_killed_worker_or_exit, pipe, int(daemon)), PIPELINE_TIMEOUT_S, "a Python task worker",
                    0.01)
            except BaseException:
                pipe.kill9()
                raise
            if victim is not True:
                break
            pipe.wait(PIPELINE_TIMEOUT_S)
            rig.failures.append(f"run {attempt} ended before a task worker was killed: " + _failure_line(pipe))
            producer = rig.produce_more(producer, sizes.after)
        else:
            raise RuntimeError(f"no run of {config} had a task worker to kill: {rig.failures}")
        code = pipe.wait(PIPELINE_TIMEOUT_S)
        log = pipe.log_path.read_text(errors="replace")
        task_failed = "exited unexpectedly" in log or "Lost task" in log
        outcome = (f"killed worker {victim}: " + ("a task failed and was retried; " if task_failed else "")
                   + ("query went on" if code == 0 else f"query failed (exit {code}); restarted"))
        if code != 0:
            code, _, log = rig.run_supervised(config, tag="restart")
            assert code == 0, log
        counts = rig.tally(config, producer.sent, producer.acked)
        return row("python worker kill -9 mid-task", producer, counts, time.monotonic() - started, rig.outcome(outcome))


def _failure_line(pipe: Pipeline) -> str:
    log = pipe.log_path.read_text(errors="replace") if pipe.log_path.exists() else ""
    return next((line.strip()[:200] for line in log.splitlines() if "ERROR pipelines" in line), "exit "
                f"{pipe.running.returncode}")


def _daemon_or_exit(pipe: Pipeline) -> int | bool:
    """The pipeline's Python task workers' daemon, True once the pipeline has exited instead."""
    return _task_worker_daemon(pipe.running.pid) or pipe.running.poll() is not None


def _killed_worker_or_exit(pipe: Pipeline, daemon: int) -> int | bool:
    """A task worker of `daemon` killed (its pid), True once the pipeline has exited instead."""
    return _kill_newest_child(daemon) or pipe.running.poll() is not None


def _task_worker_daemon(root: int) -> int | None:
    """The `python -m pyspark.daemon pyspark.worker` under process `root`, which forks the
    task workers. The daemons run in process groups of their own, so the tree is walked by
    parent pid (a scan of /proc, a few times a second until the daemon starts)."""
    parents, cmdlines = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            parents[int(entry)] = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            cmdlines[int(entry)] = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ")
        except OSError:
            continue
    tree, frontier = {root}, {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - tree
        tree |= frontier
    return next((pid for pid in tree if b"pyspark.daemon pyspark.worker" in cmdlines.get(pid, b"")), None)


def _kill_newest_child(daemon: int) -> int | None:
    """SIGKILL the newest task worker `daemon` forked; None if it has none, or the one found
    ended before the signal (a worker can finish between the look and the kill)."""
    try:
        children = open(f"/proc/{daemon}/task/{daemon}/children").read().split()
    except OSError:
        return None
    if not children:
        return None
    victim = max(int(pid) for pid in children)
    try:
        os.kill(victim, signal.SIGKILL)
    except ProcessLookupError:
        return None
    return victim


def etcd_kill_restart(workdir: Path, _etcd: Etcd, sizes: Sizes) -> dict:
    """etcd (the broker's and the pipeline's) killed -9 while producing and a processingTime
    pipeline runs; restarted on its data after `fault_s`. recovery_s: etcd back -> first
    acknowledged send. A pipeline that failed meanwhile is restarted (counted in outcome)."""
    own = Etcd(Path(workdir) / f"etcd-{uuid.uuid4().hex[:6]}").start()
    try:
        with Rig(workdir, own, "etcd-restart", sizes) as rig:
            config = streaming(rig.pipeline_file("etcdkill", sizes))
            runs, producer = _stream_running(rig, config, sizes)
            try:
                own.kill9()
                down = time.monotonic()
                time.sleep(sizes.fault_s)  # the fault's length, not a wait for a condition
                own.start()
                back = time.monotonic()
                while_down = sum(down <= t < back for t in producer.ack_times)
                first = _sends_resumed(producer, back, sizes, "etcd restarted")
            finally:
                producer.stop()
            counts = _drain(rig, config, runs, producer)
            return row("etcd kill -9 + restart", producer, counts, first - back,
                       f"{while_down} sends acknowledged while etcd was down; {_restarts(runs)}")
    finally:
        own.stop()


def _stream_running(rig: Rig, config: Path, sizes: Sizes) -> tuple[list[Pipeline], AckingProducer]:
    """`sizes.before` messages sent, the streaming pipeline of `config` started and through
    its first batch of them, and a paced producer sending on: the state a timed fault meets."""
    first = rig.produce(sizes.before)
    runs = [Pipeline(config, config.parent / "run-0.log").start()]
    rig.wait_for_rows(config, first, runs)
    producer = rig.keep_producing(first)
    poll(lambda: len(producer.acked) > len(first.acked), 120, "a send while the stream runs")
    return runs, producer


def _sends_resumed(producer: AckingProducer, back: float, sizes: Sizes, what: str) -> float:
    """When the first send after the fault ended (`back`) was acknowledged, once `sizes.after`
    more sends were."""
    at_restart = len(producer.acked)
    first = poll(lambda: producer.first_ack_after(back), 180, f"first ack after {what}")
    poll(lambda: len(producer.acked) >= at_restart + sizes.after, 180, f"{sizes.after} acks after")
    return first


def etcd_slow(workdir: Path, etcd: Etcd, sizes: Sizes) -> dict:
    """etcd behind a proxy that delays every chunk 6 s (past the 5 s request timeout) for
    `fault_s`, for the broker and a running pipeline. recovery_s: proxy passing again -> first
    acknowledged send."""
    proxy = FaultProxy(etcd.port)
    try:
        with Rig(workdir, etcd, "etcd-slow", sizes, broker_etcd=proxy.endpoint) as rig:
            config = streaming(rig.pipeline_file("etcdslow", sizes, etcd=proxy.endpoint))
            runs, producer = _stream_running(rig, config, sizes)
            try:
                proxy.set_mode(DELAY, 6.0)
                time.sleep(sizes.fault_s)  # the fault's length
                proxy.set_mode(PASS)
                back = time.monotonic()
                first = _sends_resumed(producer, back, sizes, "etcd sped up")
            finally:
                producer.stop()
            counts = _drain(rig, config, runs, producer)
            return row("etcd slowed past its timeout", producer, counts, first - back,
                       f"{proxy.delayed} chunks delayed; {_restarts(runs)}")
    finally:
        proxy.close()


def s3_faults(workdir: Path, etcd: Etcd, sizes: Sizes) -> dict:
    """S3 (moto) behind a proxy answering 503 SlowDown for fault_s/2, then resetting every
    connection for fault_s/2, for the broker's uploader and a running pipeline.
    recovery_s: proxy passing again -> the next object uploaded."""
    from moto.server import ThreadedMotoServer

    from danube_core.ports import free_port, wait_for_port

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(var, "testing")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request access log
    moto_port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=moto_port)
    moto.start()
    wait_for_port(moto_port)
    proxy = FaultProxy(moto_port)
    bucket = f"faults-{uuid.uuid4().hex[:8]}"
    s3 = _s3_client(f"http://127.0.0.1:{moto_port}")
    s3.create_bucket(Bucket=bucket)
    endpoint = f"http://{proxy.endpoint}"
    cloud = {"backend": "s3", "root": f"s3://{bucket}", "endpoint": endpoint, "region": "us-east-1",
             "access_key": "testing", "secret_key": "testing"}
    storage = {"storage_url": f"s3://{bucket}", "storage_options": {
        "key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}}
    try:
        with Rig(workdir, etcd, "s3-faults", sizes, cloud=cloud, storage=storage) as rig:
            config = streaming(rig.pipeline_file("s3", sizes))
            runs, producer = _stream_running(rig, config, sizes)
            try:
                proxy.set_mode(HTTP503)
                time.sleep(sizes.fault_s / 2)  # the fault's length
                proxy.set_mode(RESET)
                time.sleep(sizes.fault_s / 2)
                objects = _count_objects(s3, bucket)
                proxy.set_mode(PASS)
                back = time.monotonic()
                poll(lambda: _count_objects(s3, bucket) > objects, 180, "an upload after S3 recovered", 0.2)
                uploaded = time.monotonic()
                at_restart = len(producer.acked)
                poll(lambda: len(producer.acked) >= at_restart + sizes.after, 180, f"{sizes.after} acks after")
            finally:
                producer.stop()
            counts = _drain(rig, config, runs, producer)
            return row("S3 503 SlowDown + dropped connections", producer, counts, uploaded - back,
                       f"{proxy.faulted} connections faulted; {_restarts(runs)}")
    finally:
        proxy.close()
        moto.stop()


def _s3_client(endpoint_url: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint_url, aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1")


def _count_objects(s3, bucket: str) -> int:
    return s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0)


def _drain(rig: Rig, config: Path, runs: list[Pipeline], producer: AckingProducer) -> dict:
    """Keep the streaming pipeline running (restarted if it failed) until every acknowledged
    message is in Delta, then stop it and count."""
    def caught_up() -> bool:
        if runs[-1].running.poll() is not None:
            runs[-1].kill9()
            if len(runs) > 5:
                raise RuntimeError(f"pipeline failed {len(runs)} times: {runs[-1].log_tail()}")
            runs.append(Pipeline(config, config.parent / f"run-{len(runs)}.log").start())
        return rig.tally(config, producer.sent, producer.acked)["lost"] == 0

    try:
        poll(caught_up, PIPELINE_TIMEOUT_S, "every acknowledged message in Delta", 1.0)
    finally:
        runs[-1].kill9()
    return rig.tally(config, producer.sent, producer.acked)


def _restarts(runs: list[Pipeline]) -> str:
    codes = [r.running.returncode for r in runs[:-1]]
    return "pipeline ran through" if not codes else f"pipeline failed {len(codes)}x (exit {codes}), restarted"


def object_deleted(workdir: Path, etcd: Etcd, sizes: Sizes) -> dict:
    """The newest uploaded object deleted while an availableNow pipeline works through the
    topic in small batches. With failOnDataLoss=true (the default) the pipeline must stop with
    an error naming the object and its offsets rather than skip them; rerun as the error
    advises (failOnDataLoss=false), exactly the deleted object's messages are lost (and
    counted). recovery_s: the rerun."""
    small = Sizes(sizes.before, sizes.after, max(10, (sizes.before + sizes.after) // 8), sizes.register_ttl_s)
    with Rig(workdir, etcd, "object-deleted", small) as rig:
        cloud = Path(rig.storage["storage_url"])
        producer = rig.produce(sizes.before)
        poll(lambda: list(cloud.rglob("*.dnb1")), 120, "a first uploaded object")
        producer = rig.produce_more(producer, sizes.after)
        objects = poll(lambda: sorted(cloud.rglob("*.dnb1"), key=_first_offset)[1:] or None, 120,
                       "a second uploaded object")
        config = rig.pipeline_file("deleted", small)
        pipe = Pipeline(config, config.parent / "run.log").start()
        try:
            poll(lambda: rig.tally(config, producer.sent, producer.acked)["rows"] > 0, PIPELINE_TIMEOUT_S,
                 "first rows in Delta", 0.5)
            victim = objects[-1]
            victim.unlink()
            code = pipe.wait(PIPELINE_TIMEOUT_S)
        finally:
            pipe.kill9()
        log = pipe.log_path.read_text(errors="replace")
        refusal = re.search(r"DataLossError: data loss in topic \S+: offsets \[(\d+), (\d+)\)", log)
        if code != 1 or refusal is None or victim.name not in log:
            raise RuntimeError(f"deleting {victim.name} was not refused naming it (exit {code}): {pipe.log_tail()}")
        destroyed = _object_offsets(etcd.endpoint, rig.topic, victim.name)
        edit_config(config, lambda d: d["source"].update(fail_on_data_loss=False))  # what the error advises
        code, seconds, log = rig.run_supervised(config, tag="skip-lost")
        assert code == 0, log
        counts = rig.tally(config, producer.sent, producer.acked)
        missing = set(producer.acked) - set(delta_ids(config.parent / "target")) - set(
            delta_ids(config.parent / "quarantine"))
        outcome = (f"refused: DataLossError naming {victim.name} (offsets {min(destroyed)}..{max(destroyed)}); "
                   f"rerun with failOnDataLoss=false as advised: lost = exactly that object's messages "
                   f"({'yes' if missing == destroyed else 'NO: ' + str(sorted(missing))})")
        return row("object deleted under a running stream", producer, counts, seconds, rig.outcome(outcome))


def _object_offsets(etcd_endpoint: str, topic: str, object_name: str) -> set[int]:
    """The offsets the descriptor of `object_name` says it holds (inclusive start..end)."""
    import json
    import subprocess
    import sys

    from devstack.faults.kit import REPO_ROOT

    listing = subprocess.run([sys.executable, "-m", "broker.admin", "--etcd", etcd_endpoint, "topics", "storage", topic],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    for line in listing.splitlines():
        entry = json.loads(line)
        value = entry.get("value") or {}
        if entry.get("kind") == "descriptor" and object_name.startswith(str(value.get("object_id", "-"))):
            return set(range(value["start_offset"], value["end_offset"] + 1))
    raise RuntimeError(f"no descriptor for {object_name} in {listing}")


def _first_offset(path: Path) -> int:
    """`data-<first offset>-<secs>.dnb1` -> first offset."""
    return int(path.name.split("-")[1])
