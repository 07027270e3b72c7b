"""A pipeline's YAML file (`conf/pipelines/<name>.yaml`) parsed into frozen dataclasses.

The file is validated completely before any Spark session starts, so a typo fails in a second
rather than after the query is up: an unknown key, a value of the wrong type or a missing
required section raises `ConfigError` naming the file, the key path (`source.topics[1]`) and
what is accepted. `${VAR}` and `${VAR:-default}` inside string values are replaced from the
environment (secrets stay out of the file); an unset variable without a default is an error
naming the key. A value that came from a variable may stand for a number or a boolean
(`max_messages_per_trigger: ${BATCH}`), since the environment only holds strings.

Every key is documented in `conf/pipelines/orders.yaml`.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Union

import yaml

from danube_core.errors import ConfigError
from pipelines.speedlayer_feed import SpeedLayerFeed, check_feed

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_INTERVAL = re.compile(r"^\s*(\d+)\s*([a-z]+)\s*$", re.IGNORECASE)
_INTERVAL_UNITS_MS = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), 1),
    **dict.fromkeys(("s", "sec", "second", "seconds"), 1000),
    **dict.fromkeys(("m", "min", "minute", "minutes"), 60_000),
}

AVAILABLE_NOW = "availableNow"
PROCESSING_TIME = "processingTime"


@dataclass(frozen=True)
class SourceConfig:
    """Where the topics live and how the `danube` source reads them (its options, typed)."""

    etcd_endpoints: str
    storage_url: str
    subscription: str
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    namespace: str | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    root_prefix: str | None = None
    wal_root: str | None = None
    starting_offsets: str | None = None
    max_messages_per_trigger: int | None = None
    max_bytes_per_trigger: str | None = None
    fail_on_data_loss: bool = True
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DecodeConfig:
    """How payload bytes become columns.

    `format`: raw (payload kept as bytes) | json | avro. json/avro take the schema from the
    registry `subject` (the version each message names, else `version`, else the latest) or
    from `inline_schema` (a JSON Schema for json, an Avro schema for avro). Payloads that do
    not match go to quarantine (`on_error: quarantine`) or stay in the target with the
    payload text in `_rescued_data` (`on_error: rescue`); never dropped.
    """

    format: Literal["raw", "json", "avro"] = "raw"
    subject: str | None = None
    version: int | None = None
    inline_schema: str | None = None
    on_error: Literal["quarantine", "rescue"] = "quarantine"


@dataclass(frozen=True)
class TableConfig:
    """A Delta table named by `path` (a directory/URL) or by a metastore `table` name."""

    path: str | None = None
    table: str | None = None
    partition_by: tuple[str, ...] = ()
    merge_schema: bool = True
    optimize_write: bool = False

    @property
    def location(self) -> str:
        return self.path if self.path is not None else f"table {self.table}"


@dataclass(frozen=True)
class ExpectationRule:
    """One great-expectations expectation: its snake_case `type` and its keyword arguments."""

    type: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExpectationsConfig:
    """The suite run on every micro-batch; `results` optionally keeps per-batch results in Delta."""

    suite: str
    rules: tuple[ExpectationRule, ...]
    results: TableConfig | None = None


@dataclass(frozen=True)
class TriggerConfig:
    """`mode`: availableNow (read what exists, then stop) or processingTime (every `interval`)."""

    mode: Literal["availableNow", "processingTime"] = AVAILABLE_NOW
    interval: str | None = None

    @property
    def interval_ms(self) -> int | None:
        return None if self.interval is None else parse_interval_ms(self.interval)


@dataclass(frozen=True)
class PipelineConfig:
    """One pipeline: topics in, a Delta target and a Delta quarantine out."""

    name: str
    source: SourceConfig
    target: TableConfig
    quarantine: TableConfig
    checkpoint: str
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    expectations: ExpectationsConfig | None = None
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    speedlayer: SpeedLayerFeed | None = None  # the speed-layer dataset the target feeds (pipelines.speedlayer_feed)
    file: str = field(default="<memory>", compare=False)


class _FromEnv(str):
    """A string produced by `${VAR}` interpolation: may be read as a number or a boolean."""


class _Loader:
    """Walks the YAML tree into the dataclasses above, tracking the key path for errors."""

    def __init__(self, file: str) -> None:
        self.file = file

    def error(self, path: str, message: str) -> ConfigError:
        return ConfigError(f"{self.file}: {path or '<top level>'}: {message}")

    def build(self, cls: type, data: Any, path: str) -> Any:
        if not isinstance(data, Mapping):
            raise self.error(path, f"expected a mapping with keys {_keys(cls)}, got {_show(data)}")
        hints = typing.get_type_hints(cls, include_extras=False)
        accepted = {f.name: f for f in dataclasses.fields(cls) if f.init and f.name != "file"}
        for key in data:
            if key not in accepted:
                raise self.error(_join(path, str(key)), f"unknown key; accepted keys here: {_keys(cls)}")
        kwargs = {}
        for name, spec in accepted.items():
            key_path = _join(path, name)
            if name in data:
                kwargs[name] = self.value(hints[name], data[name], key_path)
            elif spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                raise self.error(key_path, "missing required key" + _section_hint(hints[name]))
        return cls(**kwargs)

    def value(self, hint: Any, data: Any, path: str) -> Any:
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin in (Union, types.UnionType):
            inner = [a for a in args if a is not type(None)]
            return None if data is None else self.value(inner[0], data, path)
        if origin is Literal:
            if data not in args:
                raise self.error(path, f"expected one of {', '.join(map(str, args))}, got {_show(data)}")
            return data
        if origin is tuple:
            items = [data] if isinstance(data, str) and args[0] is str else data
            if not isinstance(items, list):
                raise self.error(path, f"expected a list, got {_show(data)}")
            return tuple(self.value(args[0], item, f"{path}[{i}]") for i, item in enumerate(items))
        if origin in (collections.abc.Mapping, dict):
            return self.mapping(args[1] if args else Any, data, path)
        if dataclasses.is_dataclass(hint):
            return self.build(hint, data, path)
        return self.scalar(hint, data, path)

    def mapping(self, value_hint: Any, data: Any, path: str) -> dict:
        if not isinstance(data, Mapping):
            raise self.error(path, f"expected a mapping, got {_show(data)}")
        if value_hint is str:
            bad = [k for k, v in data.items() if isinstance(v, (Mapping, list))]
            if bad:
                raise self.error(_join(path, str(bad[0])), "expected a scalar value (string, number, boolean)")
            return {str(k): _scalar_text(v) for k, v in data.items()}
        return {str(k): _plain(v) for k, v in data.items()}

    def scalar(self, hint: Any, data: Any, path: str) -> Any:
        if hint is bool:
            if isinstance(data, bool):
                return data
            if isinstance(data, _FromEnv) and data.lower() in ("true", "false"):
                return data.lower() == "true"
            raise self.error(path, f"expected true or false, got {_show(data)}")
        if hint is int:
            if isinstance(data, int) and not isinstance(data, bool):
                return data
            if isinstance(data, _FromEnv) and data.strip().lstrip("-").isdigit():
                return int(data)
            raise self.error(path, f"expected an integer, got {_show(data)}")
        if hint is str:
            if isinstance(data, str):
                return str(data)
            if isinstance(data, (int, float)) and not isinstance(data, bool):
                return str(data)
            raise self.error(path, f"expected a string, got {_show(data)}")
        if hint is Any:
            return data
        raise self.error(path, f"unsupported type {hint!r}")  # a bug in the dataclasses above


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _keys(cls: type) -> str:
    return ", ".join(f.name for f in dataclasses.fields(cls) if f.init and f.name != "file")


def _section_hint(hint: Any) -> str:
    return f" (a section with keys {_keys(hint)})" if dataclasses.is_dataclass(hint) else ""


def _show(value: Any) -> str:
    kind = "null" if value is None else type(value).__name__.replace("_FromEnv", "str")
    return f"{value!r} ({kind})"


def _plain(value: Any) -> Any:
    """Free-form values (storage options, expectation kwargs) without the `_FromEnv` marker."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def interpolate(data: Any, file: str, path: str = "", env: Mapping[str, str] | None = None) -> Any:
    """Replace `${VAR}` / `${VAR:-default}` in every string of the tree, from `env` (os.environ)."""
    env = os.environ if env is None else env
    if isinstance(data, str):
        if "${" not in data:
            return data

        def substitute(match: re.Match) -> str:
            name, default = match.group(1), match.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ConfigError(
                f"{file}: {path or '<top level>'}: environment variable {name!r} is not set "
                f"(set it, or write ${{{name}:-default}})"
            )

        return _FromEnv(_ENV_REF.sub(substitute, data))
    if isinstance(data, Mapping):
        return {k: interpolate(v, file, _join(path, str(k)), env) for k, v in data.items()}
    if isinstance(data, list):
        return [interpolate(v, file, f"{path}[{i}]", env) for i, v in enumerate(data)]
    return data


def parse_interval_ms(text: str) -> int:
    """`"500 ms"`, `"2 seconds"`, `"1m"` -> milliseconds; ValueError naming the text otherwise."""
    match = _INTERVAL.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _INTERVAL_UNITS_MS or int(match.group(1)) == 0:
        raise ValueError(f"{text!r} is not an interval such as '500 ms', '2 seconds' or '1 minute'")
    return int(match.group(1)) * _INTERVAL_UNITS_MS[unit]


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> PipelineConfig:
    """Read, interpolate and validate one pipeline file; ConfigError names file and key."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read the pipeline file: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from exc
    return parse_config(data, file, env)


def parse_config(data: Any, file: str = "<memory>", env: Mapping[str, str] | None = None) -> PipelineConfig:
    """Validate an already parsed YAML tree (what `load_config` does after reading the file)."""
    loader = _Loader(file)
    config = loader.build(PipelineConfig, interpolate(data, file, env=env), "")
    config = dataclasses.replace(config, file=file)
    _check(config, loader)
    return config


def _check(config: PipelineConfig, loader: _Loader) -> None:
    """Rules that span keys (exactly one of, needs, differs from)."""
    if not _NAME.match(config.name):
        raise loader.error("name", f"{config.name!r} must be letters, digits, '_' or '-' (it is the Delta txnAppId)")
    _check_source(config.source, loader)
    _check_decode(config.decode, loader)
    for section, table in (("target", config.target), ("quarantine", config.quarantine)):
        _check_table(table, section, loader)
    if config.expectations is not None:
        if not config.expectations.rules:
            raise loader.error("expectations.rules", "expected at least one expectation")
        for i, rule in enumerate(config.expectations.rules):
            if not rule.type.startswith("expect_"):
                raise loader.error(f"expectations.rules[{i}].type",
                                   f"{rule.type!r} is not a great-expectations name (expect_...)")
        if config.expectations.results is not None:
            _check_table(config.expectations.results, "expectations.results", loader)
    locations = [config.target.location, config.quarantine.location]
    if locations[0] == locations[1]:
        raise loader.error("quarantine", f"must differ from the target ({locations[0]})")
    _check_trigger(config.trigger, loader)
    for key, problem in check_feed(config.speedlayer) if config.speedlayer is not None else ():
        raise loader.error(key, problem)


def _check_source(source: SourceConfig, loader: _Loader) -> None:
    chosen = [k for k in ("topics", "topic_pattern", "namespace") if getattr(source, k)]
    if len(chosen) != 1:
        raise loader.error("source", f"set exactly one of topics, topic_pattern, namespace (got {chosen or 'none'})")
    if source.max_messages_per_trigger is not None and source.max_messages_per_trigger < 1:
        raise loader.error("source.max_messages_per_trigger", "expected an integer >= 1")


def _check_decode(decode: DecodeConfig, loader: _Loader) -> None:
    has_schema = [k for k in ("subject", "inline_schema") if getattr(decode, k) is not None]
    if decode.format == "raw" and has_schema:
        raise loader.error(f"decode.{has_schema[0]}", "format raw takes no schema")
    if decode.format != "raw" and len(has_schema) != 1:
        raise loader.error("decode", f"format {decode.format} needs exactly one of subject, inline_schema")
    if decode.version is not None and decode.subject is None:
        raise loader.error("decode.version", "needs decode.subject")
    if decode.version is not None and decode.version < 1:
        raise loader.error("decode.version", "expected a version number >= 1")
    if decode.inline_schema is not None:
        import json

        try:
            json.loads(decode.inline_schema)
        except ValueError as exc:
            raise loader.error("decode.inline_schema", f"expected a JSON schema text: {exc}") from exc


def _check_table(table: TableConfig, section: str, loader: _Loader) -> None:
    if (table.path is None) == (table.table is None):
        raise loader.error(section, "set exactly one of path, table")


def _check_trigger(trigger: TriggerConfig, loader: _Loader) -> None:
    if trigger.mode == PROCESSING_TIME and trigger.interval is None:
        raise loader.error("trigger.interval", "required when trigger.mode is processingTime")
    if trigger.mode == AVAILABLE_NOW and trigger.interval is not None:
        raise loader.error("trigger.interval", "only valid when trigger.mode is processingTime")
    if trigger.interval is not None:
        try:
            parse_interval_ms(trigger.interval)
        except ValueError as exc:
            raise loader.error("trigger.interval", str(exc)) from exc
