"""The broker's client port with the native front (`broker.grpc_front: native`, or `auto` where it was built).

Python's gRPC server spends about 300 µs of CPU on every unary call: more than the broker's
whole durable publish, so with it alone the publish rate was bound by the server, not by the
WAL. The native front (`broker._grpc_front`, Rust, `native/grpc_front`) listens on the client
port instead. It answers SendMessage itself from batches this module stores, and forwards every
other call, byte for byte, to the Python gRPC server, which now listens on a loopback port only.
So each service still has one implementation (`broker.grpc_services`), and a SendMessage is
stored and acknowledged exactly as there (`send_message`: durable acks wait for the fsync).

A thread waits on the front's queue (without the GIL) and hands each batch to the event loop,
one loop wake-up per batch rather than per call.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import grpc
from danube.proto import DanubeApi_pb2 as pb
from google.protobuf.message import DecodeError

from danube_core.errors import ConfigError

from broker.client_errors import InvalidRequestError
from broker.grpc_services import grpc_status, send_message
from broker.service import BrokerService

logger = logging.getLogger(__name__)

# What a broker without the native front gives up (bench/README.md, bench_ingest.py).
NATIVE_FRONT_COST = ("Python's gRPC server alone spends ~300 µs of CPU per SendMessage, "
                     "so publishes are ~3-4x slower (bench/README.md)")
NATIVE_FRONT_REMEDY = "reinstall danube-spark with cargo on PATH (https://rustup.rs), or install its wheel"

# Requests handed to the event loop at once: 64 sends in flight from each of several
# producers fit in one batch, and a batch stays short enough not to hold the loop for long.
BATCH_MAX = 512
# How long the queue thread waits for a request before checking whether the front closed.
POLL_SECONDS = 0.5


def use_native_front(grpc_front: str, source: str) -> bool:
    """Whether the client port gets the native front, for the configured `broker.grpc_front`.

    An install without cargo has no `broker._grpc_front`: "auto" then serves with Python's gRPC
    server and says so (once, the broker calls this at start), while an explicit "native" is a
    configuration this install cannot honour and stops the broker before it serves anything.
    """
    if grpc_front == "python":
        return False
    try:
        import broker._grpc_front  # noqa: F401  # the compiled extension, absent without cargo
    except ImportError as exc:
        if grpc_front == "native":
            raise ConfigError(
                f"config {source}: broker.grpc_front is 'native' but its extension broker._grpc_front is not "
                f"built ({exc}); {NATIVE_FRONT_REMEDY}, or set broker.grpc_front: auto (or python) to serve "
                f"with Python's gRPC server alone"
            ) from exc
        logger.warning("broker.grpc_front: auto: the native front's extension broker._grpc_front is not built "
                       "(%s); serving the client port with Python's gRPC server alone: %s; %s",
                       exc, NATIVE_FRONT_COST, NATIVE_FRONT_REMEDY)
        return False
    return True


class SendFront:
    """The native front on `bind`, forwarding all but SendMessage to `services` (host:port).

    Made only after `use_native_front` said yes, so its extension is there.
    """

    def __init__(self, service: BrokerService, bind: str, services: str, max_message_bytes: int,
                 grace_seconds: float, source: str) -> None:
        from broker._grpc_front import GrpcFront

        try:
            self._front = GrpcFront(bind, services, max_message_bytes, threads=1, grace=grace_seconds)
        except OSError as exc:
            raise ConfigError(f"config {source}: {exc} (port in use?)") from exc
        self._service = service
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task] = set()
        self._thread = threading.Thread(target=self._take_batches, name="send-front", daemon=True)
        self._thread.start()

    def _take_batches(self) -> None:
        while True:
            batch = self._front.next_batch(BATCH_MAX, POLL_SECONDS)
            if batch is None:
                return
            if batch:
                try:
                    self._loop.call_soon_threadsafe(self._dispatch, batch)
                except RuntimeError:  # the loop closed under a broker that stopped without close()
                    for ticket, _ in batch:
                        self._front.fail(ticket, grpc.StatusCode.UNAVAILABLE.value[0], "broker is stopping")
                    return

    def _dispatch(self, batch: list[tuple[int, bytes]]) -> None:
        for ticket, body in batch:
            task = self._loop.create_task(self._send(ticket, body))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, ticket: int, body: bytes) -> None:
        try:
            try:
                request = pb.StreamMessage.FromString(body)
            except DecodeError as exc:
                raise InvalidRequestError(f"SendMessage of {len(body)} bytes is not a StreamMessage: {exc}") from exc
            response = await send_message(self._service, request)
        except Exception as exc:  # every failure reaches the client as a status, as on the Python server
            code, details = grpc_status(exc)
            self._front.fail(ticket, code.value[0], details)
        else:
            self._front.reply(ticket, response.SerializeToString())

    async def close(self) -> None:
        """Stop listening; sends already taken are answered while the connections drain."""
        await asyncio.to_thread(self._front.close)
        await asyncio.to_thread(self._thread.join, POLL_SECONDS * 4)
