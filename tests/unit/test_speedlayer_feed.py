"""A pipeline's `speedlayer:` section and its commit announcements (memory metadata store, a
real Delta log): the key and value the master watches, and failures counted, never raised."""

from __future__ import annotations

import pyarrow as pa
import pytest
import yaml

from danube_core.errors import ConfigError, MetadataUnavailableError
from danube_core.metadata_memory import MemoryMetadataStore
from pipelines.config import parse_config
from pipelines.speedlayer_feed import CommitAnnouncer, SpeedLayerFeed
from speedlayer.records import Announcement

pytestmark = pytest.mark.unit


def orders(**speedlayer) -> dict:
    with open("conf/pipelines/orders.yaml", encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    data["speedlayer"] = speedlayer
    return data


def test_the_section_is_parsed_and_checked():
    config = parse_config(orders(tenant="acme", dataset="orders", key_root="/sl"), env={})
    assert config.speedlayer == SpeedLayerFeed("acme", "orders", key_root="/sl")
    assert parse_config({k: v for k, v in orders().items() if k != "speedlayer"}, env={}).speedlayer is None
    for bad, key in (({"tenant": "a/b", "dataset": "d"}, "speedlayer.tenant"),
                     ({"tenant": "a", "dataset": ""}, "speedlayer.dataset"),
                     ({"tenant": "a", "dataset": "d", "key_root": "sl/"}, "speedlayer.key_root"),
                     ({"tenant": "a"}, "speedlayer.dataset"),
                     ({"tenant": "a", "dataset": "d", "topic": "x"}, "speedlayer.topic")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            parse_config(orders(**bad), env={})


def test_a_commit_is_announced_with_the_tables_version(tmp_path):
    from deltalake import write_deltalake

    path = str(tmp_path / "orders")
    write_deltalake(path, pa.table({"id": [1, 2]}))
    write_deltalake(path, pa.table({"id": [3]}), mode="append")
    store = MemoryMetadataStore()
    announcer = CommitAnnouncer(SpeedLayerFeed("acme", "orders", key_root="/sl"), path, "orders-pipeline", store)
    assert announcer.announce()
    value = Announcement.from_json(store.get("/sl/announce/acme/orders"), "k")
    assert (value.table_uri, value.version, value.writer) == (path, 1, "orders-pipeline") and value.committed_ms > 0
    # A metastore table name (no log to read here) is announced with version -1.
    assert CommitAnnouncer(SpeedLayerFeed("acme", "t"), "lake.orders", "p", store).announce()
    assert Announcement.from_json(store.get("/announce/acme/t"), "k").version == -1


def test_a_failed_announcement_is_counted_and_never_raised(tmp_path, caplog):
    class Down(MemoryMetadataStore):
        def put(self, key, value, lease=None):
            raise MetadataUnavailableError("etcd 127.0.0.1:1 unreachable")

    announcer = CommitAnnouncer(SpeedLayerFeed("acme", "orders"), str(tmp_path / "missing"), "p", Down())
    assert announcer.announce() is False and announcer.failures == 1 and announcer.announced == 0
    assert "master's poll will find it" in caplog.text


def test_writers_announce_through_the_speed_layers_public_call():
    from speedlayer.announce import announce, announce_problems

    store = MemoryMetadataStore()
    revision = announce(store, "acme", "orders", "s3://lake/orders", version=7, writer="job", key_root="/sl",
                        committed_ms=1714564800000)
    assert revision > 0
    assert Announcement.from_json(store.get("/sl/announce/acme/orders"), "k") == \
        Announcement("s3://lake/orders", 7, "job", 1714564800000)
    assert set(announce_problems("a/b", "", "sl/")) == {"tenant", "dataset", "key_root"}
    with pytest.raises(ValueError, match="tenant 'a/b'"):
        announce(store, "a/b", "orders", "s3://lake/orders")


def test_the_announcers_etcd_defaults_to_the_sources_and_takes_its_own_options():
    from pipelines.speedlayer_feed import feed_etcd_settings

    reader = {"etcd.endpoints": "src:2379", "etcd.user": "root", "etcd.password": "pw-src", "etcd.caCert": "/ca.pem",
              "topic": "/default/t"}
    assert feed_etcd_settings(SpeedLayerFeed("acme", "d"), reader) is None  # the pipeline's own connection
    inherited = feed_etcd_settings(SpeedLayerFeed("acme", "d", etcd_endpoints="sl:2379"), reader)
    assert (inherited.endpoints, inherited.user, inherited.password, inherited.ca_cert) == (
        "sl:2379", "root", "pw-src", "/ca.pem")
    own = feed_etcd_settings(SpeedLayerFeed("acme", "d", options={"etcd.user": "sl", "etcd.password": "pw-sl"}), reader)
    assert (own.endpoints, own.user, own.password, own.ca_cert) == ("src:2379", "sl", "pw-sl", None)
    options = {"etcd.user": "sl", "etcd.password": "${SL_PW}"}
    config = parse_config(orders(tenant="acme", dataset="orders", options=options), env={"SL_PW": "pw-sl"})
    assert config.speedlayer.options == {"etcd.user": "sl", "etcd.password": "pw-sl"}
    assert "pw-sl" not in repr(config.speedlayer)
    for options, problem in (({"etcd.user": "sl", "etcd.password": "x", "etcd.certKey": "/k"}, "etcd.certCert"),
                             ({"etcd.endpoints": "x:1"}, "speedlayer.etcd_endpoints"),
                             ({"topic": "x"}, "not an etcd option")):
        with pytest.raises(ConfigError, match=r"speedlayer\.options: .*" + problem.replace(".", r"\.")):
            parse_config(orders(tenant="acme", dataset="orders", options=options), env={})
