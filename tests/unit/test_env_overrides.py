"""`danube_core.env_overrides`: the one reading of configuration from the environment, as the
broker (`DANUBE_...`), the speed layer (`SPEEDLAYER_...`) and pipeline files (`${VAR}`) use it."""

from __future__ import annotations

import pytest

from danube_core.env_overrides import apply_env_overrides, expand_env_refs, override_path
from danube_core.errors import ConfigError

pytestmark = pytest.mark.unit

SECTIONS = {"etcd", "master", "gateway"}


def apply(data: dict, environ: dict[str, str]) -> list[str]:
    return apply_env_overrides(data, environ, prefix="SPEEDLAYER_", sections=SECTIONS, source="sl.yaml")


def test_nested_keys_get_yaml_values_and_unrelated_variables_are_left_alone():
    data = {"master": {"port": 7700}, "etcd": "not a mapping yet"}
    used = apply(data, {"SPEEDLAYER_MASTER__PORT": "7702", "SPEEDLAYER_ETCD__ENDPOINTS": "[a:1, b:2]",
                        "SPEEDLAYER_GATEWAY__TOKENS": "{acme: t0k}", "SPEEDLAYER_GATEWAY__REQUIRE_TOKENS": "true",
                        "SPEEDLAYER_TOKEN": "not a section", "SPEEDLAYER_MASTER____PORT": "empty key",
                        "OTHER_MASTER__PORT": "1", "speedlayer_master__port": "2"})
    assert data == {"master": {"port": 7702}, "etcd": {"endpoints": ["a:1", "b:2"]},
                    "gateway": {"tokens": {"acme": "t0k"}, "require_tokens": True}}
    assert used == sorted(used) and len(used) == 4


@pytest.mark.parametrize("password", ["12345", "pw #1", "'quoted'", "{not: yaml", "null", "  spaced  "])
def test_a_password_is_taken_exactly_as_written(password):
    data: dict = {}
    apply(data, {"SPEEDLAYER_ETCD__PASSWORD": password})
    assert data == {"etcd": {"password": password}}


def test_a_value_that_is_not_yaml_names_the_variable_and_the_file_but_not_the_value():
    with pytest.raises(ConfigError) as info:
        apply({}, {"SPEEDLAYER_GATEWAY__TOKENS": "{acme: s3cret-t0ken"})
    message = str(info.value)
    assert "SPEEDLAYER_GATEWAY__TOKENS" in message and "gateway.tokens" in message and "sl.yaml" in message
    assert "s3cret" not in message and info.value.__cause__ is None


def test_override_path():
    assert override_path("DANUBE_META_STORE__PORT", "DANUBE_", {"meta_store"}) == ["meta_store", "port"]
    assert override_path("DANUBE_ETCD_PASSWORD", "DANUBE_", {"meta_store"}) is None  # a pipeline's ${VAR}
    assert override_path("DANUBE_META_STORE__", "DANUBE_", {"meta_store"}) is None


def test_references_are_expanded_marked_and_missing_ones_named():
    class Marked(str):
        pass

    data = {"source": {"etcd": "${HOST}:${PORT:-2379}", "plain": "x", "list": ["${HOST}", 3]}}
    out = expand_env_refs(data, "p.yaml", {"HOST": "h"}, mark=Marked)
    assert out == {"source": {"etcd": "h:2379", "plain": "x", "list": ["h", 3]}}
    assert isinstance(out["source"]["etcd"], Marked) and not isinstance(out["source"]["plain"], Marked)
    with pytest.raises(ConfigError, match=r"p\.yaml: source\.list\[0\]: environment variable 'HOST' is not set"):
        expand_env_refs({"source": {"list": ["x", "${HOST}"][::-1]}}, "p.yaml", {})
