"""`danube_core.etcd_settings`: one settings object for every part that reaches etcd; values
checked with errors in each part's own key names, a repr and errors without the password, and
connection failures that say what to fix (the connection itself is tested against real etcd
servers in tests/integration and tests/spark/test_security.py)."""

from __future__ import annotations

import pickle
import socket

import pytest

from danube_core.errors import ConfigError, MetadataUnavailableError
from danube_core.etcd_settings import EtcdKeyNames, EtcdSettings, parse_etcd_settings

pytestmark = pytest.mark.unit

SECRET = "pw-Zq81-never-shown"
NAMES = EtcdKeyNames.section("etcd", where="speed layer config sl.yaml")


def error(key, value, expected) -> ConfigError:
    return ConfigError(f"sl.yaml: {key}={value!r}: expected {expected}")


def parse(**values) -> EtcdSettings:
    return parse_etcd_settings(values, NAMES, error, default_endpoints="127.0.0.1:2379")


def test_values_become_settings():
    settings = parse(endpoints=["a:1", " https://b:2 "], user="root", password=SECRET, ca_cert="/ca.pem",
                     cert_key="/k.pem", cert_cert="/c.pem", timeout_ms="3000")
    assert settings == EtcdSettings("a:1,https://b:2", "root", SECRET, "/ca.pem", "/k.pem", "/c.pem", 3000)
    assert settings.tls and parse().endpoints == "127.0.0.1:2379" and not parse().tls
    assert parse(endpoints="https://a:1").tls
    assert settings.with_endpoints("c:3").password == SECRET
    assert pickle.loads(pickle.dumps(settings)) == settings  # the data source's options travel to executors


def test_the_password_is_never_in_the_repr():
    settings = parse(user="root", password=SECRET)
    assert SECRET not in repr(settings) and SECRET not in str(settings) and "<hidden>" in repr(settings)
    assert "password=None" in repr(parse())


@pytest.mark.parametrize("values, key, expected", [
    ({"endpoints": "a:1, ,b:2"}, "etcd.endpoints", "host:port"),
    ({"endpoints": "a 1"}, "etcd.endpoints", "host:port"),
    ({"endpoints": 2379}, "etcd.endpoints", "host:port"),
    ({"user": "root"}, "etcd.user", "given together with etcd.password"),
    ({"password": SECRET}, "etcd.password", "given together with etcd.user"),
    ({"user": "root", "password": 12345}, "etcd.password", "a non-empty string"),
    ({"cert_key": "/k.pem"}, "etcd.cert_key", "given together with etcd.cert_cert"),
    ({"cert_cert": "/c.pem"}, "etcd.cert_cert", "given together with etcd.cert_key"),
    ({"ca_cert": ""}, "etcd.ca_cert", "a non-empty string"),
    ({"timeout_ms": 0}, "etcd.timeout_ms", "an integer >= 1"),
    ({"timeout_ms": "5s"}, "etcd.timeout_ms", "an integer >= 1"),
])
def test_bad_values_name_the_key_and_hide_the_password(values, key, expected):
    with pytest.raises(ConfigError) as info:
        parse(**values)
    message = str(info.value)
    assert f"{key}=" in message and expected in message and "sl.yaml" in message
    assert SECRET not in message and "12345" not in message


def test_a_failed_connection_says_where_and_what_to_fix():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{closed.getsockname()[1]}"  # bound, not listening: refused
        plain = parse(endpoints=endpoint, user="root", password=SECRET, timeout_ms=500)
        with pytest.raises(MetadataUnavailableError) as info:
            plain.connect()
        message = str(info.value)
        assert message.startswith(f"speed layer config sl.yaml: etcd unreachable at {endpoint}")
        assert "is etcd running there (etcd.endpoints)? If it serves TLS (https), set etcd.ca_cert" in message
        assert SECRET not in message
        with pytest.raises(MetadataUnavailableError, match="does it serve TLS as etcd.ca_cert says"):
            parse(endpoints=endpoint, ca_cert=__file__, timeout_ms=500).connect()
    with pytest.raises(ConfigError, match=r"speed layer config sl.yaml: etcd.ca_cert: etcd CA certificate file"):
        parse(endpoints=endpoint, ca_cert="/no/such/ca.pem").connect()
