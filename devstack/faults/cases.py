"""The fault battery's cases: each runs one fault against real processes on loopback and
returns one row of the battery's table (`bench/faults.py`); `tests/integration/
test_fault_battery.py` runs the same functions with smaller sizes and asserts 0 lost, 0
duplicated.

A row: fault, produced (sends attempted), acked (sends the client was told were written),
rows (in the target + quarantine Delta tables), lost (acked ids not in Delta), duplicated
(extra copies of any id), recovery_s (see each case), outcome (what the system said).
"""

from __future__ import annotations

import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from devstack.faults.kit import AckingProducer, Broker, Etcd, Pipeline, pipeline_config, poll, tally
from devstack.faults.hook import ENV_DELAY_MS, ENV_MARKERS, ENV_STEPS

PIPELINE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Sizes:
    """How many messages a case produces around its fault."""

    before: int = 300    # acknowledged before the fault
    after: int = 200     # acknowledged after recovery
    batch: int = 200     # pipeline max_messages_per_trigger
    register_ttl_s: int = 32  # the broker's registration lease (Danube's 32 s; tests use 3)
    fault_s: float = 10.0     # how long a timed fault (etcd down or slow, S3 failing) lasts
    send_rate_per_s: float | None = None  # pace of the producers that run through a fault (None: unpaced)


class Rig:
    """One case's world: a shared etcd, a fresh broker (local cloud dir) and a work dir."""

    def __init__(self, workdir: Path, etcd: Etcd, label: str, sizes: Sizes, cloud: dict | None = None,
                 storage: dict | None = None, broker_etcd: str | None = None) -> None:
        """`cloud`: the broker's wal_cloud.cloud (default: a local directory); `storage`: the
        pipeline's storage_url/storage_options for it; `broker_etcd`: the broker's etcd
        endpoint when it differs (a proxy)."""
        self.root = Path(workdir) / f"{label}-{uuid.uuid4().hex[:6]}"
        self.etcd = etcd
        self.label = label
        local = str(self.root / "cloud")
        self.storage = storage or {"storage_url": local}
        coordination = {"register_ttl_seconds": sizes.register_ttl_s}
        self.broker = Broker(self.root / "broker", broker_etcd or etcd.endpoint,
                             cloud or {"backend": "fs", "root": local}, coordination=coordination)
        self.topic = f"/default/{label}-{uuid.uuid4().hex[:8]}"
        self.sizes = sizes
        self.failures: list[str] = []

    def __enter__(self) -> "Rig":
        self.broker.start().wait_listening()
        return self

    def __exit__(self, *exc: object) -> None:
        self.broker.stop()

    def produce(self, count: int, deadline_s: float = 120.0) -> AckingProducer:
        producer = AckingProducer(self.broker.url, self.topic, limit=count).start()
        poll(producer.done, deadline_s, f"{count} sends to {self.topic}")
        return producer

    def produce_more(self, before: AckingProducer, count: int, deadline_s: float = 120.0) -> AckingProducer:
        """`count` more sends after `before`'s, ids continuing; the result holds all of them."""
        more = self.keep_producing(before, limit=len(before.sent) + count, paced=False)
        poll(more.done, deadline_s, f"{count} more sends to {self.topic}")
        return more

    def keep_producing(self, before: AckingProducer | None = None, limit: int | None = None,
                       paced: bool = True) -> AckingProducer:
        """A started producer sending until stopped (or `limit` sends in all), ids continuing
        after `before`'s; `paced`: at the case's `send_rate_per_s`."""
        rate = self.sizes.send_rate_per_s if paced else None
        more = AckingProducer(self.broker.url, self.topic, limit=limit, rate_per_s=rate)
        if before is not None:
            more.sent, more.acked, more.ack_times = list(before.sent), list(before.acked), list(before.ack_times)
        return more.start()

    def wait_for_rows(self, config: Path, producer: AckingProducer, pipes: list[Pipeline] | None = None) -> None:
        """Until the pipeline of `config` has committed rows: a fault then meets a running
        query, not one still starting (whose start would fail on the fault instead). A run in
        `pipes` that ends meanwhile fails the case with its log."""
        def committed() -> bool:
            for pipe in pipes or []:
                if pipe.process is not None and pipe.process.poll() is not None:
                    raise RuntimeError(f"pipeline {config} exited {pipe.process.returncode} before its "
                                       f"first batch: {pipe.log_tail()}")
            return self.tally(config, producer.sent, producer.acked)["rows"] > 0

        poll(committed, PIPELINE_TIMEOUT_S, f"first rows of {config.name} in Delta", 0.5)

    def pipeline_file(self, name: str, sizes: Sizes, etcd: str | None = None, **source: Any) -> Path:
        """A pipeline file in `<root>/<name>/`; the pipeline and its subscription get a unique
        name (the subscription lock is cluster-wide), read back with `edit_config`."""
        source = {**self.storage, **source}
        return pipeline_config(self.root / name, f"{name}-{uuid.uuid4().hex[:6]}", etcd or self.etcd.endpoint,
                               source.pop("storage_url"), self.topic, max_messages_per_trigger=sizes.batch, **source)

    def run(self, config: Path, env: dict | None = None, tag: str = "run") -> tuple[int, float, str]:
        """Run a pipeline once to its end: (exit code, seconds, log tail)."""
        started = time.monotonic()
        pipe = Pipeline(config, config.parent / f"{tag}.log", env).start()
        code = pipe.wait(PIPELINE_TIMEOUT_S)
        return code, time.monotonic() - started, pipe.log_tail(60)

    def run_supervised(self, config: Path, env: dict | None = None, tag: str = "run",
                       restarts: int = 3) -> tuple[int, float, str]:
        """Run a pipeline, restarted (as a supervisor would) while it fails with exit code 1,
        at most `restarts` times; each failure is kept in `self.failures` for the outcome."""
        for attempt in range(restarts + 1):
            code, seconds, log = self.run(config, env, f"{tag}-{attempt}" if attempt else tag)
            if code != 1:
                return code, seconds, log
            self.failures.append(_failure(log))
        return code, seconds, log

    def outcome(self, text: str) -> str:
        if not self.failures:
            return text
        return f"{text}; pipeline failed {len(self.failures)}x and was restarted ({'; '.join(self.failures)})"

    def tally(self, config: Path, produced: list[int], acked: list[int]) -> dict[str, int]:
        return tally(produced, acked, [config.parent / "target", config.parent / "quarantine"])


def _failure(log: str) -> str:
    """The first line that says why a pipeline run failed."""
    for marker in ("EOFException", "Error:", "ERROR pipelines"):
        line = next((text for text in log.splitlines() if marker in text), None)
        if line:
            return line.strip()[:160]
    return "exit 1"


def edit_config(config: Path, change: Callable[[dict], None] | None = None) -> dict:
    """Apply `change` to a pipeline file's content (if given); return the content."""
    data = yaml.safe_load(config.read_text())
    if change is not None:
        change(data)
        config.write_text(yaml.safe_dump(data))
    return data


def streaming(config: Path) -> Path:
    """Make a pipeline file's trigger processingTime (500 ms)."""
    edit_config(config, lambda d: d.update(trigger={"mode": "processingTime", "interval": "500 ms"}))
    return config


def row(fault: str, producer: AckingProducer, counts: dict, recovery_s: float | None, outcome: str) -> dict:
    return {"fault": fault, "produced": len(producer.sent), "acked": len(producer.acked), **counts,
            "recovery_s": None if recovery_s is None else round(recovery_s, 2), "outcome": outcome}


def broker_kill9(workdir: Path, etcd: Etcd, sizes: Sizes) -> dict:
    """kill -9 of the broker while the official client produces; restart on the same WAL dir
    and port; every acknowledged message must reach Delta once. recovery_s: restart -> first
    acknowledged send (goal <= 3 s)."""
    with Rig(workdir, etcd, "broker-kill", sizes) as rig:
        producer = rig.keep_producing()
        try:
            poll(lambda: len(producer.acked) >= sizes.before, 120, f"{sizes.before} acks before the kill")
            rig.broker.kill9()
            acked_at_kill = len(producer.acked)
            restarted = time.monotonic()
            rig.broker.start()
            first = poll(lambda: producer.first_ack_after(restarted), 120, "first ack after the restart")
            poll(lambda: len(producer.acked) >= acked_at_kill + sizes.after, 120, f"{sizes.after} acks after")
        finally:
            producer.stop()
        config = rig.pipeline_file("kill9", sizes)
        code, _, log = rig.run_supervised(config)
        if code != 0:
            raise RuntimeError(f"pipeline after broker kill -9 exited {code}: {log}")
        counts = rig.tally(config, producer.sent, producer.acked)
        return row("broker kill -9 while producing", producer, counts, first - restarted,
                   rig.outcome(f"{len(producer.sent) - len(producer.acked)} sends failed during the restart"))


def driver_kill9(workdir: Path, etcd: Etcd, sizes: Sizes, steps: tuple[str, ...]) -> dict:
    """The pipeline's driver SIGKILLed at each of `steps` of a batch (devstack.faults.hook),
    restarted until it completes. recovery_s: the last restart -> the pipeline done."""
    with Rig(workdir, etcd, "driver-kill", sizes) as rig:
        producer = rig.produce(sizes.before + sizes.after)
        config = rig.pipeline_file("driver", sizes)
        env = {ENV_STEPS: ",".join(steps), ENV_MARKERS: str(config.parent / "markers"), ENV_DELAY_MS: "200"}
        codes = []
        for attempt in range(len(steps) + 1):
            code, seconds, log = rig.run_supervised(config, env, tag=f"attempt-{attempt}")
            codes.append(code)
            if code == 0:
                break
            if code != -9:
                raise RuntimeError(f"pipeline attempt {attempt} exited {code}, not by the fault hook: {log}")
        fired = sorted(p.name for p in (config.parent / "markers").glob("*.fired"))
        if codes[-1] != 0 or len(fired) != len(steps):
            raise RuntimeError(f"exit codes {codes}, fired {fired}: {log}")
        counts = rig.tally(config, producer.sent, producer.acked)
        return row("driver kill -9 " + "+".join(steps), producer, counts, seconds, rig.outcome(f"exit codes {codes}"))


def checkpoint_deleted(workdir: Path, etcd: Etcd, sizes: Sizes) -> dict:
    """The checkpoint deleted after a run: the restart must refuse (CheckpointMismatchError),
    and following the error's advice (new name, its starting offsets) lands the rest once.
    recovery_s: the advised run's duration."""
    with Rig(workdir, etcd, "ckpt-deleted", sizes) as rig:
        producer = rig.produce(sizes.before)
        config = rig.pipeline_file("ckpt", sizes)
        code, _, log = rig.run_supervised(config, tag="first")
        assert code == 0, log
        shutil.rmtree(config.parent / "checkpoint")
        more = rig.produce_more(producer, sizes.after)
        code, _, log = rig.run(config, tag="refused")
        refusal = re.search(r"where the tables end: (\{.*?\})\.", log)
        if code != 1 or refusal is None:
            raise RuntimeError(f"a deleted checkpoint was not refused (exit {code}): {log}")
        def advice(data: dict) -> None:
            data["name"] += "-resumed"
            data["source"]["starting_offsets"] = refusal.group(1)

        edit_config(config, advice)
        code, seconds, log = rig.run_supervised(config, tag="advised")
        assert code == 0, log
        counts = rig.tally(config, more.sent, more.acked)
        return row("checkpoint deleted, restarted", more, counts, seconds,
                   rig.outcome("refused with CheckpointMismatchError; its advice resumed exactly"))


def same_subscription_twice(workdir: Path, etcd: Etcd, sizes: Sizes) -> dict:
    """The same pipeline started twice at once: one consumes, the other waits for the
    subscription lock and finds nothing left. recovery_s: the later one's end."""
    with Rig(workdir, etcd, "two-pipelines", sizes) as rig:
        producer = rig.produce(sizes.before + sizes.after)
        config = rig.pipeline_file("twice", sizes)
        started = time.monotonic()
        pipes = [Pipeline(config, config.parent / f"p{i}.log").start() for i in range(2)]
        codes = [p.wait(PIPELINE_TIMEOUT_S) for p in pipes]
        if 1 in codes:  # one failed: the supervisor restarts it once both are done
            rig.failures.append(_failure(pipes[codes.index(1)].log_tail(60)))
            codes.append(rig.run_supervised(config, tag="restart")[0])
            codes = [c for c in codes if c != 1]
        seconds = time.monotonic() - started
        if set(codes) != {0}:
            raise RuntimeError(f"exit codes {codes}: {pipes[0].log_tail()} {pipes[1].log_tail()}")
        counts = rig.tally(config, producer.sent, producer.acked)
        waited = sum("still locked" in p.log_path.read_text(errors="replace") for p in pipes)
        return row("two pipelines on one subscription", producer, counts, seconds,
                   rig.outcome(f"exit codes {codes}; {waited} waited for the lock"))


def lock_lease_lost(workdir: Path, etcd: Etcd, sizes: Sizes) -> dict:
    """The subscription lock's lease revoked under a running processingTime query: the query
    must stop with an error naming the lock; a restart lands everything once, and SIGTERM of
    the restarted pipeline releases the lock at once (not when its lease expires).
    recovery_s: restart -> every acknowledged message in Delta."""
    from connectors.subscription_lock import LOCK_TTL_S
    from danube_core.keys import subscription_lock_key
    from danube_core.metadata_etcd import EtcdMetadataStore

    with Rig(workdir, etcd, "lease-lost", sizes) as rig:
        producer = rig.produce(sizes.before)
        config = streaming(rig.pipeline_file("lease", sizes))
        lock_key = subscription_lock_key("/danube-data", edit_config(config)["source"]["subscription"])
        pipe = Pipeline(config, config.parent / "first.log").start()
        try:
            poll(lambda: rig.tally(config, producer.sent, producer.acked)["rows"] > 0, 300, "first rows in Delta")
            _revoke_lease_of(etcd.endpoint, lock_key)
            code = pipe.running.wait(120)
        finally:
            pipe.kill9()
        log = pipe.log_path.read_text(errors="replace")
        if code != 1 or "lost the subscription lock" not in log:
            raise RuntimeError(f"lost lock lease not reported (exit {code}): {pipe.log_tail(40)}")
        producer = rig.produce_more(producer, sizes.after)  # the restart has work of its own
        restart = Pipeline(config, config.parent / "second.log").start()
        restarted = time.monotonic()
        store = EtcdMetadataStore(etcd.endpoint)
        try:
            poll(lambda: rig.tally(config, producer.sent, producer.acked)["lost"] == 0, PIPELINE_TIMEOUT_S,
                 "everything in Delta", 0.5)
            seconds = time.monotonic() - restarted
            release_s, released = _sigterm_release_s(restart, store, etcd.endpoint, lock_key)
        finally:
            restart.kill9()
            store.close()
        counts = rig.tally(config, producer.sent, producer.acked)
        result = row("lock lease lost mid-query", producer, counts, seconds,
                     "query stopped: lost the subscription lock; the restart, SIGTERMed, "
                     + (f"released it and exited in {release_s:.1f}s" if released else
                        f"exited in {release_s:.1f}s WITHOUT releasing it (left to its {LOCK_TTL_S}s lease)"))
        return {**result, "lock_release_s": round(release_s, 2), "lock_released": released}


def _sigterm_release_s(pipe: Pipeline, store: Any, endpoint: str, lock_key: str) -> tuple[float, bool]:
    """SIGTERM a running pipeline: seconds until it exited, and whether it released its
    subscription lock (revoked the lock's lease) rather than leaving the lease to expire.

    Told apart without timing: from SIGTERM on, this process keeps the lock's lease alive
    itself (any client may refresh a lease), so the lease cannot expire while the pipeline
    stops; a lock key still there once the pipeline has exited was not released. A poller
    that compared the key's disappearance with the lease's remaining TTL misjudged when a
    loaded machine starved it.
    """
    import signal

    import pyetcd

    poll(lambda: store.get(lock_key) is not None, PIPELINE_TIMEOUT_S, f"lock {lock_key} held")
    host, port = endpoint.rsplit(":", 1)
    client = pyetcd.client(host=host, port=int(port))
    stop_keeping = threading.Event()
    try:
        lease_id = client.get(lock_key)[1].lease_id

        def keep_alive() -> None:  # the lease's TTL is 10 s; a refresh every 0.5 s
            while not stop_keeping.wait(0.5):
                try:
                    client.refresh_lease(lease_id)
                except Exception:  # revoked: nothing left to keep
                    return

        keeper = threading.Thread(target=keep_alive, name="lock-lease-keeper", daemon=True)
        client.refresh_lease(lease_id)
        keeper.start()
        sent = time.monotonic()
        pipe.running.send_signal(signal.SIGTERM)
        code = pipe.running.wait(120)
        exited = time.monotonic()
        released = client.get(lock_key)[0] is None
        stop_keeping.set()
        keeper.join(10)
    finally:
        stop_keeping.set()
        client.close()
    if code != 0:
        raise RuntimeError(f"pipeline exited {code} after SIGTERM: {pipe.log_tail(30)}")
    return exited - sent, released


def _revoke_lease_of(endpoint: str, key: str) -> None:
    import pyetcd

    host, port = endpoint.rsplit(":", 1)
    client = pyetcd.client(host=host, port=int(port))
    try:
        value, meta = client.get(key)
        if value is None or not meta.lease_id:
            raise RuntimeError(f"no leased lock at {key}")
        client.revoke_lease(meta.lease_id)
    finally:
        client.close()
