"""A pipeline's YAML file (`conf/pipelines/<name>.yaml`) validated into frozen dataclasses.

The schema is the dataclasses below, validated by pydantic (v2, `pydantic.dataclasses`): each
field's type says what the key accepts, so a new key is one typed field with a default. The
file is validated completely before any Spark session starts, so a typo fails in a second
rather than after the query is up: unknown keys, values of the wrong type and missing
required sections raise one `ConfigError` naming the file, each key path
(`source.topics[1]`) and what is accepted. `${VAR}` and `${VAR:-default}` inside string
values are replaced from the environment first (secrets stay out of the file); an unset
variable without a default is an error naming the key. A value that came from a variable may
stand for a number or a boolean (`max_messages_per_trigger: ${BATCH}`), since the
environment only holds strings; a literal string never does (`Int`, `Bool`). The substitution
is `danube_core.env_overrides.expand_env_refs`, the module every part reads its environment
through.

Every key is documented in `conf/pipelines/orders.yaml`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Mapping, Union

import yaml
from pydantic import BeforeValidator, ConfigDict, Strict, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

from danube_core.env_overrides import expand_env_refs
from danube_core.errors import ConfigError
from pipelines.speedlayer_feed import SpeedLayerFeed, check_feed

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_INTERVAL = re.compile(r"^\s*(\d+)\s*([a-z]+)\s*$", re.IGNORECASE)
_INTERVAL_UNITS_MS = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), 1),
    **dict.fromkeys(("s", "sec", "second", "seconds"), 1000),
    **dict.fromkeys(("m", "min", "minute", "minutes"), 60_000),
}


class _FromEnv(str):
    """A string produced by `${VAR}` interpolation: may be read as a number or a boolean."""


def _env_int(value: Any) -> Any:
    if isinstance(value, _FromEnv) and value.strip().lstrip("-").isdigit():
        return int(value)
    return value


def _env_bool(value: Any) -> Any:
    if isinstance(value, _FromEnv) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def _number_text(value: Any) -> Any:
    if isinstance(value, _FromEnv):
        return str(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


def _one_or_list(value: Any) -> Any:
    return (value,) if isinstance(value, str) else value


def _scalar_text(value: Any) -> str:
    if isinstance(value, (Mapping, list)):
        raise ValueError("expected a scalar value (string, number, boolean)")
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _plain(value: Any) -> Any:
    """Free-form values (storage options, expectation kwargs) without the `_FromEnv` marker."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


# The field types of the schema. Scalars are strict (YAML `1` is not `true`, `"10"` is not 10)
# except for values that came from `${VAR}`.
Int = Annotated[int, BeforeValidator(_env_int), Strict()]
Bool = Annotated[bool, BeforeValidator(_env_bool), Strict()]
Text = Annotated[str, BeforeValidator(_number_text), Strict()]
Names = Annotated[tuple[Text, ...], BeforeValidator(_one_or_list)]  # a list, or one string
Settings = Mapping[str, Annotated[str, BeforeValidator(_scalar_text)]]  # Spark conf, source options
FreeForm = Annotated[Mapping[str, Any], BeforeValidator(lambda v: _plain(v) if isinstance(v, Mapping) else v)]

# Every section: unknown keys are errors (a typo would otherwise do nothing).
_SECTION = ConfigDict(extra="forbid")

AVAILABLE_NOW: Final = "availableNow"
PROCESSING_TIME: Final = "processingTime"


@dataclass(frozen=True, config=_SECTION)
class SourceConfig:
    """Where the topics live and how the `danube` source reads them (its options, typed)."""

    etcd_endpoints: Text
    storage_url: Text
    subscription: Text
    topics: Names = ()
    topic_pattern: Text | None = None
    namespace: Text | None = None
    storage_options: FreeForm = field(default_factory=dict)
    root_prefix: Text | None = None
    wal_root: Text | None = None
    starting_offsets: Text | None = None
    max_messages_per_trigger: Int | None = None
    max_bytes_per_trigger: Text | None = None
    fail_on_data_loss: Bool = True
    options: Settings = field(default_factory=dict)


@dataclass(frozen=True, config=_SECTION)
class DecodeConfig:
    """How payload bytes become columns.

    `format`: raw (payload kept as bytes) | json | avro. json/avro take the schema from the
    registry `subject` (the version each message names, else `version`, else the latest) or
    from `inline_schema` (a JSON Schema for json, an Avro schema for avro). Payloads that do
    not match go to quarantine (`on_error: quarantine`) or stay in the target with the
    payload text in `_rescued_data` (`on_error: rescue`); never dropped.
    """

    format: Literal["raw", "json", "avro"] = "raw"
    subject: Text | None = None
    version: Int | None = None
    inline_schema: Text | None = None
    on_error: Literal["quarantine", "rescue"] = "quarantine"


@dataclass(frozen=True, config=_SECTION)
class TableConfig:
    """A Delta table named by `path` (a directory/URL) or by a metastore `table` name."""

    path: Text | None = None
    table: Text | None = None
    partition_by: Names = ()
    merge_schema: Bool = True
    optimize_write: Bool = False

    @property
    def location(self) -> str:
        return self.path if self.path is not None else f"table {self.table}"

    @property
    def table_name(self) -> str:
        """`table`, for a table not given by `path` (a loaded config sets exactly one)."""
        assert self.table is not None, f"{self} names neither a path nor a table"
        return self.table


@dataclass(frozen=True, config=_SECTION)
class ExpectationRule:
    """One great-expectations expectation: its snake_case `type` and its keyword arguments."""

    type: Text
    kwargs: FreeForm = field(default_factory=dict)


@dataclass(frozen=True, config=_SECTION)
class ExpectationsConfig:
    """The suite run on every micro-batch; `results` optionally keeps per-batch results in Delta."""

    suite: Text
    rules: tuple[ExpectationRule, ...]
    results: TableConfig | None = None


@dataclass(frozen=True, config=_SECTION)
class TriggerConfig:
    """`mode`: availableNow (read what exists, then stop) or processingTime (every `interval`)."""

    mode: Literal["availableNow", "processingTime"] = AVAILABLE_NOW
    interval: Text | None = None

    @property
    def interval_ms(self) -> int | None:
        return None if self.interval is None else parse_interval_ms(self.interval)


@dataclass(frozen=True, config=_SECTION)
class MetricsConfig:
    """The pipeline's Prometheus endpoint (`pipelines.metrics_endpoint`): `port`, and `host`
    to bind (127.0.0.1 by default: a Prometheus on another machine needs `0.0.0.0`)."""

    port: Int
    host: Text = "127.0.0.1"


@dataclass(frozen=True, config=_SECTION)
class PipelineConfig:
    """One pipeline: topics in, a Delta target and a Delta quarantine out."""

    name: Text
    source: SourceConfig
    target: TableConfig
    quarantine: TableConfig
    checkpoint: Text
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    expectations: ExpectationsConfig | None = None
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    spark_conf: Settings = field(default_factory=dict)
    speedlayer: SpeedLayerFeed | None = None  # the speed-layer dataset the target feeds (pipelines.speedlayer_feed)
    metrics: MetricsConfig | None = None  # no Prometheus endpoint unless set
    file: str = field(default="<memory>", compare=False)


class _Loader:
    """Names the file in every error; translates pydantic's errors into key paths and words."""

    def __init__(self, file: str) -> None:
        self.file = file

    def error(self, path: str, message: str) -> ConfigError:
        return ConfigError(f"{self.file}: {path or '<top level>'}: {message}")

    def build(self, data: Any) -> PipelineConfig:
        if isinstance(data, Mapping) and "file" in data:  # set by the loader, not a key
            raise self.error("file", f"unknown key; accepted keys here: {_keys(PipelineConfig)}")
        try:
            return _PIPELINE.validate_python(data)
        except ValidationError as exc:
            lines = [f"{_path(e['loc']) or '<top level>'}: {_describe(e)}" for e in exc.errors()]
            more = "".join(f"\n{self.file}: {line}" for line in lines[1:])
            raise ConfigError(f"{self.file}: {lines[0]}{more}") from None


_PIPELINE = TypeAdapter(PipelineConfig)


def _path(loc: tuple) -> str:
    path = ""
    for part in loc:
        path = f"{path}[{part}]" if isinstance(part, int) else _join(path, str(part))
    return path


def _describe(error: Mapping[str, Any]) -> str:
    """Words for one pydantic error: what the key accepts and what it got."""
    kind, loc, got = error["type"], tuple(error["loc"]), error.get("input")
    hint = _hint_at(loc)
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        return f"unknown key; accepted keys here: {_keys(_hint_at(loc[:-1]))}"
    if kind == "missing":
        return "missing required key" + _section_hint(hint)
    if kind == "literal_error":
        return f"expected one of {', '.join(map(str, typing.get_args(hint)))}, got {_show(got)}"
    if kind == "dataclass_type":
        return f"expected a mapping with keys {_keys(hint)}, got {_show(got)}"
    words = {
        "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
        "bool_type": "true or false", "bool_parsing": "true or false", "string_type": "a string",
        "tuple_type": "a list", "list_type": "a list", "dict_type": "a mapping", "mapping_type": "a mapping",
    }
    if kind in words:
        return f"expected {words[kind]}, got {_show(got)}"
    return str(error["msg"]).removeprefix("Value error, ")


def _hint_at(loc: tuple) -> Any:
    """The schema type at a key path (None past a free-form mapping)."""
    hint: Any = PipelineConfig
    for part in loc:
        hint = _unwrap(hint)
        if dataclasses.is_dataclass(hint) and isinstance(part, str):
            hint = typing.get_type_hints(hint, include_extras=True).get(part)
        elif typing.get_origin(hint) is tuple and isinstance(part, int):
            hint = typing.get_args(hint)[0]
        else:
            return None
    return _unwrap(hint)


def _unwrap(hint: Any) -> Any:
    """`Annotated[X, ...]` -> X, `X | None` -> X."""
    while True:
        if typing.get_origin(hint) is Annotated:
            hint = typing.get_args(hint)[0]
        elif typing.get_origin(hint) in (Union, types.UnionType):
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        else:
            return hint


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _keys(cls: Any) -> str:
    if not dataclasses.is_dataclass(cls):
        return "none (free-form values)"
    return ", ".join(f.name for f in dataclasses.fields(cls) if f.init and f.name != "file")


def _section_hint(hint: Any) -> str:
    return f" (a section with keys {_keys(hint)})" if dataclasses.is_dataclass(hint) else ""


def _show(value: Any) -> str:
    kind = "null" if value is None else type(value).__name__.replace("_FromEnv", "str")
    return f"{value!r} ({kind})"


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
    config = loader.build(expand_env_refs(data, file, os.environ if env is None else env, mark=_FromEnv))
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
    if config.metrics is not None and not 1 <= config.metrics.port <= 65535:
        raise loader.error("metrics.port", f"expected a TCP port 1-65535, got {config.metrics.port}")
    source_options = {"etcd.endpoints": config.source.etcd_endpoints, **config.source.options}
    for key, problem in check_feed(config.speedlayer, source_options) if config.speedlayer is not None else ():
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
