"""How one `danube` option's text becomes a value: a ConfigError names the option, the value
and what is accepted.

Generic over the option: each parser takes the options (keys already lower-cased by
`connectors.options`) and the key. Imported in every executor Python worker with
`connectors.options`, so it imports nothing heavy.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from danube_core.errors import ConfigError

_SIZE = re.compile(r"^(\d+)\s*(?:([kmgt])(?:i?b)?|b)?$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION = re.compile(r"^(\d+)\s*(ms|s|m|min|h|d)?$", re.IGNORECASE)
_DURATION_MS = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
_SIZE_FORM = "a number of bytes, optionally with a binary unit k/m/g/t (e.g. 134217728, 128m, 1GiB)"
_DURATION_FORM = "a duration: a number of milliseconds or a number with unit ms/s/m/h/d (e.g. 500ms, 15m)"


def invalid(key: str, value: Any, accepted: str) -> ConfigError:
    """The error for a malformed value: the option, the value and what is accepted."""
    return ConfigError(f"invalid value {value!r} for option {key!r}: expected {accepted}")


def get(opts: Mapping[str, str], key: str) -> str | None:
    """The option's value without surrounding blanks; None when it is not given."""
    value = opts.get(key.lower())
    return None if value is None else value.strip()


def required(opts: Mapping[str, str], key: str) -> str:
    value = get(opts, key)
    if not value:
        raise ConfigError(f"option {key!r} is required")
    return value


def boolean(opts: Mapping[str, str], key: str, default: bool) -> bool:
    value = get(opts, key)
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise invalid(key, value, "true or false")
    return value.lower() == "true"


def integer(opts: Mapping[str, str], key: str, *, minimum: int) -> int | None:
    value = get(opts, key)
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or int(value) < minimum:
        raise invalid(key, value, f"an integer >= {minimum}")
    return int(value)


def size(opts: Mapping[str, str], key: str) -> int | None:
    value = get(opts, key)
    if value is None:
        return None
    match = _SIZE.match(value)
    if match is None or int(match.group(1)) == 0:
        raise invalid(key, value, _SIZE_FORM + ", > 0")
    return int(match.group(1)) * _SIZE_UNITS[(match.group(2) or "").lower()]


def duration_ms(opts: Mapping[str, str], key: str, default: int) -> int:
    value = get(opts, key)
    if value is None:
        return default
    match = _DURATION.match(value)
    if match is None:
        raise invalid(key, value, _DURATION_FORM)
    unit = match.group(2).lower() if match.group(2) else None
    return int(match.group(1)) * _DURATION_MS[unit]
