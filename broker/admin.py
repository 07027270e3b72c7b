"""Admin CLI over the cluster's etcd: what the seeds' workflows need.

    python -m broker.admin [--etcd HOST:PORT [--etcd-* ...] | --config conf/broker.yaml] [--root-prefix P] COMMAND

    namespaces list | create NS | delete NS
    topics list NS                          each topic with its delivery and owning broker
    topics create /ns/t [--partitions N] [--delivery reliable|non-reliable]
    topics subscriptions /ns/t              subscription records and cursors
    topics unload /ns/t                     seed 003's move: the owner seals, the leader reassigns
    topics delete /ns/t                     a partitioned base deletes every partition
    topics storage /ns/t                    descriptors, cur pointer, sealed state and cursors
                                            (of each partition, for a partitioned base name)

Like Danube's admin it only writes metadata; the leader and the owning broker react through
their watches. Output is one JSON object per line. A secured etcd takes the `--etcd-*` flags
of `danube_core.etcd_cli` (TLS files, user; the password from $DANUBE_ETCD_PASSWORD or
`--etcd-password-file`); `--config` takes all of it from the broker's `meta_store` instead.
`--root-prefix` (default: the config's `wal_cloud.uploader.root_prefix`, else `/danube-data`)
locates the storage keys. Exit codes:
0 done; 1 refused (unknown topic, namespace exists, ...: stderr says why); 2 bad arguments;
3 etcd unreachable.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from danube_core.errors import ConfigError, DanubeError, InvalidTopicNameError, MetadataUnavailableError
from danube_core.etcd_cli import add_etcd_flags, connection_flags_given, etcd_settings_from_args
from danube_core.keys import DEFAULT_ROOT_PREFIX, StorageKeys, parse_object_key
from danube_core.metadata import MetadataStore
from danube_core.etcd_settings import EtcdSettings
from danube_core.records import NON_RELIABLE, RELIABLE, CurPointer, ObjectDescriptor, SealedState
from danube_core.topics import TopicName

from broker.config import load_config
from broker.namespaces import Namespaces
from broker.topics_registry import TopicRegistry

DELIVERIES = {"reliable": RELIABLE, "non-reliable": NON_RELIABLE}
DEFAULT_ETCD = "127.0.0.1:2379"


def _emit(out: TextIO, **fields: Any) -> None:
    out.write(json.dumps(fields, sort_keys=True) + "\n")


class Admin:
    """The commands, over one metadata store."""

    def __init__(self, metadata: MetadataStore, root_prefix: str, out: TextIO) -> None:
        self.metadata = metadata
        self.registry = TopicRegistry(metadata)
        self.namespaces: Namespaces = self.registry.namespaces
        self.storage_keys = StorageKeys(root_prefix)
        self.out = out

    def namespaces_list(self) -> None:
        for name in self.namespaces.list():
            _emit(self.out, namespace=name, policies=self.namespaces.policies(name).to_value())

    def namespaces_create(self, namespace: str) -> None:
        self.namespaces.create(namespace)
        _emit(self.out, created=namespace)

    def namespaces_delete(self, namespace: str) -> None:
        self.namespaces.delete(namespace)
        _emit(self.out, deleted=namespace)

    def topics_list(self, namespace: str) -> None:
        topics = self.registry.list(namespace)
        owners = self.registry.owners(topics)
        for topic in topics:
            _emit(self.out, topic=topic.broker_name, delivery=self.registry.delivery(topic), owner=owners[topic])

    def topics_create(self, topic: TopicName, partitions: int, delivery: str) -> None:
        if partitions:
            created = self.registry.create_partitioned(topic, partitions, DELIVERIES[delivery])
        else:
            self.registry.create(topic, DELIVERIES[delivery])
            created = [topic]
        for name in created:
            _emit(self.out, created=name.broker_name, delivery=DELIVERIES[delivery])

    def topics_subscriptions(self, topic: TopicName) -> None:
        for name, entry in sorted(self.registry.subscriptions(topic).items()):
            record = entry["record"]
            _emit(self.out, subscription=name, cursor=entry["cursor"],
                  record=record.to_value() if record is not None else None)

    def topics_unload(self, topic: TopicName) -> None:
        owner = self.registry.unload(topic)
        _emit(self.out, unloaded=topic.broker_name, from_broker=owner)

    def topics_delete(self, topic: TopicName) -> None:
        for name in self.registry.delete(topic):
            _emit(self.out, deleted=name.broker_name)

    def topics_storage(self, topic: TopicName) -> None:
        """Every storage key of the topic, decoded, then its cursors; a partitioned base name
        lists each partition in turn (every row names its `topic`)."""
        for target in self.registry.inspection_targets(topic, self.storage_keys):
            self._topic_storage(target)

    def _topic_storage(self, topic: TopicName) -> None:
        name = topic.broker_name
        for key, raw in self.metadata.get_prefix(self.storage_keys.objects_prefix(topic)):
            if parse_object_key(key) is None:
                _emit(self.out, topic=name, kind="cur", key=key, value=CurPointer.from_json(raw, key).to_value())
            else:
                _emit(self.out, topic=name, kind="descriptor", key=key,
                      value=ObjectDescriptor.from_json(raw, key).to_value())
        state_key = self.storage_keys.state_key(topic)
        state = self.metadata.get(state_key)
        _emit(self.out, topic=name, kind="sealed_state", key=state_key,
              value=SealedState.from_json(state, state_key).to_value() if state is not None else None)
        for subscription, entry in sorted(self.registry.subscriptions(topic).items()):
            _emit(self.out, topic=name, kind="cursor", subscription=subscription, value=entry["cursor"])


def _topic(text: str) -> TopicName:
    try:
        return TopicName.parse(text)
    except InvalidTopicNameError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m broker.admin", description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--config", help="take the etcd settings and root prefix from a broker config")
    add_etcd_flags(parser, default=DEFAULT_ETCD, endpoints_group=where)
    parser.add_argument("--root-prefix", help=f"storage etcd root (default {DEFAULT_ROOT_PREFIX})")
    groups = parser.add_subparsers(dest="group", required=True)
    ns = groups.add_parser("namespaces").add_subparsers(dest="command", required=True)
    ns.add_parser("list")
    for command in ("create", "delete"):
        ns.add_parser(command).add_argument("namespace")
    topics = groups.add_parser("topics").add_subparsers(dest="command", required=True)
    topics.add_parser("list").add_argument("namespace")
    create = topics.add_parser("create")
    create.add_argument("topic", type=_topic)
    create.add_argument("--partitions", type=int, default=0, help="create /ns/t-part-0..N-1 (0: one topic)")
    create.add_argument("--delivery", choices=sorted(DELIVERIES), default="reliable")
    for command in ("subscriptions", "unload", "delete", "storage"):
        topics.add_parser(command).add_argument("topic", type=_topic)
    return parser


def _etcd_and_prefix(args: argparse.Namespace) -> tuple[EtcdSettings, str]:
    """With `--config`, the broker's own etcd settings (TLS, user and password included)."""
    if args.config:
        given = connection_flags_given(args)
        if given:
            raise ConfigError(f"{', '.join(given)}: not with --config, whose meta_store holds the etcd settings")
        config = load_config(args.config)
        return config.meta_store.etcd, args.root_prefix or config.uploader.root_prefix
    return etcd_settings_from_args(args), args.root_prefix or DEFAULT_ROOT_PREFIX


def _dispatch(admin: Admin, args: argparse.Namespace) -> None:
    method = getattr(admin, f"{args.group}_{args.command}")
    if args.group == "namespaces":
        method(*([args.namespace] if args.command != "list" else []))
    elif args.command == "list":
        method(args.namespace)
    elif args.command == "create":
        method(args.topic, args.partitions, args.delivery)
    else:
        method(args.topic)


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    args = _parser().parse_args(argv)
    try:
        etcd, root_prefix = _etcd_and_prefix(args)
        with etcd.connect() as metadata:
            _dispatch(Admin(metadata, root_prefix, out), args)
    except ConfigError as exc:
        err.write(f"error: {exc}\n")
        return 2
    except MetadataUnavailableError as exc:
        err.write(f"error: {exc}\n")
        return 3
    except DanubeError as exc:
        err.write(f"error: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
