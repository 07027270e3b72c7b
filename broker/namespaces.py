"""Namespaces in etcd (spec §5.4): existence, policies and the topic index.

A namespace exists when `/namespaces/{ns}/policy` exists. Namespaces created at boot get the
broker's configured policies; namespaces created through the admin get all zeros, including
`max_message_size: 0` (unlimited), as Danube's admin does. The topic index
`/namespaces/{ns}/topics/{ns}/{topic}` = null is the only record of which topics (and
partitions) a namespace holds.

The broker hands these classes a store whose reads come from its local cache: a key another
process wrote moments ago may not be there yet, so an answer "absent" is confirmed against
etcd (`present`) before anything is decided on it.
"""

from __future__ import annotations

import builtins
import logging

from danube_core.keys import (
    namespace_policy_key,
    namespace_topic_key,
    namespace_topics_prefix,
    topic_from_namespace_index_key,
    topic_policy_key,
)
from danube_core.metadata import MetadataStore
from danube_core.records import Policies
from danube_core.topics import TopicName

from broker.client_errors import AlreadyExistsError, InvalidRequestError, NotFoundError

logger = logging.getLogger(__name__)

ADMIN_POLICIES = Policies(max_message_size=0)


def check_namespace_name(namespace: str) -> None:
    """InvalidRequestError unless the name is usable as the first part of a topic name."""
    if not namespace or not all(ch.isalnum() or ch in "_-" for ch in namespace):
        raise InvalidRequestError(
            f"invalid namespace name {namespace!r}: expected Unicode letters, digits, '_' and '-'"
        )


def present(metadata: MetadataStore, key: str) -> bool:
    """Whether `key` exists; a cached "no" is confirmed after the cache caught up with etcd."""
    if metadata.get(key) is not None:
        return True
    metadata.sync_reads()
    return metadata.get(key) is not None


class Namespaces:
    """Namespace records over a metadata store."""

    def __init__(self, metadata: MetadataStore) -> None:
        self._metadata = metadata

    def exists(self, namespace: str) -> bool:
        return present(self._metadata, namespace_policy_key(namespace))

    def ensure(self, namespace: str, policies: Policies) -> bool:
        """Create the namespace with `policies` unless it exists; True if it was created."""
        check_namespace_name(namespace)
        created = self._metadata.put_if_absent(namespace_policy_key(namespace), policies.to_json())
        if created:
            logger.info("namespace %s created with policies %s", namespace, policies)
        return created

    def create(self, namespace: str, policies: Policies = ADMIN_POLICIES) -> None:
        """Admin create: AlreadyExistsError if it exists."""
        if not self.ensure(namespace, policies):
            raise AlreadyExistsError(f"namespace {namespace!r} already exists")

    def require(self, namespace: str) -> None:
        """NotFoundError naming the key if the namespace does not exist."""
        if not self.exists(namespace):
            raise NotFoundError(
                f"namespace {namespace!r} does not exist ({namespace_policy_key(namespace)} is missing); "
                "create it first (python -m broker.admin namespaces create ...)"
            )

    def policies(self, namespace: str) -> Policies:
        key = namespace_policy_key(namespace)
        raw = self._metadata.get(key)
        if raw is None and present(self._metadata, key):
            raw = self._metadata.get(key)
        if raw is None:
            raise NotFoundError(f"namespace {namespace!r} does not exist ({key} is missing)")
        return Policies.from_json(raw, key)

    def topic_policies(self, topic: TopicName) -> Policies:
        """`/topics{T}/policy` if present (never written by Danube), else the namespace's."""
        key = topic_policy_key(topic)
        raw = self._metadata.get(key)
        return Policies.from_json(raw, key) if raw is not None else self.policies(topic.namespace)

    def list(self) -> list[str]:
        """Every namespace name, sorted."""
        names = set()
        for key, _ in self._metadata.get_prefix("/namespaces/", keys_only=True):
            parts = key.split("/")
            if len(parts) == 4 and parts[3] == "policy":
                names.add(parts[2])
        return sorted(names)

    def topics(self, namespace: str) -> builtins.list[TopicName]:  # `list` is the method above
        """Every indexed topic and partition of the namespace, sorted by name."""
        rows = self._metadata.get_prefix(namespace_topics_prefix(namespace), keys_only=True)
        return [topic_from_namespace_index_key(key) for key, _ in rows]

    def has_topic(self, topic: TopicName) -> bool:
        return present(self._metadata, namespace_topic_key(topic))

    def delete(self, namespace: str) -> None:
        """Delete an empty namespace; InvalidRequestError if it still holds topics."""
        self.require(namespace)
        remaining = self.topics(namespace)
        if remaining:
            raise InvalidRequestError(
                f"namespace {namespace!r} still holds {len(remaining)} topic(s), e.g. {remaining[0]}; delete them first"
            )
        self._metadata.delete(namespace_policy_key(namespace))
