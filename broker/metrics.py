"""The broker's Prometheus metrics, served on `broker.ports.prometheus` (Danube's `prom_exporter`).

Names are Danube v0.7.3's (`danube-broker/src/broker_metrics.rs`), so dashboards written for a
Danube broker read ours: topics owned, messages and bytes in, producers, subscriptions and
consumers per topic, leader election state, and `danube_subscription_lag_messages`. Danube
labels every series with `broker` (its id) and its lag only with `subscription`; ours adds
`topic`, since one subscription name is usually taken on every partition of a topic.

Everything is read when Prometheus scrapes (a custom collector), from what the broker holds
anyway: the publish path counts nothing more. Lag is measured for the reliable topics served
here, for every subscription with a cursor, the data source's (`connectors`) included: the topic's
next offset minus the cursor's (inclusive) offset plus one, the cursor taken from the broker's
own acks if newer than etcd's. The data source also writes into its subscription record what it
measured itself (`lag`: bytes, publish-time milliseconds, every ~10 s while its query runs); those
are exported as `danube_subscription_lag_bytes` and `..._lag_seconds` when present. Subscription
keys come from the lookup cache, which holds the served topics' keys: a scrape reads no etcd.

Labels are bounded by the topics this broker serves and their subscriptions: never offsets,
message ids, producers or consumers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from danube_core.errors import DanubeError
from danube_core.keys import parse_subscription_key, subscriptions_prefix
from danube_core.records import load_json, parse_cursor

if TYPE_CHECKING:
    from broker.service import BrokerService
    from broker.topic import Topic

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubscriptionLag:
    """How far one subscription of one served topic is behind its head."""

    topic: str
    subscription: str
    messages: int
    bytes: int | None = None     # as the data source last measured it
    seconds: float | None = None  # publish time of the newest message minus that of the last read


class BrokerCollector(Collector):
    """The metrics of one broker, read from its `BrokerService` at each scrape."""

    def __init__(self, service: BrokerService, broker_id: int, is_leader: Callable[[], bool]) -> None:
        self._service = service
        self._broker = str(broker_id)
        self._is_leader = is_leader

    def describe(self) -> list[Metric]:
        """The families without samples: registering reads nothing from the service."""
        return list(self._families().values())

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        broker = self._broker
        topics = list(self._service.topics.values())  # the event loop adds and drops topics
        families["leader"].add_metric([broker], 1.0 if self._is_leader() else 0.0)
        families["owned"].add_metric([broker], len(topics))
        for topic in topics:
            name = topic.name.broker_name
            load = topic.load()
            families["messages_in"].add_metric([broker, name], load.messages_in)
            families["bytes_in"].add_metric([broker, name], load.bytes_in)
            families["producers"].add_metric([broker, name], load.producer_count)
            families["consumers"].add_metric([broker, name], load.consumer_count)
            families["subscriptions"].add_metric([broker, name], load.subscription_count)
            for sub in list(topic.subscriptions.values()):
                families["sub_consumers"].add_metric([broker, name, sub.name], len(sub.consumers))
            for lag in self._lags(topic):
                labels = [broker, lag.topic, lag.subscription]
                families["lag_messages"].add_metric(labels, lag.messages)
                if lag.bytes is not None:
                    families["lag_bytes"].add_metric(labels, lag.bytes)
                if lag.seconds is not None:
                    families["lag_seconds"].add_metric(labels, lag.seconds)
        yield from families.values()

    def _lags(self, topic: Topic) -> list[SubscriptionLag]:
        if topic.storage is None:  # NonReliable: nothing is kept, nothing is behind
            return []
        try:
            keys = self._service.registry.metadata.get_prefix(subscriptions_prefix(topic.name))
            return subscription_lags(topic, topic.storage.next_offset, keys)
        except DanubeError as exc:  # the rest of the scrape still answers
            logger.warning("no subscription lag for %s: %s", topic.name, exc)
            return []

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
        by_broker, by_topic, by_sub = ["broker"], ["broker", "topic"], ["broker", "topic", "subscription"]
        return {
            "leader": GaugeMetricFamily("danube_leader_election_state",
                                        "Leader election state of this broker (0=follower,1=leader)", labels=by_broker),
            "owned": GaugeMetricFamily("danube_broker_topics_owned", "Total number of topics served by broker",
                                       labels=by_broker),
            "messages_in": CounterMetricFamily("danube_topic_messages_in", "Total messages published to the topic "
                                               "(since it was loaded on this broker)", labels=by_topic),
            "bytes_in": CounterMetricFamily("danube_topic_bytes_in", "Total bytes published to the topic (since it "
                                            "was loaded on this broker)", labels=by_topic),
            "producers": GaugeMetricFamily("danube_topic_active_producers", "Total number of producers per topic",
                                           labels=by_topic),
            "consumers": GaugeMetricFamily("danube_topic_active_consumers", "Total number of consumers per topic",
                                           labels=by_topic),
            "subscriptions": GaugeMetricFamily("danube_topic_active_subscriptions",
                                               "Total number of subscriptions per topic", labels=by_topic),
            "sub_consumers": GaugeMetricFamily("danube_subscription_active_consumers",
                                               "Total number of active consumers per subscription", labels=by_sub),
            "lag_messages": GaugeMetricFamily("danube_subscription_lag_messages", "Number of messages the "
                                              "subscription is behind the topic WAL head", labels=by_sub),
            "lag_bytes": GaugeMetricFamily("danube_subscription_lag_bytes", "Bytes the subscription is behind, as "
                                           "the data source last measured them", labels=by_sub),
            "lag_seconds": GaugeMetricFamily("danube_subscription_lag_seconds", "Publish time of the newest message "
                                             "minus that of the last one read, as the data source last measured "
                                             "it", labels=by_sub),
        }


def subscription_lags(topic: Topic, head: int, keys: list[tuple[str, bytes]]) -> list[SubscriptionLag]:
    """The lag of each subscription of `topic` with a cursor behind `head` (the offset the next
    message gets), from its subscription keys (records and cursors, `subscriptions_prefix`) and
    the broker's own newer acks."""
    cursors: dict[str, int] = {}
    measured: dict[str, dict] = {}
    for key, raw in keys:
        name, is_cursor = parse_subscription_key(topic.name, key)
        if is_cursor:
            cursors[name] = parse_cursor(raw, key)
        else:
            record = load_json(raw, key)
            lag = record.get("lag") if isinstance(record, dict) else None
            measured[name] = lag if isinstance(lag, dict) else {}
    for sub in list(topic.subscriptions.values()):
        acked = sub.acked_offset
        if acked is not None and acked > cursors.get(sub.name, -1):
            cursors[sub.name] = acked
    lags = []
    for name, cursor in sorted(cursors.items()):
        own = measured.get(name, {})
        ms = own.get("ms")
        lags.append(SubscriptionLag(topic.name.broker_name, name, max(0, head - (cursor + 1)), own.get("bytes"),
                                    None if ms is None else ms / 1000.0))
    return lags


def broker_registry(collector: BrokerCollector) -> CollectorRegistry:
    """What a broker's `/metrics` serves: its collector and the process's CPU and memory, in a
    registry of their own (not the process-wide default, which a test process shares)."""
    registry = CollectorRegistry()
    registry.register(collector)
    ProcessCollector(registry=registry)
    return registry


class MetricsServer:
    """The broker's `/metrics` endpoint on `host:port`, until `close()`."""

    def __init__(self, collector: BrokerCollector, host: str, port: int) -> None:
        self.registry = broker_registry(collector)
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)
