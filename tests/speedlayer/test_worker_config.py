"""The worker's configuration: `worker:` section, `SPEEDLAYER_WORKER__...` overrides, then the
`python -m speedlayer worker` flags; frozen, checked up front. No servers."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from danube_core.errors import ConfigError
from speedlayer.__main__ import _parser
from speedlayer.config import WorkerConfig, load_worker_config
from speedlayer.worker.process import flag_overrides

pytestmark = pytest.mark.unit

REPO_CONF = Path(__file__).resolve().parents[2] / "conf" / "speedlayer.yaml"


def from_command_line(*argv: str, path: str | None = None, environ: dict[str, str] | None = None) -> WorkerConfig:
    args = _parser().parse_args(["worker", *argv])
    return load_worker_config(path or args.config, flag_overrides(args), environ=environ or {})


def test_flags_alone_give_the_defaults_the_flags_always_had():
    config = from_command_line("--tenant", "acme", "--id", "w1", "--masters", "a:1, b:2")
    assert config.masters == ("a:1", "b:2") and config.listen == "127.0.0.1:0" and config.address == ""
    assert (config.memory_bytes, config.threads, config.storage_options) == (2048 * 1024 * 1024, 2, {})
    assert (config.max_result_rows, config.max_result_bytes, config.query_timeout_ms) == (1_000_000, 256 << 20, 30_000)
    assert config.metrics_port is None and config.cpu_cores >= 1


def test_yaml_then_environment_then_flags(tmp_path):
    path = tmp_path / "speedlayer.yaml"
    path.write_text("worker: {tenant: acme, id: w1, masters: [a:1, b:2], threads: 4, memory_bytes: 1048576,"
                    " storage_options: {s3: {anon: true}}}\n")
    config = from_command_line("--config", str(path), "--id", "w9", "--memory-mb", "3", "--max-result-mb", "1",
                               environ={"SPEEDLAYER_WORKER__THREADS": "8", "SPEEDLAYER_WORKER__ID": "w5"})
    assert (config.tenant, config.worker_id, config.masters, config.threads) == ("acme", "w9", ("a:1", "b:2"), 8)
    assert (config.memory_bytes, config.max_result_bytes) == (3 << 20, 1 << 20)
    assert config.storage_options == {"s3": {"anon": True}}


def test_the_config_is_frozen_and_a_bound_port_makes_a_new_one():
    config = WorkerConfig(tenant="acme", worker_id="w1", masters=["a:1"])
    assert config.masters == ("a:1",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.address = "x:1"  # type: ignore[misc]
    assert config.advertised_address(7001) == "127.0.0.1:7001"
    assert dataclasses.replace(config, address="h:2").advertised_address(7001) == "h:2"


@pytest.mark.parametrize("argv, named", [
    (["--id", "w1", "--masters", "a:1"], "worker.tenant (or --tenant) is required"),
    (["--tenant", "acme"], "worker.masters (or --masters) is required"),
    (["--tenant", "a b", "--masters", "a:1"], "worker.tenant='a b' (--tenant)"),
    (["--tenant", "acme", "--masters", "a:1", "--listen", "nope"], "worker.listen='nope' (--listen)"),
    (["--tenant", "acme", "--masters", "a:1", "--storage-options", "{"], "--storage-options '{': not JSON"),
    (["--tenant", "acme", "--masters", "a:1", "--max-result-rows", "0"], "max_result_rows=0"),
    (["--tenant", "acme", "--masters", "a:1", "--storage-options", '{"s3": 1}'], "worker.storage_options"),
])
def test_bad_values_name_the_key_and_the_flag(argv, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        from_command_line(*argv)


def test_the_shipped_file_loads_with_a_tenant():
    config = from_command_line("--tenant", "acme", path=str(REPO_CONF))
    assert config.masters == ("127.0.0.1:7700",) and config.memory_bytes == 2 * 1024**3
