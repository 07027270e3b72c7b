"""`danube_core.records.dump_json` writes floats as serde_json does (Rust's shortest form), so
every value in the golden etcd dumps, parsed and dumped again, gives the broker's exact bytes."""

from __future__ import annotations

import json
import math

import pytest

from danube_core.json_text import format_f64 as rust_float_text
from danube_core.records import dump_json
from tests.golden import GOLDEN_DIR, require_golden



@pytest.mark.parametrize("value, text", [
    (0.0, "0.0"), (-0.0, "-0.0"), (12.5, "12.5"), (1.0, "1.0"),
    (2.803930421180213e-8, "2.803930421180213e-8"), (1e-7, "1e-7"), (1e-6, "1e-6"),
    (5e-5, "0.00005"), (1.5e-5, "0.000015"), (-1.25e-5, "-0.0000125"), (1e-5, "0.00001"),
    (0.0001, "0.0001"), (0.00012, "0.00012"),
    (44098212617.0, "44098212617.0"), (1e15, "1000000000000000.0"), (1e16, "1e16"),
    (1.2345e20, "1.2345e20"), (-3e300, "-3e300"), (5e-324, "5e-324"),
    (math.nan, "null"), (math.inf, "null"),
])
def test_floats_are_written_as_rust_writes_them(value, text):
    assert rust_float_text(value) == text
    if math.isfinite(value):
        assert float(text) == value or (value == 0 and text.startswith("-") == (math.copysign(1, value) < 0))


def test_dump_json_keeps_integers_strings_and_order_as_json_does():
    value = {"b": [1, 2.5, None, True, "é\n"], "a": {"z": 1e-7, "y": (18446744073709551615,)}}
    assert dump_json(value) == '{"a":{"y":[18446744073709551615],"z":1e-7},"b":[1,2.5,null,true,"é\\n"]}'.encode()


def test_every_golden_etcd_value_dumps_back_to_the_brokers_bytes():
    dumps = sorted(require_golden().glob("*/etcd.jsonl"))
    assert dumps, f"no etcd.jsonl in the golden corpus at {GOLDEN_DIR}"
    checked = 0
    for dump in dumps:
        for line in dump.read_text(encoding="utf-8").splitlines():
            raw = json.loads(line)["value"].encode()
            assert dump_json(json.loads(raw)) == raw, f"{dump.parent.name}: {raw[:200]!r}"
            checked += 1
    assert checked > 50
