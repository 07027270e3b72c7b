"""Errors the broker reports to its clients, each tied to one gRPC status code.

The broker's logic raises these; only `broker.grpc_services` turns them into gRPC statuses
(by `status_name`, so this module needs no gRPC import). The codes are chosen for what the
official clients do with them: `UNAVAILABLE` makes danube-client look the topic up again and
retry (a topic that moved, or was just created), every other code is reported to the caller.
"""

from __future__ import annotations

from danube_core import errors as status
from danube_core.errors import StatusError


class ClientError(StatusError):
    """Base: a request that cannot be served; `status_name` is a `grpc.StatusCode` name."""


class InvalidRequestError(ClientError, status.InvalidRequestError):
    """Malformed request: invalid topic name, missing field, unknown subscription type."""


class MessageTooLargeError(InvalidRequestError):
    """Payload above the topic's `max_message_size` policy; nothing was stored."""


class NotFoundError(ClientError, status.NotFoundError):
    """Unknown namespace, topic, producer, consumer or subscription."""


class AlreadyExistsError(ClientError):
    """Creating something that exists (a topic, a namespace)."""

    status_name = "ALREADY_EXISTS"


class ConflictError(ClientError, status.FailedPreconditionError):
    """The request contradicts the current state: an Exclusive subscription held by another
    consumer, a producer asking for another dispatch strategy than the topic has."""


class LimitExceededError(ClientError, status.ResourceExhaustedError):
    """A namespace policy limit (producers, subscriptions, consumers) is reached."""


class TopicMovedError(ClientError, status.UnavailableError):
    """The topic is not served here (moved, unloading, or not assigned yet): look it up again."""
