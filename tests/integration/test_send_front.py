"""The client port as clients meet it: the native front (`broker.send_front`, the default) answers
SendMessage itself and forwards every other call to the Python gRPC server; `grpc_front: python`
serves the same calls alone. Both store exactly what was sent, durably, in order.

The front's own edges (its size limit, its stop, an unreachable services server, bad arguments)
are tested on `GrpcFront` directly, with a real gRPC client and server around it.
"""

from __future__ import annotations

import asyncio
import glob
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
from danube import SubType
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeApi_pb2_grpc as pb_grpc

from broker._grpc_front import GrpcFront
from danube_core.frames import iter_messages
from danube_core.ports import free_port
from tests.integration.broker_process import (
    REPO_ROOT,
    BrokerProcess,
    expect_status,
    reliable_producer,
    running_broker,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SEND = "/danube.ProducerService/SendMessage"


@pytest.fixture(scope="module")
def broker(etcd_endpoint, tmp_path_factory):
    with running_broker(etcd_endpoint, tmp_path_factory, "send-front") as proc:
        yield proc


def _stored(wal_dir: str, topic: str) -> list[tuple[int, bytes]]:
    """(offset, payload) of every message in the topic's WAL files, in file order."""
    namespace, name = topic.strip("/").split("/")
    found = []
    for path in sorted(glob.glob(os.path.join(wal_dir, namespace, name, "wal*.log"))):
        found += [(ref.offset, msg.payload) for ref, msg in iter_messages(Path(path).read_bytes(), path)]
    return found


def _message(producer_id: int, topic: str, payload: bytes, request_id: int) -> pb.StreamMessage:
    return pb.StreamMessage(request_id=request_id, payload=payload, publish_time=1, producer_name="front-producer",
                            msg_id=pb.MsgID(producer_id=producer_id, topic_name=topic, broker_addr="x"))


async def _publish_and_consume(url: str, topic: str, count: int) -> list[bytes]:
    """`count` sends (32 in flight) and a consumer that receives them all: through the port's
    SendMessage, and through its forwarded Subscribe and streaming ReceiveMessages."""
    client, producer = await reliable_producer(url, topic, "front-producer")
    consumer = (client.new_consumer().with_topic(topic).with_consumer_name("front-consumer")
                .with_subscription("front-sub").with_subscription_type(SubType.EXCLUSIVE).build())
    await consumer.subscribe()
    queue = await consumer.receive()
    slots = asyncio.Semaphore(32)

    async def send(i: int) -> None:
        async with slots:
            await producer.send(f"m-{i}".encode(), {"i": str(i)})

    await asyncio.gather(*(send(i) for i in range(count)))
    received = []
    while len(received) < count:
        msg = await asyncio.wait_for(queue.get(), 30)
        received.append(msg.payload)
        await consumer.ack(msg)
    return received


def test_the_native_front_stores_every_send_in_order_and_forwards_consumers(broker, unique_name):
    topic = f"/default/{unique_name('front')}"
    received = asyncio.run(_publish_and_consume(broker.url, topic, 500))
    expected = {f"m-{i}".encode() for i in range(500)}
    assert sorted(received) == sorted(expected) and len(received) == 500
    stored = _stored(broker.wal_dir, topic)  # acks were durable: every acknowledged send is on disk
    assert [offset for offset, _ in stored] == list(range(500))
    assert {payload for _, payload in stored} == expected


def test_a_large_message_is_stored_and_delivered_through_the_front(broker, unique_name):
    topic = f"/default/{unique_name('large')}"
    payload = bytes(range(256)) * (3 * 1024 * 1024 // 256)  # 3 MiB: many HTTP/2 frames each way

    async def scenario() -> bytes:
        client, producer = await reliable_producer(broker.url, topic, "front-producer")
        consumer = (client.new_consumer().with_topic(topic).with_consumer_name("large-consumer")
                    .with_subscription("large-sub").with_subscription_type(SubType.EXCLUSIVE).build())
        await consumer.subscribe()
        queue = await consumer.receive()
        await producer.send(payload, None)
        msg = await asyncio.wait_for(queue.get(), 30)
        await consumer.ack(msg)
        return msg.payload

    assert asyncio.run(scenario()) == payload
    assert _stored(broker.wal_dir, topic) == [(0, payload)]


def test_a_compressed_send_goes_to_the_python_server_and_is_stored_in_order(broker, unique_name):
    topic = f"/default/{unique_name('gzip')}"

    async def scenario() -> None:
        _, producer = await reliable_producer(broker.url, topic, "front-producer")
        producer_id = producer._producers[0].producer_id
        address = broker.url.removeprefix("http://")
        async with grpc.aio.insecure_channel(address, compression=grpc.Compression.Gzip) as gzipped, \
                grpc.aio.insecure_channel(address) as plain:
            for i, channel in enumerate((plain, gzipped, plain)):
                response = await pb_grpc.ProducerServiceStub(channel).SendMessage(
                    _message(producer_id, topic, f"c-{i}".encode(), request_id=10 + i))
                assert response.request_id == 10 + i

    asyncio.run(scenario())
    assert _stored(broker.wal_dir, topic) == [(0, b"c-0"), (1, b"c-1"), (2, b"c-2")]


def test_a_send_that_is_not_a_stream_message_gets_invalid_argument(broker):
    async def scenario() -> None:
        async with grpc.aio.insecure_channel(broker.url.removeprefix("http://")) as channel:
            raw = channel.unary_unary(SEND, request_serializer=None, response_deserializer=None)
            await expect_status(grpc.StatusCode.INVALID_ARGUMENT, raw(b"\xff\xff\xff"),
                                "SendMessage of 3 bytes is not a StreamMessage")

    asyncio.run(scenario())


@pytest.mark.parametrize("front", ["native", "python"])
def test_either_front_serves_the_client_and_stops_cleanly(etcd_endpoint, tmp_path, unique_name, front):
    broker = BrokerProcess(etcd_endpoint, tmp_path, front, str(tmp_path / "cloud"), broker={"grpc_front": front}).start()
    topic = f"/default/{unique_name(front + '-front')}"
    try:
        received = asyncio.run(_publish_and_consume(broker.url, topic, 100))
        assert sorted(received) == sorted(f"m-{i}".encode() for i in range(100))
        assert [offset for offset, _ in _stored(broker.wal_dir, topic)] == list(range(100))
    finally:
        broker.stop()
    assert broker.process.returncode == 0, broker.log_tail()
    assert "Traceback" not in broker.log_tail(400) and "stopped" in broker.log_tail(5), broker.log_tail()


# ---- GrpcFront on its own ------------------------------------------------------------------


class _Services(pb_grpc.DiscoveryServicer):
    async def TopicLookup(self, request, context):
        return pb.TopicLookupResponse(request_id=request.request_id, broker_url="upstream")


async def _services_server() -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    pb_grpc.add_DiscoveryServicer_to_server(_Services(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def _answer_sends(front: GrpcFront, stop: threading.Event, answered: list[int]) -> threading.Thread:
    """A thread answering every SendMessage with its request id, as the broker does."""

    def run() -> None:
        while not stop.is_set():
            batch = front.next_batch(64, 0.1)
            if batch is None:
                return
            for ticket, body in batch:
                request = pb.StreamMessage.FromString(body)
                answered.append(request.request_id)
                front.reply(ticket, pb.MessageResponse(request_id=request.request_id).SerializeToString())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_the_front_answers_sends_and_forwards_other_calls():
    async def scenario() -> None:
        services, services_port = await _services_server()
        front = GrpcFront(f"127.0.0.1:{free_port()}", f"127.0.0.1:{services_port}", 1000)
        stop, answered = threading.Event(), []
        thread = _answer_sends(front, stop, answered)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
                sent = await pb_grpc.ProducerServiceStub(channel).SendMessage(_message(1, "/default/t", b"x", 7))
                assert sent.request_id == 7 and answered == [7]
                found = await pb_grpc.DiscoveryStub(channel).TopicLookup(pb.TopicLookupRequest(request_id=3))
                assert (found.request_id, found.broker_url) == (3, "upstream")
                await expect_status(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    pb_grpc.ProducerServiceStub(channel).SendMessage(
                                        _message(1, "/default/t", b"x" * 2000, 8)),
                                    "larger than the broker's limit of 1000 bytes")
                assert answered == [7]  # the oversized send never reached Python
        finally:
            stop.set()
            await asyncio.to_thread(front.close)
            thread.join(5)
            await services.stop(None)

    asyncio.run(scenario())


class _TinyFrameUpstream:
    """An HTTP/2 server that answers every request with `count` gRPC messages cut into 1-byte
    DATA frames, all written at once: the most small frames per byte a peer can send. Frames
    are raw (RFC 9113 §4, HPACK literals), since gRPC servers choose their own framing; the
    front's connection to its upstream must take them as the peer's framing, not a flood."""

    PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

    def __init__(self, count: int) -> None:
        self.count = count
        self.goaway: bytes | None = None  # the debug data of a GOAWAY the front sent, if any

    @staticmethod
    def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
        return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload

    def response(self, stream: int) -> bytes:
        status = b"\x88" + b"\x0f\x10" + bytes([16]) + b"application/grpc"  # :status 200, content-type
        body = b"".join(b"\x00" + len(m).to_bytes(4, "big") + m
                        for m in (pb.StreamMessage(request_id=i).SerializeToString() for i in range(self.count)))
        trailers = b"\x00\x0bgrpc-status\x010"
        return (self.frame(1, 0x4, stream, status) + b"".join(self.frame(0, 0, stream, body[i:i + 1]) for i in range(len(body)))
                + self.frame(1, 0x5, stream, trailers))

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            assert await reader.readexactly(len(self.PREFACE)) == self.PREFACE
            writer.write(self.frame(4, 0, 0))
            while True:
                header = await reader.readexactly(9)
                length, kind, flags = int.from_bytes(header[:3], "big"), header[3], header[4]
                stream = int.from_bytes(header[5:], "big") & 0x7FFF_FFFF
                payload = await reader.readexactly(length)
                if kind == 4 and not flags & 0x1:
                    writer.write(self.frame(4, 0x1, 0))  # SETTINGS ack
                elif kind == 6 and not flags & 0x1:
                    writer.write(self.frame(6, 0x1, 0, payload))  # PING ack
                elif kind == 1:
                    writer.write(self.response(stream))
                elif kind == 7:
                    self.goaway = payload[8:]
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def test_an_upstream_sending_many_tiny_data_frames_keeps_its_connection():
    """h2 counts small unread DATA frames against a budget and closes the connection past it
    (GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames"), failing every call on it: the broker's
    consumers saw their acks CANCELLED when a slow reader let its stream's frames pile up in the
    front. The front's connection to its own Python server must take whatever framing it sends."""
    count = 200  # about 2,000 one-byte frames, 20 times h2's default budget

    async def scenario() -> None:
        upstream = _TinyFrameUpstream(count)
        server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
        front = GrpcFront("127.0.0.1:0", f"127.0.0.1:{server.sockets[0].getsockname()[1]}", 1000)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
                for request_id in (1, 2):  # the second call on the same upstream connection
                    call = pb_grpc.ConsumerServiceStub(channel).ReceiveMessages(
                        pb.ConsumerRequest(request_id=request_id))
                    received = [m.request_id async for m in call]
                    assert received == list(range(count)), (await call.code(), await call.details())
            assert upstream.goaway is None
        finally:
            await asyncio.to_thread(front.close)
            server.close()

    asyncio.run(scenario())


def test_an_unreachable_services_server_is_unavailable_naming_it():
    async def scenario() -> None:
        front = GrpcFront("127.0.0.1:0", f"127.0.0.1:{free_port()}", 1000)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
                await expect_status(grpc.StatusCode.UNAVAILABLE,
                                    pb_grpc.DiscoveryStub(channel).TopicLookup(pb.TopicLookupRequest(request_id=1)),
                                    "broker services unreachable")
        finally:
            await asyncio.to_thread(front.close)

    asyncio.run(scenario())


def test_closing_answers_queued_sends_unavailable_and_lets_taken_ones_finish():
    """Sends Python never saw were not stored: UNAVAILABLE, so the client may retry them. A send
    Python had taken is answered by Python during the grace, not refused under it."""

    async def scenario() -> None:
        front = GrpcFront("127.0.0.1:0", "127.0.0.1:1", 1000, grace=5.0)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            stub = pb_grpc.ProducerServiceStub(channel)
            taken_call = asyncio.ensure_future(stub.SendMessage(_message(1, "/default/t", b"a", 1)))
            taken = []
            while not taken:
                taken = await asyncio.to_thread(front.next_batch, 1, 0.1)
            queued_call = asyncio.ensure_future(stub.SendMessage(_message(1, "/default/t", b"b", 2)))
            while front.queued() < 1:  # the second send waits in the front's queue
                await asyncio.sleep(0.02)
            closing = asyncio.ensure_future(asyncio.to_thread(front.close))
            await expect_status(grpc.StatusCode.UNAVAILABLE, queued_call, "broker is stopping")
            ticket, body = taken[0]
            assert front.reply(ticket, pb.MessageResponse(request_id=1).SerializeToString())
            assert (await taken_call).request_id == 1
            await closing
        assert front.next_batch(1, 0.0) is None
        with pytest.raises(OSError):  # no longer listening
            socket.create_connection(("127.0.0.1", front.port), timeout=1).close()

    asyncio.run(scenario())


def test_bad_arguments_name_what_was_expected():
    with pytest.raises(ValueError, match="threads must be at least 1"):
        GrpcFront("127.0.0.1:0", "127.0.0.1:1", 1000, threads=0)
    with pytest.raises(ValueError, match="grace -1: expected seconds >= 0"):
        GrpcFront("127.0.0.1:0", "127.0.0.1:1", 1000, grace=-1.0)
    front = GrpcFront("127.0.0.1:0", "127.0.0.1:1", 1000)
    try:
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{front.port}"):
            GrpcFront(f"127.0.0.1:{front.port}", "127.0.0.1:1", 1000)
        with pytest.raises(ValueError, match="timeout inf: expected seconds >= 0"):
            front.next_batch(1, float("inf"))
        with pytest.raises(ValueError, match="gRPC status 0: expected an error code 1..16"):
            front.fail(1, 0, "ok is not a failure")
        assert front.fail(12345, 13, "nobody waits for this ticket") is False
    finally:
        front.close()


def test_a_taken_client_port_stops_the_broker_with_a_message_naming_it(etcd_endpoint, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        broker = BrokerProcess(etcd_endpoint, tmp_path, "taken", str(tmp_path / "cloud"), port=port)
        done = subprocess.run([sys.executable, "-m", "broker", "--config", str(broker.config_path)],
                              cwd=broker.workdir, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and str(broker.config_path) in done.stderr


def test_a_client_sending_many_tiny_data_frames_keeps_its_connection():
    """The same h2 budget on the front's side facing clients: a client's small frames (its many
    acks) wait unread while the front is busy, here while its upstream has not answered yet.
    The front must not close the connection (GOAWAY ENHANCE_YOUR_CALM) and fail every call on it."""
    frame = _TinyFrameUpstream.frame

    async def scenario() -> None:
        silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # accepts, never answers
        front = GrpcFront("127.0.0.1:0", f"127.0.0.1:{silent.sockets[0].getsockname()[1]}", 1000)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
            path = b"/danube_api.ConsumerService/Ack"
            headers = (b"\x83\x86" + b"\x04" + bytes([len(path)]) + path  # :method POST, :scheme http, :path
                       + b"\x01\x09127.0.0.1" + b"\x0f\x10" + bytes([16]) + b"application/grpc")
            body = b"\x00" + (2000).to_bytes(4, "big") + b"\x00" * 2000
            writer.write(_TinyFrameUpstream.PREFACE + frame(4, 0, 0) + frame(1, 0x4, 1, headers)
                         + b"".join(frame(0, 0, 1, body[i:i + 1]) for i in range(len(body))))
            await writer.drain()
            goaway = None
            try:
                while goaway is None:
                    header = await asyncio.wait_for(reader.readexactly(9), 3.0)
                    payload = await reader.readexactly(int.from_bytes(header[:3], "big"))
                    if header[3] == 7:
                        goaway = payload[8:]
            except asyncio.TimeoutError:
                pass  # three quiet seconds: the front kept the connection
            assert goaway is None, f"the front closed the connection: GOAWAY {goaway!r}"
            writer.close()
        finally:
            await asyncio.to_thread(front.close)
            silent.close()

    asyncio.run(scenario())
