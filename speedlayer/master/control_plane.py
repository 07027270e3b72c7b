"""`ControlPlaneService.EventStream` (seed §5, §9.2): one worker's bidirectional stream.

The first message must be a RegisterEvent; a follower (or a leader losing its lease) answers
UNAVAILABLE naming the leader. Afterwards a reader thread handles the worker's events while
this handler yields what the master queues for the worker. The stream is closed when three
heartbeat intervals pass without a heartbeat; gRPC keepalive pings (server options in
`protocol.master_rpc`) detect half-open connections.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, Iterator

import grpc

from danube_core.errors import DanubeError

from speedlayer.api.v1 import control_plane_service_pb2 as cp
from speedlayer.api.v1 import control_plane_service_pb2_grpc as cp_grpc
from speedlayer.errors import InvalidRequestError, SpeedLayerError
from speedlayer.master.leader_gate import abort_with
from speedlayer.master.worker_streams import CLOSE, WorkerSession
from speedlayer.master.workers import WorkerDirectory

logger = logging.getLogger(__name__)


class ControlPlaneServicer(cp_grpc.ControlPlaneServiceServicer):
    """`leader()` returns the leader's (directory, sync) or raises NotLeaderError."""

    def __init__(self, leader: Callable[[], tuple[WorkerDirectory, Callable[[WorkerSession], None]]]) -> None:
        self._leader = leader

    def EventStream(self, request_iterator: Iterator[cp.EventStreamMessage],
                    context: grpc.ServicerContext) -> Iterator[cp.EventStreamMessage]:
        try:
            first = next(request_iterator)
        except StopIteration:
            return
        try:
            directory, sync = self._leader()
            if first.WhichOneof("payload") != "register_event":
                raise InvalidRequestError("the first EventStream message must be a RegisterEvent")
            session = directory.register(first)
        except SpeedLayerError as exc:
            abort_with(context, exc)
            return
        except DanubeError as exc:  # etcd trouble: the worker retries
            context.abort(grpc.StatusCode.UNAVAILABLE, f"registration failed: {exc}")
            return
        context.add_callback(session.close)
        session.send(registration_ack=cp.RegistrationAckEvent(
            heartbeat_interval_seconds=directory.heartbeat_interval_s, lease_ttl_seconds=directory.lease_ttl_s))
        sync(session)
        reader = threading.Thread(target=self._read, args=(request_iterator, session, directory),
                                  name=f"stream-{session.tenant}-{session.worker_id}", daemon=True)
        reader.start()
        try:
            yield from self._write(session)
        finally:
            directory.disconnected(session)

    @staticmethod
    def _write(session: WorkerSession) -> Iterator[cp.EventStreamMessage]:
        while True:
            try:
                item = session.outgoing.get(timeout=session.heartbeat_interval_s / 2)
            except queue.Empty:
                item = None
            if item is CLOSE:
                return
            if session.overdue():
                logger.warning("worker %s/%s missed 3 heartbeats; closing its stream", *session.key,
                               extra={"tenant_id": session.tenant, "worker_id": session.worker_id})
                return
            if item is not None:
                yield item

    @staticmethod
    def _read(requests: Iterator[cp.EventStreamMessage], session: WorkerSession,
              directory: WorkerDirectory) -> None:
        try:
            for message in requests:
                kind = message.WhichOneof("payload")
                try:
                    if kind == "heartbeat_event":
                        session.send(heartbeat_ack=directory.heartbeat(session, message))
                    elif kind == "data_pull_status_update":
                        directory.pull_status(session, message)
                    else:
                        logger.warning("unexpected %s from worker %s", kind, session.worker_id)
                except SpeedLayerError as exc:
                    logger.error("event %s of worker %s refused: %s", kind, session.worker_id, exc)
                except DanubeError as exc:
                    if not exc.retriable:  # e.g. the worker's lease is gone: make it register again
                        logger.warning("closing the stream of %s: %s", session.worker_id, exc)
                        break
                    logger.warning("event %s of worker %s not handled: %s", kind, session.worker_id, exc)
        except grpc.RpcError:
            pass  # the stream ended under us
        finally:
            session.close()
