"""Danube's client gRPC API (`DanubeApi.proto`, package `danube`) served over `BrokerService`.

The generated stubs come with the official client (`danube.proto`): we serve exactly what
danube-client 0.5 calls. ProducerService (CreateProducer, SendMessage), ConsumerService
(Subscribe, ReceiveMessages, Ack, Nack), Discovery (TopicLookup, TopicPartitions) and
HealthCheck; the SchemaRegistry service is `broker.schema_service`. Wire conversions live
here (spec §8.2: SendMessage is stored as sent, except the offset; `subscription_name` always
becomes Some(value)). Broker errors become gRPC statuses by
their `status_name`; any other DanubeError becomes UNAVAILABLE when retriable (so clients
retry) and INTERNAL otherwise; unexpected exceptions are logged and reported as INTERNAL.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, AsyncIterator, Callable

import grpc
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeApi_pb2_grpc as pb_grpc

from danube_core.errors import DanubeError
from danube_core.message import MessageID, StreamMessage

from broker.client_errors import ClientError, InvalidRequestError
from broker.service import BrokerService

logger = logging.getLogger(__name__)


def to_stream_message(proto: pb.StreamMessage) -> StreamMessage:
    """Proto → stored message exactly as the broker converts it (§8.2)."""
    if not proto.HasField("msg_id"):
        raise InvalidRequestError(f"message with request_id {proto.request_id} has no msg_id")
    mid = proto.msg_id
    return StreamMessage(
        request_id=proto.request_id,
        msg_id=MessageID(producer_id=mid.producer_id, topic_name=mid.topic_name,
                         broker_addr=mid.broker_addr, topic_offset=mid.topic_offset),
        payload=proto.payload,
        publish_time=proto.publish_time,
        producer_name=proto.producer_name,
        subscription_name=proto.subscription_name,
        attributes=dict(sorted(proto.attributes.items())),
        schema_id=proto.schema_id if proto.HasField("schema_id") else None,
        schema_version=proto.schema_version if proto.HasField("schema_version") else None,
    )


def to_proto(msg: StreamMessage) -> pb.StreamMessage:
    """Stored message → what consumers receive (`topic_offset` = its offset)."""
    mid = msg.msg_id
    proto = pb.StreamMessage(
        request_id=msg.request_id,
        msg_id=pb.MsgID(producer_id=mid.producer_id, topic_name=mid.topic_name,
                        broker_addr=mid.broker_addr, topic_offset=mid.topic_offset),
        payload=msg.payload,
        publish_time=msg.publish_time,
        producer_name=msg.producer_name,
        subscription_name=msg.subscription_name or "",
        attributes=msg.attributes,
    )
    if msg.schema_id is not None:
        proto.schema_id = msg.schema_id
    if msg.schema_version is not None:
        proto.schema_version = msg.schema_version
    return proto


def grpc_status(error: Exception) -> tuple[grpc.StatusCode, str]:
    """The status and details a client receives for `error`."""
    if isinstance(error, ClientError):
        return grpc.StatusCode[error.status_name], str(error)
    if isinstance(error, DanubeError):
        code = grpc.StatusCode.UNAVAILABLE if error.retriable else grpc.StatusCode.INTERNAL
        return code, str(error)
    logger.exception("unexpected error serving a request", exc_info=error)
    return grpc.StatusCode.INTERNAL, f"internal broker error: {type(error).__name__}: {error}"


def translated(method: Callable) -> Callable:
    """Turn broker errors raised by a unary handler into the matching gRPC status."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except Exception as exc:  # every failure must reach the client as a status, never crash
            code, details = grpc_status(exc)
            await context.abort(code, details)

    return wrapper


async def send_message(service: BrokerService, request: pb.StreamMessage) -> pb.MessageResponse:
    """SendMessage, whichever front received it (this server or `broker.send_front`)."""
    await service.send(to_stream_message(request))
    return pb.MessageResponse(request_id=request.request_id)


class ProducerService(pb_grpc.ProducerServiceServicer):
    def __init__(self, service: BrokerService) -> None:
        self._service = service

    @translated
    async def CreateProducer(self, request: pb.ProducerRequest, context: Any) -> pb.ProducerResponse:
        schema_subject = request.schema_ref.subject if request.HasField("schema_ref") else None
        producer_id = await self._service.create_producer(
            request.topic_name, request.producer_name, request.producer_access_mode, request.dispatch_strategy,
            schema_subject or None)
        return pb.ProducerResponse(request_id=request.request_id, producer_id=producer_id,
                                   producer_name=request.producer_name)

    @translated
    async def SendMessage(self, request: pb.StreamMessage, context: Any) -> pb.MessageResponse:
        return await send_message(self._service, request)


class ConsumerService(pb_grpc.ConsumerServiceServicer):
    def __init__(self, service: BrokerService) -> None:
        self._service = service

    @translated
    async def Subscribe(self, request: pb.ConsumerRequest, context: Any) -> pb.ConsumerResponse:
        consumer_id = await self._service.subscribe(
            request.topic_name, request.consumer_name, request.subscription, request.subscription_type)
        return pb.ConsumerResponse(request_id=request.request_id, consumer_id=consumer_id,
                                   consumer_name=request.consumer_name)

    async def ReceiveMessages(self, request: pb.ReceiveRequest, context: Any) -> AsyncIterator[pb.StreamMessage]:
        try:
            messages = self._service.stream(request.consumer_id)
        except Exception as exc:  # reported as a status before the first message
            code, details = grpc_status(exc)
            await context.abort(code, details)
            return
        async for msg in messages:
            yield to_proto(msg)

    @translated
    async def Ack(self, request: pb.AckRequest, context: Any) -> pb.AckResponse:
        if not request.HasField("msg_id"):
            raise InvalidRequestError(f"ack with request_id {request.request_id} has no msg_id")
        await self._service.ack(request.msg_id.topic_name, request.subscription_name, request.msg_id.topic_offset)
        return pb.AckResponse(request_id=request.request_id)

    @translated
    async def Nack(self, request: pb.NackRequest, context: Any) -> pb.NackResponse:
        if not request.HasField("msg_id"):
            raise InvalidRequestError(f"nack with request_id {request.request_id} has no msg_id")
        delay_ms = request.delay_ms if request.HasField("delay_ms") else 0
        await self._service.nack(request.msg_id.topic_name, request.subscription_name,
                                 request.msg_id.topic_offset, delay_ms)
        return pb.NackResponse(request_id=request.request_id)


class DiscoveryService(pb_grpc.DiscoveryServicer):
    def __init__(self, service: BrokerService) -> None:
        self._service = service

    @translated
    async def TopicLookup(self, request: pb.TopicLookupRequest, context: Any) -> pb.TopicLookupResponse:
        found = await self._service.lookup(request.topic)
        kind = pb.TopicLookupResponse.Connect if found.connect else pb.TopicLookupResponse.Redirect
        return pb.TopicLookupResponse(request_id=request.request_id, response_type=kind,
                                      broker_url=found.broker_url, connect_url=found.connect_url,
                                      proxy=found.broker_url != found.connect_url)

    @translated
    async def TopicPartitions(self, request: pb.TopicLookupRequest, context: Any) -> pb.TopicPartitionsResponse:
        names = await self._service.partitions(request.topic)
        return pb.TopicPartitionsResponse(request_id=request.request_id, partitions=names)


class HealthCheckService(pb_grpc.HealthCheckServicer):
    def __init__(self, service: BrokerService) -> None:
        self._service = service

    @translated
    async def HealthCheck(self, request: pb.HealthCheckRequest, context: Any) -> pb.HealthCheckResponse:
        if request.client == pb.HealthCheckRequest.Producer:
            healthy = self._service.producer_healthy(request.id)
        elif request.client == pb.HealthCheckRequest.Consumer:
            healthy = self._service.consumer_healthy(request.id)
        else:
            raise InvalidRequestError(f"health check client type {request.client}: expected 0 Producer or 1 Consumer")
        status = pb.HealthCheckResponse.OK if healthy else pb.HealthCheckResponse.CLOSE
        return pb.HealthCheckResponse(status=status)


def add_services(server: grpc.aio.Server, service: BrokerService) -> None:
    """Register the four client services on `server`."""
    pb_grpc.add_ProducerServiceServicer_to_server(ProducerService(service), server)
    pb_grpc.add_ConsumerServiceServicer_to_server(ConsumerService(service), server)
    pb_grpc.add_DiscoveryServicer_to_server(DiscoveryService(service), server)
    pb_grpc.add_HealthCheckServicer_to_server(HealthCheckService(service), server)
