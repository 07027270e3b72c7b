"""Pipeline YAML files: validation names the file and the key; `${ENV}`; mapping to source options."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from danube_core.errors import ConfigError
from pipelines.config import load_config, parse_interval_ms

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]

MINIMAL = {
    "name": "orders",
    "source": {"etcd_endpoints": "127.0.0.1:2379", "storage_url": "/data/objects",
               "topics": ["/default/orders"], "subscription": "sub"},
    "decode": {"format": "json", "subject": "orders"},
    "target": {"path": "/lake/orders"},
    "quarantine": {"path": "/lake/orders_quarantine"},
    "checkpoint": "/lake/_checkpoints/orders",
}


def write(tmp_path: Path, data: dict, name: str = "pipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def with_changes(section: str | None, **changes) -> dict:
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in MINIMAL.items()}
    if section is None:
        data.update(changes)
    else:
        data[section].update(changes)
    return data


def config_error(path: Path, env: dict | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, env=env or {})
    return str(info.value)


def test_every_shipped_pipeline_file_loads():
    files = sorted((REPO / "conf" / "pipelines").glob("*.yaml"))
    assert files, "conf/pipelines holds no pipeline"
    for file in files:
        config = load_config(file, env={})
        assert config.file == str(file)
    orders = load_config(REPO / "conf" / "pipelines" / "orders.yaml", env={})
    assert orders.source.topics == ("/default/orders",)
    assert [r.type for r in orders.expectations.rules][0] == "expect_column_values_to_not_be_null"


def test_unknown_key_names_file_key_path_and_accepted_keys(tmp_path):
    message = config_error(write(tmp_path, with_changes("source", max_mesages_per_trigger=5)))
    assert str(tmp_path / "pipe.yaml") in message
    assert "source.max_mesages_per_trigger" in message
    assert "unknown key" in message and "max_messages_per_trigger" in message


def test_unknown_top_level_section(tmp_path):
    message = config_error(write(tmp_path, with_changes(None, sink={"path": "/x"})))
    assert "sink: unknown key" in message and "quarantine" in message


@pytest.mark.parametrize(
    "section, changes, key, expected",
    [
        ("source", {"max_messages_per_trigger": "many"}, "source.max_messages_per_trigger", "an integer"),
        ("source", {"fail_on_data_loss": "yes"}, "source.fail_on_data_loss", "true or false"),
        ("source", {"topics": {"a": 1}}, "source.topics", "a list"),
        ("source", {"topics": ["/default/a", ["nested"]]}, "source.topics[1]", "a string"),
        ("target", {"merge_schema": 1}, "target.merge_schema", "true or false"),
        ("decode", {"format": "xml"}, "decode.format", "raw, json, avro"),
        (None, {"trigger": {"mode": "once"}}, "trigger.mode", "availableNow, processingTime"),
        (None, {"source": ["not", "a", "mapping"]}, "source", "a mapping"),
    ],
)
def test_wrong_type_names_key_and_what_is_accepted(tmp_path, section, changes, key, expected):
    message = config_error(write(tmp_path, with_changes(section, **changes)))
    assert f"{key}:" in message and expected in message


def test_missing_source_section_fails_fast(tmp_path):
    data = with_changes(None)
    del data["source"]
    message = config_error(write(tmp_path, data))
    assert "source: missing required key" in message and "etcd_endpoints" in message


def test_missing_required_key_inside_section(tmp_path):
    data = with_changes(None)
    data["source"] = {k: v for k, v in data["source"].items() if k != "subscription"}
    assert "source.subscription: missing required key" in config_error(write(tmp_path, data))


def test_env_interpolation_with_defaults_and_typed_values(tmp_path):
    data = with_changes("source", etcd_endpoints="${ETCD:-127.0.0.1:2379}", max_messages_per_trigger="${BATCH}",
                        storage_options={"secret": "${SECRET}"})
    data["target"]["merge_schema"] = "${MERGE}"
    config = load_config(write(tmp_path, data), env={"BATCH": "250", "SECRET": "s3cr3t", "MERGE": "false"})
    assert config.source.etcd_endpoints == "127.0.0.1:2379"
    assert config.source.max_messages_per_trigger == 250
    assert config.source.storage_options == {"secret": "s3cr3t"}
    assert type(config.source.storage_options["secret"]) is str
    assert config.target.merge_schema is False


def test_unset_env_variable_names_the_key(tmp_path):
    data = with_changes("source", storage_url="s3://${BUCKET}/danube")
    message = config_error(write(tmp_path, data))
    assert "source.storage_url" in message and "'BUCKET' is not set" in message


def test_literal_strings_are_not_numbers(tmp_path):
    # Only values that came from the environment may stand for numbers.
    assert "an integer" in config_error(write(tmp_path, with_changes("source", max_messages_per_trigger="10")))


@pytest.mark.parametrize(
    "section, changes, fragment",
    [
        ("source", {"topic_pattern": "/default/.*"}, "exactly one of topics, topic_pattern, namespace"),
        ("decode", {"subject": None}, "needs exactly one of subject, inline_schema"),
        ("decode", {"format": "raw"}, "decode.subject: format raw takes no schema"),
        ("decode", {"subject": None, "inline_schema": "{not json"}, "decode.inline_schema: expected a JSON schema"),
        ("quarantine", {"path": "/lake/orders"}, "quarantine: must differ from the target"),
        ("target", {"table": "lake.orders"}, "target: set exactly one of path, table"),
        (None, {"trigger": {"mode": "processingTime"}}, "trigger.interval: required"),
        (None, {"trigger": {"mode": "processingTime", "interval": "soon"}}, "trigger.interval"),
        (None, {"name": "orders pipeline"}, "name:"),
        (None, {"expectations": {"suite": "s", "rules": [{"type": "column_not_null"}]}}, "expectations.rules[0].type"),
    ],
)
def test_rules_across_keys(tmp_path, section, changes, fragment):
    assert fragment in config_error(write(tmp_path, with_changes(section, **changes)))


def test_not_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    assert "bad.yaml: not valid YAML" in config_error(bad)
    assert "cannot read" in config_error(tmp_path / "absent.yaml")


@pytest.mark.parametrize("text, ms", [("500 ms", 500), ("2 seconds", 2000), ("1m", 60_000), ("3 s", 3000)])
def test_intervals(text, ms):
    assert parse_interval_ms(text) == ms


def test_processing_time_trigger(tmp_path):
    config = load_config(write(tmp_path, with_changes(None, trigger={"mode": "processingTime", "interval": "500 ms"})))
    assert config.trigger.interval_ms == 500


def test_reader_options_map_onto_the_danube_source(tmp_path):
    from connectors.options import parse_options
    from pipelines.runner import reader_options

    data = with_changes("source", max_messages_per_trigger=100, starting_offsets="earliest",
                        storage_options={"key": "k"}, options={"maxTriggerDelay": "5s", "minMessagesPerTrigger": "10"})
    options = reader_options(load_config(write(tmp_path, data)).source)
    parsed = parse_options(options)
    assert parsed.topics == ("/default/orders",)
    assert parsed.subscription == "sub"
    assert parsed.max_messages_per_trigger == 100
    assert parsed.include_source is True
    assert parsed.starting.kind == "earliest"
    assert parsed.storage_options["key"] == "k"
    assert parsed.max_trigger_delay_ms == 5000


def test_every_error_in_the_file_is_reported_at_once(tmp_path):
    data = with_changes("source", max_messages_per_trigger="many", fail_on_data_loss="yes")
    data["target"]["merge_schema"] = 1
    lines = config_error(write(tmp_path, data)).splitlines()
    file = str(tmp_path / "pipe.yaml")
    assert lines == [
        f"{file}: source.max_messages_per_trigger: expected an integer, got 'many' (str)",
        f"{file}: source.fail_on_data_loss: expected true or false, got 'yes' (str)",
        f"{file}: target.merge_schema: expected true or false, got 1 (int)",
    ]


def test_spark_conf_values_are_scalars_given_as_text(tmp_path):
    config = load_config(write(tmp_path, with_changes(None, spark_conf={"spark.sql.shuffle.partitions": 8,
                                                                         "spark.ui.enabled": False})))
    assert config.spark_conf == {"spark.sql.shuffle.partitions": "8", "spark.ui.enabled": "false"}
    message = config_error(write(tmp_path, with_changes(None, spark_conf={"spark.x": {"nested": 1}})))
    assert "spark_conf.spark.x: expected a scalar value" in message


def test_one_topic_may_be_a_string_and_enum_values_may_come_from_env(tmp_path):
    data = with_changes("source", topics="/default/orders")
    data["decode"]["format"] = "${FORMAT}"
    config = load_config(write(tmp_path, data), env={"FORMAT": "json"})
    assert config.source.topics == ("/default/orders",)
    assert config.decode.format == "json" and type(config.decode.format) is str


def test_file_is_not_a_key_of_the_file(tmp_path):
    assert "file: unknown key" in config_error(write(tmp_path, with_changes(None, file="/elsewhere.yaml")))


def test_not_a_mapping_at_the_top(tmp_path):
    bad = tmp_path / "list.yaml"
    bad.write_text("- name: orders\n")
    assert "list.yaml: <top level>: expected a mapping with keys name, source" in config_error(bad)


def test_sections_are_dataclasses_code_can_build_and_replace(tmp_path):
    import dataclasses

    from pipelines.config import DecodeConfig, ExpectationRule

    config = load_config(write(tmp_path, with_changes(None)))
    assert dataclasses.replace(config, expectations=None).file == config.file
    assert dataclasses.asdict(config.decode)["subject"] == "orders"
    assert DecodeConfig("json", subject="s").format == "json"
    assert ExpectationRule("expect_x", {"column": "a"}).kwargs == {"column": "a"}
