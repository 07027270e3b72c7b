"""Master configuration, etcd records and the key layout, without servers."""

from __future__ import annotations

import pytest

from danube_core.errors import ConfigError, MetadataError
from speedlayer.config import load_master_config
from speedlayer.keys import SpeedLayerKeys, valid_id
from speedlayer.records import AssignmentRecord, GlobalConfig, ReplicaRecord, TenantConfig

pytestmark = pytest.mark.unit


def test_yaml_then_environment_then_flags(tmp_path):
    path = tmp_path / "speedlayer.yaml"
    path.write_text("etcd: {endpoints: [a:1, b:2]}\nmaster: {port: 7001, election_ttl_seconds: 4}\n")
    config = load_master_config(str(path), {"id": "m9"},
                                environ={"SPEEDLAYER_MASTER__PORT": "7002", "SPEEDLAYER_MASTER__METRICS_PORT": "9100",
                                         "SPEEDLAYER_NOT_A_SECTION": "x"})
    assert (config.master_id, config.port, config.metrics_port, config.election_ttl_seconds) == ("m9", 7002, 9100, 4)
    assert config.etcd_endpoints == "a:1,b:2" and config.address == "127.0.0.1:7002"


@pytest.mark.parametrize("text, named", [("master: {port: 0}", "port"), ("master: {heartbeat_interval_seconds: x}",
                                         "heartbeat_interval_seconds"), ("[1, 2]", "mapping")])
def test_bad_values_name_the_key(tmp_path, text, named):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=named):
        load_master_config(str(path), environ={})


def test_records_round_trip_and_reject_garbage():
    record = AssignmentRecord(tenant="t", dataset="d", epoch="v1-x", request_id="r", status="ASSIGNED",
                              replicas={"w1": ReplicaRecord(state="READY", rows=5), "w2": ReplicaRecord(leaving=True)})
    assert AssignmentRecord.from_json(record.to_json(), "k") == record
    assert record.staying() == ("w1",)
    assert TenantConfig.from_json(b'{"memory_quota_gb": 1.5}', "k").memory_quota_bytes == int(1.5 * 1024**3)
    with pytest.raises(MetadataError, match="strategy"):
        GlobalConfig.from_json(b'{"strategy": "random"}', "k")
    with pytest.raises(MetadataError, match="no JSON"):
        TenantConfig.from_json(b"{", "k")


def test_key_layout():
    keys = SpeedLayerKeys("/sl")
    assert keys.worker("t", "w") == "/sl/workers/t/w" and keys.parse_worker("/sl/workers/t/w") == ("t", "w")
    assert SpeedLayerKeys().election == "/election/master"
    assert keys.assignment("t", "d", "e") == "/sl/assignments/t/d/e"
    with pytest.raises(ValueError):
        SpeedLayerKeys("sl/")
    assert valid_id("orders_2024.v1") and not valid_id("a/b") and not valid_id("") and not valid_id("-x")


def test_etcd_section_takes_the_brokers_tls_and_password_keys_and_hides_the_password(tmp_path):
    from speedlayer.config import load_gateway_config

    path = tmp_path / "speedlayer.yaml"
    path.write_text("etcd: {endpoints: 'https://a:1', user: sl, ca_cert: /ca.pem, cert_key: /k.pem, "
                    "cert_cert: /c.pem, timeout_ms: 2000}\n")
    environ = {"SPEEDLAYER_ETCD__PASSWORD": "12345 #not-a-comment"}
    for config in (load_master_config(str(path), environ=environ), load_gateway_config(str(path), environ=environ)):
        etcd = config.etcd
        assert (etcd.endpoints, etcd.user, etcd.password, etcd.ca_cert, etcd.cert_key, etcd.cert_cert,
                etcd.timeout_ms) == ("https://a:1", "sl", "12345 #not-a-comment", "/ca.pem", "/k.pem", "/c.pem", 2000)
        assert config.etcd_endpoints == "https://a:1" and "12345" not in repr(config)
        assert etcd.names is not None and etcd.names.where == f"speed layer config {path}"
    assert load_master_config(None, environ={}).etcd.endpoints == "127.0.0.1:2379"


@pytest.mark.parametrize("text, environ, named", [
    ("etcd: {user: sl}", {}, "etcd.user='sl': expected given together with etcd.password"),
    ("etcd: {}", {"SPEEDLAYER_ETCD__PASSWORD": "s3cret-pw"}, "etcd.password='<hidden>'"),
    ("etcd: {cert_key: /k.pem}", {}, "etcd.cert_key='/k.pem': expected given together with etcd.cert_cert"),
    ("etcd: {cacert: /ca.pem}", {}, "etcd.cacert: unknown key"),
    ("etcd: {endpoints: 'a 1'}", {}, "etcd.endpoints='a 1'"),
    ("etcd: a:1", {}, "etcd: expected a mapping"),
    ("master: {}", {"SPEEDLAYER_ETCD__ENDPOINTS": "[a:1"}, "SPEEDLAYER_ETCD__ENDPOINTS"),
])
def test_bad_etcd_settings_name_the_key(tmp_path, text, environ, named):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_master_config(str(path), environ=environ)
    assert named in str(info.value) and "bad.yaml" in str(info.value) and "s3cret" not in str(info.value)
