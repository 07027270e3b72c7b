"""JSON text exactly as the broker's `serde_json::to_vec` writes it (spec §5.1), and reading it.

serde_json serialises through `serde_json::Value` (a BTreeMap): keys sorted, compact, non-ASCII
unescaped. Python's `json` matches that for everything except floats: both print the shortest
digits that round-trip, but Rust (the `ryu` crate's formatting) switches to exponent form at
other thresholds and writes the exponent without `+` or zero padding. The real broker's load
reports hold values such as `6.319877954297229e-8`, which Python writes as
`6.319877954297229e-08` (golden corpus, `/cluster/load/<id>`); `format_f64` gives Rust's text.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

from danube_core.errors import MetadataError


def format_f64(value: float) -> str:
    """`value` as serde_json prints an f64: ryu's shortest form; non-finite becomes `null`.

    ryu writes plain decimals for 1e-5 <= |v| < 1e16 (`0.00001`, `12340000000.0`, always with a
    `.`), and `d.ddde<exp>` otherwise (`1e16`, `6.3e-8`). Python's `repr` has the same digits
    (shortest round-trip, closest on ties) but another layout, so only the digits are taken.
    """
    if not math.isfinite(value):
        return "null"  # serde_json turns NaN and infinities into Value::Null
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0.0"
    _, digit_tuple, exponent = Decimal(repr(abs(value))).as_tuple()
    assert isinstance(exponent, int)  # a finite value's exponent ('n'/'N'/'F' mark NaN/inf)
    digits = "".join(map(str, digit_tuple)).rstrip("0")
    exponent += len(digit_tuple) - len(digits)  # value = int(digits) * 10**exponent
    length = len(digits)
    point = length + exponent  # 10**(point-1) <= value < 10**point
    if 0 <= exponent and point <= 16:
        text = digits + "0" * exponent + ".0"
    elif 0 < point <= 16:
        text = digits[:point] + "." + digits[point:]
    elif -5 < point <= 0:
        text = "0." + "0" * -point + digits
    elif length == 1:
        text = f"{digits}e{point - 1}"
    else:
        text = f"{digits[0]}.{digits[1:]}e{point - 1}"
    return sign + text


def _has_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_has_float(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_float(v) for v in value)
    return False


def _text(value: Any) -> str:
    """Compact sorted JSON with Rust floats; only used for values holding a float."""
    if isinstance(value, float):
        return format_f64(value)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"JSON object keys must be strings, got {list(value)!r}")
        items = sorted(value.items())
        return "{" + ",".join(f"{_text(k)}:{_text(v)}" for k, v in items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_text(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def dump_json(value: Any) -> bytes:
    """Bytes identical to `serde_json::to_vec` of a `Value` (compact, sorted, UTF-8, Rust floats)."""
    if _has_float(value):
        return _text(value).encode()
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def load_json(raw: bytes, key: str) -> Any:
    """Parse an etcd value; MetadataError naming `key` if it is not valid JSON."""
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MetadataError(f"etcd key {key!r} does not hold valid JSON ({exc}): {raw[:200]!r}") from exc
