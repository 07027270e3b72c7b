"""The gateway's routing decisions, its tenant authentication and its config, without servers."""

from __future__ import annotations

import collections

import pytest

from danube_core.errors import ConfigError
from speedlayer.config import load_gateway_config
from speedlayer.errors import UnauthenticatedError
from speedlayer.gateway.routing import ReplicaEndpoint as Target
from speedlayer.gateway.routing import choose_epoch, order_replicas, servable
from speedlayer.records import ASSIGNED, FAILED, R_LOADING, R_READY, AssignmentRecord, ReplicaRecord

pytestmark = pytest.mark.unit


def record(epoch: str, version: int, replicas: dict[str, str], status: str = ASSIGNED) -> AssignmentRecord:
    return AssignmentRecord(tenant="acme", dataset="orders", epoch=epoch, request_id="r", status=status,
                            version=version, replicas={w: ReplicaRecord(state=s) for w, s in replicas.items()})


ADDRESSES = {"w1": "h:1", "w2": "h:2", "w3": "h:3"}


def test_newest_epoch_with_a_ready_replica_wins_and_loading_replicas_are_never_chosen():
    v1 = record("v1-a", 1, {"w1": R_READY, "w2": R_READY})
    v2 = record("v2-b", 2, {"w2": R_LOADING, "w3": R_READY})
    v3 = record("v3-c", 3, {"w1": R_LOADING, "w2": R_LOADING})  # still loading everywhere
    chosen, replicas = choose_epoch([v1, v3, v2], ADDRESSES)
    assert chosen.epoch == "v2-b" and replicas == [Target("w3", "h:3")]
    assert choose_epoch([v1, v2], ADDRESSES, epoch="v1-a")[0].epoch == "v1-a"
    assert choose_epoch([v1], ADDRESSES, epoch="v9-x") is None
    assert choose_epoch([v3], ADDRESSES) is None


def test_failed_epochs_and_workers_without_an_address_are_not_servable():
    assert servable(record("v1-a", 1, {"w1": R_READY}, status=FAILED), ADDRESSES) == []
    assert servable(record("v1-a", 1, {"w1": R_READY, "w9": R_READY}), ADDRESSES) == [Target("w1", "h:1")]
    # The newest epoch's only READY replica is on a worker never seen: the older epoch serves.
    older, newer = record("v1-a", 1, {"w1": R_READY}), record("v2-b", 2, {"w9": R_READY})
    assert choose_epoch([older, newer], ADDRESSES)[0].epoch == "v1-a"


def test_replica_order_is_stable_per_client_spread_over_clients_and_avoided_ones_go_last():
    replicas = [Target("w1", "h:1"), Target("w2", "h:2")]
    firsts = collections.Counter(order_replicas(replicas, f"client-{i}")[0].worker for i in range(400))
    assert 150 < firsts["w1"] < 250, firsts
    for i in range(20):
        ordered = order_replicas(replicas, f"client-{i}")
        assert ordered == order_replicas(list(reversed(replicas)), f"client-{i}")
        assert order_replicas(replicas, f"client-{i}", frozenset({ordered[0].worker})) == ordered[::-1]


def _config(tmp_path, text: str):
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    return load_gateway_config(str(path), environ={})


def test_tenant_authentication(tmp_path):
    from speedlayer.gateway.server import authenticate

    config = _config(tmp_path, "gateway: {tokens: {acme: s3cret}}")
    assert authenticate({"x-speedlayer-tenant": "acme", "authorization": "Bearer s3cret"}, config) == "acme"
    assert authenticate({"x-speedlayer-tenant": "other"}, config) == "other"
    for headers, match in (({}, "missing"), ({"x-speedlayer-tenant": "a/b"}, "not a tenant id"),
                           ({"x-speedlayer-tenant": "acme"}, "token"),
                           ({"x-speedlayer-tenant": "acme", "authorization": "Bearer nope"}, "token")):
        with pytest.raises(UnauthenticatedError, match=match):
            authenticate(headers, config)
    strict = _config(tmp_path, "gateway: {require_tokens: true, tokens: {acme: s3cret}}")
    with pytest.raises(UnauthenticatedError, match="no token configured"):
        authenticate({"x-speedlayer-tenant": "other"}, strict)


def test_gateway_config_environment_and_bad_values(tmp_path):
    path = tmp_path / "speedlayer.yaml"
    path.write_text("etcd: {endpoints: [a:1, b:2], key_root: /sl}\ngateway: {port: 7900, max_result_rows: 10}\n")
    config = load_gateway_config(str(path), environ={"SPEEDLAYER_GATEWAY__TOKENS": "{acme: t0k}",
                                                     "SPEEDLAYER_GATEWAY__QUERY_TIMEOUT_MS": "500"})
    assert (config.port, config.max_result_rows, config.query_timeout_ms) == (7900, 10, 500)
    assert config.tokens == {"acme": "t0k"} and config.etcd_endpoints == "a:1,b:2" and config.key_root == "/sl"
    assert "t0k" not in repr(config)
    for text, named in (("gateway: {port: -1}", "port"), ("gateway: {tokens: [a]}", "gateway.tokens"),
                        ("gateway: {tokens: {acme: ''}}", "gateway.tokens"),
                        ("gateway: {require_tokens: yes-please}", "require_tokens"),
                        ("gateway: {max_result_bytes: 0}", "max_result_bytes")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=named):
            load_gateway_config(str(path), environ={})
