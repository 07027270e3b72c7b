"""Broker config: Danube's keys, environment overrides, errors naming file, key and expectation."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import load_config, parse_config
from broker.server import cloud_options, storage_settings
from danube_core.errors import ConfigError

pytestmark = pytest.mark.unit

SHIPPED = Path(__file__).resolve().parents[2] / "conf" / "broker.yaml"


def test_shipped_config_reaches_the_local_etcd_and_starts_none():
    config = load_config(str(SHIPPED), environ={})
    assert config.meta_store.endpoint == "127.0.0.1:2379" and not config.meta_store.embedded
    assert config.listener.broker_url == "http://127.0.0.1:6650"
    assert config.wal.dir == "./danube-data/wal" and config.wal.durable
    assert config.uploader.root_prefix == "/danube-data"
    assert config.policies.max_message_size == 10485760
    assert config.coordination.register_ttl_seconds == 32 and config.coordination.leader_ttl_seconds == 14
    settings = storage_settings(config)
    assert settings.wal.fsync_interval_ms == 5000 and settings.max_object_bytes == 256 * 1024 * 1024
    assert settings.retention_max_age_s == 2880 * 60


def test_environment_overrides_nested_keys_as_yaml_values():
    config = load_config(str(SHIPPED), environ={
        "DANUBE_BROKER__PORTS__CLIENT": "6651",
        "DANUBE_WAL_CLOUD__WAL__FILE_SYNC__DURABLE": "false",
        "DANUBE_BOOTSTRAP_NAMESPACES": "[default, sales]",
        "DANUBE_UNRELATED": "ignored",
    })
    assert config.listener.client_port == 6651 and config.listener.broker_url == "http://127.0.0.1:6651"
    assert config.wal.durable is False
    assert config.bootstrap_namespaces == ("default", "sales")


@pytest.mark.parametrize(
    ("raw", "key", "expected"),
    [
        ({"broker": {"ports": {"client": "6650"}}}, "broker.ports.client", "an integer"),
        ({"broker": {"prot": 1}}, "broker.prot", "one of the keys"),
        ({"broker": {"grpc_front": "rust"}}, "broker.grpc_front", "one of auto, native, python"),
        ({"auth": {"mode": "tls"}}, "auth.mode", "'none'"),
        ({"wal_cloud": {"wal": {"dir": None}}}, "wal_cloud.wal.dir", "a non-empty string"),
        ({"policies": {"max_message_size": -1}}, "policies.max_message_size", "an integer in 0..4294967295"),
        ({"wal_cloud": {"cloud": {"backend": "ftp"}}}, "wal_cloud.cloud.backend", "one of fs, s3, memory"),
        ({"bootstrap_namespaces": ["bad name"]}, "bootstrap_namespaces", "namespace names"),
        ({"meta_store": {"user": "root"}}, "meta_store.user", "together with meta_store.password"),
        ({"meta_store": {"cert_key": "/k.pem"}}, "meta_store.cert_key", "together with meta_store.cert_cert"),
        ({"meta_store": {"user": "root", "password": 12345}}, "meta_store.password", "a non-empty string"),
    ],
)
def test_bad_values_name_file_key_and_expectation(raw, key, expected):
    with pytest.raises(ConfigError) as info:
        parse_config(raw, "my.yaml")
    message = str(info.value)
    assert "my.yaml" in message and f"{key}=" in message and expected in message


def test_danube_s3_options_become_s3fs_options():
    config = parse_config({"wal_cloud": {"cloud": {
        "backend": "s3", "root": "s3://bucket/prefix", "region": "us-east-1", "endpoint": "http://minio:9000",
        "access_key": "ak", "secret_key": "sk", "virtual_host_style": False,
    }}}, "s3.yaml")
    assert cloud_options(config) == {
        "key": "ak", "secret": "sk",
        "client_kwargs": {"region_name": "us-east-1", "endpoint_url": "http://minio:9000"},
        "config_kwargs": {"s3": {"addressing_style": "path"}},
    }


def test_unreadable_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="missing.yaml"):
        load_config(str(tmp_path / "missing.yaml"), environ={})


def test_etcd_password_from_the_environment_never_shows_in_the_config():
    config = load_config(str(SHIPPED), environ={"DANUBE_META_STORE__USER": "root",
                                                "DANUBE_META_STORE__PASSWORD": "pw-not-in-repr"})
    assert (config.meta_store.etcd.user, config.meta_store.etcd.password) == ("root", "pw-not-in-repr")
    assert "pw-not-in-repr" not in repr(config)
    with pytest.raises(ConfigError) as info:
        parse_config({"meta_store": {"user": "root", "password": 12345}}, "my.yaml")
    assert "12345" not in str(info.value)


def test_uploader_enabled_false_is_ignored_with_a_warning_as_danube_does(caplog):
    with caplog.at_level("WARNING", logger="broker.config"):
        config = parse_config({"wal_cloud": {"uploader": {"enabled": False, "interval_seconds": 5}}}, "my.yaml")
    assert config.uploader.interval_seconds == 5
    assert "my.yaml: wal_cloud.uploader.enabled=false is ignored" in caplog.text
    with caplog.at_level("WARNING", logger="broker.config"):
        caplog.clear()
        parse_config({"wal_cloud": {"uploader": {"enabled": True}}}, "my.yaml")
    assert caplog.text == ""


def test_admin_with_config_uses_the_brokers_etcd_credentials(tmp_path, monkeypatch):
    """`python -m broker.admin --config` reached the broker's etcd with its endpoint only, so a
    secured etcd (TLS, password) refused it; it now takes `meta_store`'s settings whole."""
    from broker.admin import _etcd_and_prefix, _parser

    path = tmp_path / "broker.yaml"
    path.write_text("meta_store: {host: etcd.local, port: 2390, user: root, ca_cert: /ca.pem, "
                    "cert_key: /k.pem, cert_cert: /c.pem}\n")
    monkeypatch.setenv("DANUBE_META_STORE__PASSWORD", "pw-admin")
    etcd, _ = _etcd_and_prefix(_parser().parse_args(["--config", str(path), "namespaces", "list"]))
    assert (etcd.endpoints, etcd.user, etcd.password, etcd.ca_cert, etcd.cert_cert) == (
        "etcd.local:2390", "root", "pw-admin", "/ca.pem", "/c.pem")
    assert etcd.names is not None and etcd.names.password == "meta_store.password"
