"""The worker's control agent (seed §5): one EventStream to whichever master leads.

Registers (address, capacity, the epochs it already holds), heartbeats at the interval the
master's ack names, loads assigned plans one at a time on a loader thread and reports
`DataPullStatusUpdate` (IN_PROGRESS, then COMPLETED with rows, bytes and seconds, or FAILED
with the reason). When the stream breaks it backs off exponentially (capped, jittered) and
reconnects: to the leader a follower names in its UNAVAILABLE, else to the next master. Told
to DRAIN, it stops taking work and exits once the master has moved all its epochs away.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import grpc

from speedlayer.api.v1 import control_plane_service_pb2 as cp
from speedlayer.api.v1 import control_plane_service_pb2_grpc as cp_grpc
from speedlayer.config import WorkerConfig
from speedlayer.tail_spec import TailSpec
from speedlayer.observability.metrics import EPOCHS_HELD, LOAD_SECONDS, LOADED_ROWS
from speedlayer.protocol.master_rpc import MAX_RECONNECT_BACKOFF_S, WORKER_CHANNEL_OPTIONS, leader_hint
from speedlayer.worker.epochs import HeldTables
from speedlayer.worker.loader import EpochLoader, LoadResult, quote
from speedlayer.worker.serving import ServedDatasets
from speedlayer.worker.tails import WorkerTails

logger = logging.getLogger(__name__)

Status = cp.DataPullStatusUpdateEvent


@dataclass
class HeldEpoch:
    dataset: str
    epoch: str
    table: str
    status: cp.DataPullStatusUpdateEvent.Status = Status.IN_PROGRESS
    rows: int = 0
    bytes: int = 0
    version: int = -1
    tail: str = ""  # the plan's tail spec (JSON), when the dataset serves its topic's tail


class WorkerAgent:
    """One worker's control agent. `config.address` is what it registers for the gateway (the
    process passes the address its Flight service bound). `loader` and `served` are shared
    with that service (its queries read the DuckDB the loader fills, the epochs `served`
    publishes); by default the agent makes its own, from `config`."""

    def __init__(self, config: WorkerConfig, *, loader: EpochLoader | None = None,
                 served: ServedDatasets | None = None, tails: WorkerTails | None = None) -> None:
        self.config = config
        self.loader = loader if loader is not None else EpochLoader(
            memory_limit_bytes=config.memory_bytes, threads=config.threads, storage_options=config.storage_options)
        # What queries see: an epoch is published here only once COMPLETED (READY).
        self.served = served if served is not None else ServedDatasets(drop_table=self.loader.drop)
        self.held: dict[tuple[str, str], HeldEpoch] = {}
        self.tails = tails if tails is not None else WorkerTails(cursor=self.loader.cursor)
        self.tables = HeldTables(self.loader.cursor)
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loader")
        self._stop = threading.Event()
        self._outgoing: queue.Queue | None = None
        self.draining = False
        self._target = config.masters[0]
        self._extra = {"tenant_id": config.tenant, "worker_id": config.worker_id}

    def stop(self) -> None:
        self._stop.set()
        outgoing = self._outgoing
        if outgoing is not None:
            outgoing.put(None)

    def run(self) -> None:
        backoff, index = 0.1, 0
        while not self._stop.is_set():
            registered = False
            try:
                registered = self._session(self._target)
            except grpc.RpcError as exc:
                leader, retry_ms = leader_hint(exc)
                if leader:
                    self._target = leader
                    backoff = max(backoff, retry_ms / 1000)
                else:
                    index = (index + 1) % len(self.config.masters)
                    self._target = self.config.masters[index]
                logger.warning("stream to master ended (%s: %s); next: %s", exc.code().name, exc.details(),
                               self._target, extra=self._extra)
            if registered:
                backoff = 0.1
            if self._stop.wait(backoff * random.uniform(0.5, 1.0)):
                break
            backoff = min(backoff * 2, MAX_RECONNECT_BACKOFF_S)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _message(self, **payload: Any) -> cp.EventStreamMessage:
        """A message carrying `payload`, one field of its `payload` oneof (the protobuf
        constructor checks the field and its type)."""
        return cp.EventStreamMessage(tenant_id=self.config.tenant, worker_id=self.config.worker_id, **payload)

    def _register_event(self) -> cp.EventStreamMessage:
        with self._lock:
            held = [cp.HeldEpoch(dataset_id=h.dataset, epoch_id=h.epoch, status=h.status, rows=h.rows, bytes=h.bytes)
                    for h in self.held.values()]
        capacity = cp.WorkerCapacity(memory_bytes=self.config.memory_bytes, cpu_cores=self.config.cpu_cores)
        # The Prometheus endpoint listens on loopback (observability.metrics.serve_metrics): the
        # console on this host scrapes its tail figures through the address registered here.
        metrics = f"127.0.0.1:{self.config.metrics_port}" if self.config.metrics_port else ""
        return self._message(register_event=cp.RegisterEvent(address=self.config.address, capacity=capacity,
                                                             held_epochs=held, metrics_address=metrics))

    def _session(self, target: str) -> bool:
        """One stream; True if the master acknowledged the registration."""
        outgoing: queue.Queue = queue.Queue()
        outgoing.put(self._register_event())
        self._outgoing = outgoing
        stop_beats = threading.Event()

        def requests():
            while (item := outgoing.get()) is not None:
                yield item

        registered = False
        with grpc.insecure_channel(target, options=WORKER_CHANNEL_OPTIONS) as channel:
            responses = cp_grpc.ControlPlaneServiceStub(channel).EventStream(requests())
            try:
                for message in responses:
                    if self._stop.is_set():
                        break
                    kind = message.WhichOneof("payload")
                    if kind == "registration_ack":
                        registered = True
                        logger.info("registered with master %s", target, extra=self._extra)
                        self._start_heartbeats(outgoing, message.registration_ack.heartbeat_interval_seconds, stop_beats)
                    elif kind == "data_assignment":
                        self._assigned(message.data_assignment)
                    elif kind == "data_unassignment":
                        self._unassigned(message.data_unassignment)
                    elif kind == "heartbeat_ack":
                        self._heartbeat_ack(message.heartbeat_ack)
            finally:
                stop_beats.set()
                outgoing.put(None)
                responses.cancel()
        return registered

    def _start_heartbeats(self, outgoing: queue.Queue, interval_s: int, stop: threading.Event) -> None:
        def beat() -> None:
            while not stop.wait(max(interval_s, 1)):
                status = cp.ResourceStatus(memory_used_bytes=self.loader.memory_bytes())
                outgoing.put(self._message(heartbeat_event=cp.HeartbeatEvent(status=status)))

        threading.Thread(target=beat, name="heartbeat", daemon=True).start()

    def _send(self, **payload: Any) -> None:
        outgoing = self._outgoing
        if outgoing is not None:
            outgoing.put(self._message(**payload))

    def _assigned(self, event: cp.DataAssignmentEvent) -> None:
        key = (event.dataset_id, event.epoch_id)
        with self._lock:
            held = self.held.get(key)
            if held is not None and held.status in (Status.IN_PROGRESS, Status.COMPLETED):
                if held.status == Status.COMPLETED:
                    self._report(held)
                return
            self.held[key] = HeldEpoch(event.dataset_id, event.epoch_id, event.load_plan.destination_table_name,
                                       version=_plan_version(event.load_plan), tail=event.load_plan.tail)
        self._executor.submit(self._load, event)

    def _load(self, event: cp.DataAssignmentEvent) -> None:
        key = (event.dataset_id, event.epoch_id)
        extra = {**self._extra, "epoch_id": event.epoch_id, "dataset_id": event.dataset_id}
        self._send(data_pull_status_update=Status(dataset_id=event.dataset_id, epoch_id=event.epoch_id,
                                                  status=Status.IN_PROGRESS))
        base_parts = self._base_parts(event)
        try:
            result = self._load_tables(event, base_parts)
        except Exception as exc:  # any failure is reported to the master with its reason
            logger.error("loading %s/%s failed: %s", *key, exc, extra=extra)
            if base_parts is not None:
                self.tables.release_parts(base_parts)
            with self._lock:
                self.held.pop(key, None)
            self._send(data_pull_status_update=Status(dataset_id=event.dataset_id, epoch_id=event.epoch_id,
                                                      status=Status.FAILED, error_message=f"{type(exc).__name__}: {exc}"))
            return
        LOAD_SECONDS.observe(result.seconds)
        LOADED_ROWS.labels(dataset=event.dataset_id, epoch=event.epoch_id).set(result.rows)
        with self._lock:
            held = self.held.get(key)
            if held is not None:
                held.status, held.rows, held.bytes = Status.COMPLETED, result.rows, result.bytes
            EPOCHS_HELD.set(sum(h.status == Status.COMPLETED for h in self.held.values()))
            if held is not None:  # still wanted: queries may see it from now on
                self._publish(held)
        if held is None:  # unassigned while loading
            self.tables.drop(key)
            return
        logger.info("epoch %s/%s READY%s: %d rows, %d bytes in %.2fs", *key,
                    f" (+{len(event.load_plan.source.delta.added_files)} files on {event.load_plan.base_epoch_id})"
                    if base_parts is not None else "", result.rows, result.bytes, result.seconds, extra=extra)
        self._send(data_pull_status_update=Status(
            dataset_id=event.dataset_id, epoch_id=event.epoch_id, status=Status.COMPLETED, rows=result.rows,
            bytes=result.bytes, seconds=result.seconds, memory_bytes=result.memory_bytes))

    def _base_parts(self, event: cp.DataAssignmentEvent) -> tuple[str, ...] | None:
        """The pinned tables of the plan's base epoch if this worker holds it READY (then only
        the added files are loaded), else None (the full file list is loaded)."""
        base = event.load_plan.base_epoch_id
        if not base or event.load_plan.source.WhichOneof("source_type") != "delta":
            return None
        with self._lock:
            held = self.held.get((event.dataset_id, base))
            if held is None or held.status != Status.COMPLETED:
                return None
            return self.tables.acquire_base((event.dataset_id, base))

    def _load_tables(self, event: cp.DataAssignmentEvent, base_parts: tuple[str, ...] | None) -> LoadResult:
        """Load the epoch's tables; its relation exists only once they are all complete."""
        plan, key = event.load_plan, (event.dataset_id, event.epoch_id)
        if base_parts is None:
            result = self.loader.load(plan)
            self.tables.add_full(key, plan.destination_table_name)
            return result
        part = plan.destination_table_name + "__added"
        result = self.loader.load(plan, files=list(plan.source.delta.added_files), table_name=part)
        tables = self.tables.add_increment(key, plan.destination_table_name, base_parts, part)
        rows = self.loader.cursor().execute(f"SELECT count(*) FROM {quote(tables.relation)}").fetchone()[0]
        return replace(result, rows=rows)

    def _publish(self, held: HeldEpoch) -> None:
        """THE swap (called under the agent's lock, once the epoch is held whole): make the epoch
        queryable. Queries resolve a dataset to its newest published epoch (by source version),
        so publishing a newer one moves them all forward at once, while a running query keeps
        the epoch it pinned; the epoch's tables are released through `HeldTables` (shared
        parts stay while another epoch reads them)."""
        key = (held.dataset, held.epoch)
        tables = self.tables.get(key)
        if tables is None:
            return
        def publish() -> object:
            return self.served.publish(held.dataset, held.epoch, tables.relation, version=held.version,
                                       release=lambda: self.tables.drop(key))

        if not held.tail:
            publish()
            return
        try:
            spec = TailSpec.from_json(held.tail)
        except ValueError as exc:  # a master's bug, not the epoch's: serve the epoch alone
            logger.error("epoch %s/%s: its tail spec is unreadable (%s); served without its tail", *key, exc)
            publish()
            return
        # The hand-over: the epoch and the offsets it holds, in one step with the answers' pins.
        self.tails.publish_with_tail(held.dataset, held.epoch, spec, publish)

    def _report(self, held: HeldEpoch) -> None:
        self._send(data_pull_status_update=Status(dataset_id=held.dataset, epoch_id=held.epoch,
                                                  status=Status.COMPLETED, rows=held.rows, bytes=held.bytes))

    def _unassigned(self, event: cp.DataUnassignmentEvent) -> None:
        with self._lock:
            held = self.held.pop((event.dataset_id, event.epoch_id), None)
            empty = not self.held
        if held is not None and held.status == Status.COMPLETED:
            # Queries still reading the epoch keep it; its tables are released when the last ends.
            retired = self.tails.unpublish_with_tail(held.dataset, held.epoch,
                                                     lambda: self.served.retire(held.dataset, held.epoch))
            if not retired:
                self.tables.drop((held.dataset, held.epoch))
        logger.info("epoch %s/%s dropped (%s)", event.dataset_id, event.epoch_id, event.reason, extra=self._extra)
        if self.draining and empty:
            logger.info("drained: exiting", extra=self._extra)
            self.stop()

    def _heartbeat_ack(self, ack: cp.HeartbeatAckEvent) -> None:
        if ack.requested_action == cp.HeartbeatAckEvent.DRAIN and not self.draining:
            self.draining = True
            logger.warning("asked to DRAIN: epochs are moving away", extra=self._extra)
            with self._lock:
                empty = not self.held
            if empty:
                self.stop()


def _plan_version(plan: cp.LoadPlan) -> int:
    """The source table version an epoch holds (Delta version), -1 when the source has none."""
    if plan.source.WhichOneof("source_type") == "delta":
        return plan.source.delta.version
    return -1
