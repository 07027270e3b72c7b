"""The broker's one entry point to reliable-topic storage.

The gRPC services and cluster coordination only load, get, unload and delete topics here; the
engine owns the object store, the key layout and the settings every `ReliableTopicStorage`
needs, so they are configured in one place (`StorageSettings`, mirroring the broker's
`wal_cloud` config block). It also tells a load where a dead previous owner kept its WAL
(`wal_location`), so the WAL tail that broker acknowledged is recovered, not lost.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from danube_core.errors import MetadataError
from danube_core.keys import DEFAULT_ROOT_PREFIX, StorageKeys, broker_state_key
from danube_core.metadata import MetadataStore
from danube_core.objectstore import ObjectStore, normalize_url
from danube_core.records import BrokerState, SealedState
from danube_core.topics import TopicName
from danube_core.wal_files import list_segments

from broker.option_scope import OptionScope
from broker.topic_storage import ReliableTopicStorage, TopicClosedError, delete_topic_keys
from broker.wal import WalConfig

logger = logging.getLogger(__name__)

_STORAGE_OPTION = OptionScope("storage option")


@dataclass(frozen=True)
class StorageSettings:
    """Storage configuration of a broker.

    `cloud_url`/`cloud_options`: object store root and fsspec options (`wal_cloud.cloud`);
    `root_prefix`: etcd storage root, pasted into keys exactly as given (§5.2);
    `uploader_interval_s`, `max_object_bytes` (None: no cap): the uploader (§4.4);
    `retention_*`: local WAL retention (§3.7); None turns a rule off.
    """

    wal: WalConfig
    cloud_url: str
    cloud_options: dict[str, Any] = field(default_factory=dict)
    root_prefix: str = DEFAULT_ROOT_PREFIX
    uploader_interval_s: float = 30.0
    max_object_bytes: int | None = None
    retention_max_age_s: float | None = None
    retention_max_total_bytes: int | None = None
    retention_check_interval_s: float = 300.0

    def __post_init__(self) -> None:
        require = _STORAGE_OPTION.require
        require(bool(self.cloud_url), "cloud_url", self.cloud_url, "an object store URL or directory")
        require(self.uploader_interval_s > 0, "uploader_interval_s", self.uploader_interval_s, "seconds > 0")
        require(self.max_object_bytes is None or self.max_object_bytes > 0, "max_object_bytes",
                self.max_object_bytes, "None (no cap) or bytes > 0")
        require(self.retention_max_age_s is None or self.retention_max_age_s >= 0, "retention_max_age_s",
                self.retention_max_age_s, "None (off) or seconds >= 0")
        require(self.retention_max_total_bytes is None or self.retention_max_total_bytes >= 0,
                "retention_max_total_bytes", self.retention_max_total_bytes, "None (off) or bytes >= 0")
        require(self.retention_check_interval_s > 0, "retention_check_interval_s",
                self.retention_check_interval_s, "seconds > 0")


def _scheme(url: str) -> str:
    return normalize_url(url).split("://", 1)[0]


def _topic(topic: TopicName | str) -> TopicName:
    return topic if isinstance(topic, TopicName) else TopicName.parse(topic)


class StorageEngine:
    """The reliable topics one broker (`broker_id`) owns. Thread-safe."""

    def __init__(self, settings: StorageSettings, metadata: MetadataStore, broker_id: int) -> None:
        self.settings = settings
        self.broker_id = broker_id
        self.metadata = metadata
        self.store = ObjectStore(settings.cloud_url, settings.cloud_options)
        self.keys = StorageKeys(settings.root_prefix)
        self._lock = threading.Lock()
        self._topics: dict[TopicName, ReliableTopicStorage] = {}

    def load_topic(self, topic: TopicName | str) -> ReliableTopicStorage:
        """Load `topic` here (idempotent: a loaded topic is returned as it is)."""
        name = _topic(topic)
        with self._lock:
            storage = self._topics.get(name)
            if storage is None:
                s = self.settings
                storage = ReliableTopicStorage.load(
                    name, broker_id=self.broker_id, wal_config=s.wal, store=self.store,
                    metadata=self.metadata, keys=self.keys, uploader_interval_s=s.uploader_interval_s,
                    max_object_bytes=s.max_object_bytes, retention_max_age_s=s.retention_max_age_s,
                    retention_max_total_bytes=s.retention_max_total_bytes,
                    retention_check_interval_s=s.retention_check_interval_s,
                    locate_wal=self.wal_location,
                )
                self._topics[name] = storage
            return storage

    def wal_location(self, broker_id: int) -> tuple[str, dict[str, Any]] | None:
        """Where broker `broker_id` keeps its WAL, even after it died: the `wal_url` of its
        (unleased) broker state, with the cloud options if it is on the object store's protocol.
        None if it recorded none (an older broker, or a state written by Danube)."""
        key = broker_state_key(broker_id)
        raw = self.metadata.get(key)
        try:
            url = BrokerState.from_json(raw, key).wal_url if raw is not None else None
        except MetadataError as exc:  # malformed, not unavailable: it must not block the load
            logger.error("cannot tell where broker %d kept its WAL: %s", broker_id, exc)
            return None
        if url is None:
            return None
        same = _scheme(url) == _scheme(self.settings.cloud_url)
        return url, dict(self.settings.cloud_options) if same else {}

    def get(self, topic: TopicName | str) -> ReliableTopicStorage | None:
        """The loaded topic, or None if this broker does not serve it."""
        with self._lock:
            return self._topics.get(_topic(topic))

    def topics(self) -> list[TopicName]:
        with self._lock:
            return sorted(self._topics, key=str)

    def unload_topic(self, topic: TopicName | str) -> SealedState | None:
        """Seal and hand over `topic` (see `ReliableTopicStorage.unload`).

        A failed unload leaves the topic registered (refusing appends) so it can be retried.
        """
        name = _topic(topic)
        storage = self.get(name)
        if storage is None:
            raise TopicClosedError(f"topic {name} is not loaded on broker {self.broker_id}")
        state = storage.unload(self.broker_id)
        with self._lock:
            self._topics.pop(name, None)
        return state

    def seal_local_wal(self, topic: TopicName | str) -> SealedState | None:
        """Seal `topic`, which this broker does not serve, from the WAL it still holds of it:
        load it (the WAL continues after every frame on disk), upload what the descriptors lack,
        and unload (the sealed state names the last offset). None, and nothing done, when this
        broker holds no WAL file of it. For a broker that restarts on its own data and finds a
        topic of its own moved away meanwhile: without the seal, the next owner would continue
        after the last uploaded offset and hand out again offsets this broker acknowledged."""
        name = _topic(topic)
        wal = self.settings.wal
        directory = os.path.join(wal.root, name.namespace, name.topic)
        if not os.path.isdir(directory) or not list_segments(directory, file_name=wal.file_name):
            return None
        logger.warning("%s was moved away from broker %d while it was down; sealing the WAL it holds",
                       name, self.broker_id)
        self.load_topic(name)
        return self.unload_topic(name)

    def close_topic(self, topic: TopicName | str) -> None:
        """Stop serving `topic` as a crash would, but cleanly: flushed, not sealed, files kept
        (its next owner recovers them). Nothing to do if it is not loaded."""
        with self._lock:
            storage = self._topics.pop(_topic(topic), None)
        if storage is not None:
            storage.close()

    def delete_topic(self, topic: TopicName | str) -> None:
        """Delete `topic`'s storage keys and cursors (and its local WAL if loaded here)."""
        name = _topic(topic)
        with self._lock:
            storage = self._topics.pop(name, None)
        if storage is not None:
            storage.delete()
        else:
            delete_topic_keys(self.metadata, self.keys, name)

    def close(self) -> None:
        """Close every topic without sealing (a broker shutdown that is not a drain)."""
        with self._lock:
            topics, self._topics = list(self._topics.values()), {}
        for storage in topics:
            try:
                storage.close()
            except Exception:  # close the others regardless
                logger.exception("closing %s failed", storage.topic)
