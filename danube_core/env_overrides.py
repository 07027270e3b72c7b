"""Configuration values from the environment: the one implementation every part uses.

Two forms, because a value can come from the environment in two ways:

* **Overrides by name** (the broker's `DANUBE_...`, the speed layer's `SPEEDLAYER_...`):
  `<PREFIX><KEY>__<KEY>...=<value>` sets that key of the loaded YAML mapping, e.g.
  `DANUBE_BROKER__PORTS__CLIENT=6651` or `SPEEDLAYER_ETCD__ENDPOINTS=10.0.0.5:2379`. The part
  after the prefix is lower-cased to give the keys (keys are snake_case), values are read as YAML
  (`null`, `true`, numbers, `[a, b]`, `{acme: t0k}`), and only variables whose first key is one
  of the file's sections are used, so unrelated variables sharing the prefix are left alone.
  A secret (a key named `password`) is taken exactly as written: YAML would turn `12345` into
  a number and cut `pw #1` at the `#`.
* **References inside values** (pipeline files): `${VAR}` and `${VAR:-default}` in any string
  are replaced from the environment (`expand_env_refs`).

Errors are `ConfigError`s naming the variable and the file, never the value: overrides are
where passwords come from.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Collection, Mapping

import yaml

from danube_core.errors import ConfigError

SEPARATOR = "__"
# Final keys whose override is taken verbatim (not parsed as YAML): secrets.
VERBATIM_KEYS = frozenset({"password"})

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def override_path(name: str, prefix: str, sections: Collection[str]) -> list[str] | None:
    """The lower-cased key path `name` overrides (`DANUBE_META_STORE__PORT` -> `[meta_store,
    port]`), or None when the variable is not an override: another prefix, an unknown first
    section, or an empty key (`A____B`)."""
    if not name.startswith(prefix):
        return None
    path = [part.lower() for part in name[len(prefix):].split(SEPARATOR)]
    if path[0] not in sections or not all(path):
        return None
    return path


def override_value(name: str, text: str, path: list[str], source: str) -> Any:
    """The value of one override: YAML, or the text itself for a secret (module doc)."""
    if path[-1] in VERBATIM_KEYS:
        return text
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        # yaml's message quotes the text, which may be a secret: say where, not what.
        raise ConfigError(
            f"environment variable {name} (overriding {'.'.join(path)} of {source}) is not a YAML value; "
            "quote it if it is meant as text"
        ) from None


def apply_env_overrides(data: dict[str, Any], environ: Mapping[str, str], *, prefix: str,
                        sections: Collection[str], source: str) -> list[str]:
    """Set `data[a][b]... = value` for every `<prefix>A__B...` in `environ` whose first key is in
    `sections`; returns the variable names used (for a log line: names, never values).

    Variables are applied in sorted order, so of two naming the same key the later name wins
    the same way every time; a key holding a non-mapping where the path needs a mapping is
    replaced by one. `source` (the file) is named in errors."""
    used = []
    for name, text in sorted(environ.items()):
        path = override_path(name, prefix, sections)
        if path is None:
            continue
        value = override_value(name, text, path, source)
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[path[-1]] = value
        used.append(name)
    return used


def expand_env_refs(data: Any, source: str, environ: Mapping[str, str], path: str = "",
                    mark: Callable[[str], str] = str) -> Any:
    """`data` with `${VAR}` / `${VAR:-default}` replaced in every string of the tree.

    A string that held a reference is passed through `mark` (a pipeline file marks them, so
    `${BATCH}` may stand for a number). An unset variable without a default raises
    ConfigError naming `source`, the key path and the variable."""
    if isinstance(data, str):
        if "${" not in data:
            return data

        def substitute(match: re.Match) -> str:
            name, default = match.group(1), match.group(2)
            if name in environ:
                return environ[name]
            if default is not None:
                return default
            raise ConfigError(
                f"{source}: {path or '<top level>'}: environment variable {name!r} is not set "
                f"(set it, or write ${{{name}:-default}})"
            )

        return mark(_ENV_REF.sub(substitute, data))
    if isinstance(data, Mapping):
        return {k: expand_env_refs(v, source, environ, _join(path, str(k)), mark) for k, v in data.items()}
    if isinstance(data, list):
        return [expand_env_refs(v, source, environ, f"{path}[{i}]", mark) for i, v in enumerate(data)]
    return data


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
