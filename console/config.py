"""The console's YAML (`conf/console.yaml`) with `CONSOLE_A__B=<yaml>` environment overrides,
checked up front into a frozen `ConsoleConfig`; the `etcd:` section is parsed by the one parser
every part uses (`danube_core.etcd_settings`), so TLS, user and password work as elsewhere.

Actions (admission, drain) are off unless `actions.allowed` (or `--allow-actions`) and a token
are both given; the token comes from `actions.token_file` or `CONSOLE_ACTIONS__TOKEN`, never from
a command-line flag (`ps` shows those), and is never in a repr.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from danube_core.env_overrides import apply_env_overrides
from danube_core.errors import ConfigError
from danube_core.etcd_settings import SECTION_KEYS, EtcdKeyNames, EtcdSettings, parse_etcd_settings
from danube_core.keys import DEFAULT_ROOT_PREFIX

ENV_PREFIX = "CONSOLE_"
SECTIONS = ("listen", "etcd", "storage", "pipelines", "speedlayer", "brokers", "history", "actions", "browser")
# The keys of each section but etcd (checked by the shared etcd parser): a misspelt key is an
# error naming it, not a setting silently left at its default.
SECTION_KEYS_ACCEPTED = {
    "listen": ("host", "port"), "storage": ("url", "options", "root_prefix"), "pipelines": ("files", "env"),
    "speedlayer": ("key_root", "masters", "metrics"), "brokers": ("metrics_timeout_ms",),
    "history": ("interval_seconds", "samples"), "actions": ("allowed", "token", "token_file"),
    "browser": ("page_messages", "page_batches"),
}
DEFAULT_PORT = 8090


@dataclass(frozen=True)
class SpeedLayerSection:
    """Where the speed layer keeps its keys, whom actions go to, and its Prometheus endpoints."""

    key_root: str = ""
    masters: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()  # host:port or URL of masters'/gateways'/workers' /metrics


@dataclass(frozen=True)
class ConsoleConfig:
    """Everything the console reads, frozen. `pipelines`: pipeline files (`conf/pipelines/*.yaml`)
    whose tables and cursors the pipelines page shows; `pipeline_env`: values for their `${VAR}`s."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    etcd: EtcdSettings = field(default_factory=lambda: EtcdSettings("127.0.0.1:2379"))
    storage_url: str = "./danube-data/cloud-storage"
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    root_prefix: str = DEFAULT_ROOT_PREFIX
    pipelines: tuple[str, ...] = ()
    pipeline_env: Mapping[str, str] = field(default_factory=dict)
    speedlayer: SpeedLayerSection = field(default_factory=SpeedLayerSection)
    metrics_timeout_ms: int = 500
    history_interval_s: float = 10.0
    history_samples: int = 360
    page_messages: int = 50
    page_batches: int = 10
    actions_allowed: bool = False
    action_token: str | None = field(default=None, repr=False)

    @property
    def actions_enabled(self) -> bool:
        return self.actions_allowed and bool(self.action_token)


def load_console_config(path: str | None, *, allow_actions: bool = False,
                        environ: Mapping[str, str] | None = None) -> ConsoleConfig:
    """Read, override from the environment and check `path` (None: the defaults); ConfigError
    names the file and the key."""
    env = os.environ if environ is None else environ
    where = path or "<defaults>"
    data: dict[str, Any] = {}
    if path:
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"console config {path!r} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    apply_env_overrides(data, env, prefix=ENV_PREFIX, sections=SECTIONS, source=where)
    unknown = sorted(str(k) for k in data if k not in SECTIONS)
    if unknown:
        raise ConfigError(f"{where}: {unknown[0]}: unknown section; accepted: {', '.join(SECTIONS)}")
    return _build(data, where, allow_actions)


def _build(data: dict[str, Any], where: str, allow_actions: bool) -> ConsoleConfig:
    listen, storage = _section(data, "listen", where), _section(data, "storage", where)
    speed, history = _section(data, "speedlayer", where), _section(data, "history", where)
    actions, browser = _section(data, "actions", where), _section(data, "browser", where)
    pipelines = data.get("pipelines") or {}
    if isinstance(pipelines, list):
        pipelines = {"files": pipelines}
    if not isinstance(pipelines, dict):
        raise ConfigError(f"{where}: pipelines: expected a list of pipeline files or a mapping with `files`")
    _check_keys(pipelines, "pipelines", where)
    token = actions.get("token")
    if token is None and actions.get("token_file"):
        try:
            token = Path(str(actions["token_file"])).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"{where}: actions.token_file: cannot be read: {exc}") from exc
    allowed = bool(actions.get("allowed", False)) or allow_actions
    if allowed and not token:
        raise ConfigError(f"{where}: actions are allowed but no token is set (actions.token_file or "
                          f"{ENV_PREFIX}ACTIONS__TOKEN)")
    return ConsoleConfig(
        host=str(listen.get("host", "127.0.0.1")), port=_int(listen, "listen.port", where, DEFAULT_PORT, 0),
        etcd=_etcd(data, where),
        storage_url=str(storage.get("url", "./danube-data/cloud-storage")),
        storage_options=dict(storage.get("options") or {}),
        root_prefix=str(storage.get("root_prefix", DEFAULT_ROOT_PREFIX)),
        pipelines=tuple(str(p) for p in pipelines.get("files") or ()),  # relative: to the working directory
        pipeline_env={str(k): str(v) for k, v in (pipelines.get("env") or {}).items()},
        speedlayer=SpeedLayerSection(str(speed.get("key_root", "") or ""), _strings(speed.get("masters")),
                                     _strings(speed.get("metrics"))),
        metrics_timeout_ms=_int(_section(data, "brokers", where), "brokers.metrics_timeout_ms", where, 500, 1),
        history_interval_s=float(history.get("interval_seconds", 10)),
        history_samples=_int(history, "history.samples", where, 360, 2),
        page_messages=_int(browser, "browser.page_messages", where, 50, 1),
        page_batches=_int(browser, "browser.page_batches", where, 10, 1),
        actions_allowed=allowed, action_token=str(token) if token else None,
    )


def _section(data: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    value = data.get(name) or {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {name}: expected a mapping")
    if name in SECTION_KEYS_ACCEPTED:
        _check_keys(value, name, where)
    return value


def _check_keys(section: Mapping[str, Any], name: str, where: str) -> None:
    accepted = SECTION_KEYS_ACCEPTED[name]
    unknown = sorted(str(k) for k in section if k not in accepted)
    if unknown:
        raise ConfigError(f"{where}: {name}.{unknown[0]}: unknown key; accepted: {', '.join(accepted)}")


def _etcd(data: dict[str, Any], where: str) -> EtcdSettings:
    etcd = _section(data, "etcd", where)
    unknown = sorted(str(k) for k in etcd if k not in SECTION_KEYS)
    if unknown:
        raise ConfigError(f"{where}: etcd.{unknown[0]}: unknown key; accepted: {', '.join(SECTION_KEYS)}")

    def error(key: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(f"{where}: {key}={value!r}: expected {expected}")

    names = EtcdKeyNames.section("etcd", where=f"console config {where}")
    return parse_etcd_settings(etcd, names, error, default_endpoints="127.0.0.1:2379")


def _int(section: Mapping[str, Any], key: str, where: str, default: int, minimum: int) -> int:
    value = section.get(key.rsplit(".", 1)[-1], default)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{where}: {key}={value!r}: expected an integer >= {minimum}")
    return value


def _strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(str(v) for v in value)

