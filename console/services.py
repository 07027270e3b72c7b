"""What the console's pages read from, wired once per process: the etcd view (one cache), the
readers that turn its keys into rows, the WAL tails, the object store, the pipeline files and
the lag history.

Every page reads the cache, never etcd; storage, Delta logs and metrics endpoints are read by
the one page that shows them, at most one page of messages or one Delta log tail per request.
"""

from __future__ import annotations

import logging
from typing import Callable

from danube_core.keys import StorageKeys
from danube_core.metadata import MetadataStore
from danube_core.objectstore import ObjectStore
from danube_core.topics import TopicName
from speedlayer.keys import SpeedLayerKeys

from console.brokers import BrokersReader
from console.config import ConsoleConfig
from console.etcd_view import EtcdView, console_prefixes
from console.lag_history import LagHistory, LagSampler
from console.pipelines_view import PipelineFile, load_pipelines
from console.speedlayer_view import SpeedLayerReader
from console.topics import KeyReader, TopicsReader, all_subscriptions
from console.wal_tail import WalTail, WalTailReader

logger = logging.getLogger(__name__)


class ConsoleServices:
    """`start()` connects in the background and returns at once; `close()` stops it all."""

    def __init__(self, config: ConsoleConfig, connect: Callable[[], MetadataStore] | None = None,
                 sample_lag: bool = True) -> None:
        self.config = config
        self.speedlayer_keys = SpeedLayerKeys(config.speedlayer.key_root)
        self.etcd = EtcdView(config.etcd, console_prefixes(config.root_prefix, self.speedlayer_keys), connect)
        self.storage_keys = StorageKeys(config.root_prefix)
        self.store = ObjectStore(config.storage_url, dict(config.storage_options))
        self.brokers = BrokersReader()
        self.wal_tails = WalTailReader()
        self.topics = TopicsReader(config.root_prefix, self._wal_tail)
        self.speedlayer = SpeedLayerReader(self.speedlayer_keys)
        self.pipelines: list[PipelineFile] = load_pipelines(config.pipelines, config.pipeline_env)
        self.lag_history = LagHistory(config.history_samples)
        self._sampler = LagSampler(self.lag_history, self._subscriptions, config.history_interval_s) \
            if sample_lag else None

    def start(self) -> "ConsoleServices":
        self.etcd.start()
        if self._sampler is not None:
            self._sampler.start()
        return self

    def _wal_tail(self, cache: KeyReader, topic: TopicName, owner: int | None) -> WalTail:
        return self.wal_tails.read(self.brokers.wal_url(cache, owner), topic)

    def _subscriptions(self):
        cache = self.etcd.cache
        return list(all_subscriptions(self.topics, cache)) if cache is not None else []

    def pipeline(self, name: str) -> PipelineFile | None:
        return next((p for p in self.pipelines if p.name == name), None)

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()
        self.etcd.close()
