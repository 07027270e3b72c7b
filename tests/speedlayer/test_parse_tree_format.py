"""The DuckDB parse-tree probe: the installed DuckDB passes, a tree without a key the rewriters
read is refused naming the version and the supported range, and workers and gateways do not
start on such a DuckDB (setup.cfg once allowed duckdb>=1.2,<3 while only 2.0 was tested)."""

from __future__ import annotations

import configparser
import copy
from pathlib import Path

import pytest

from danube_core.errors import ConfigError
from speedlayer import __main__ as speedlayer_main
from speedlayer.protocol.parse_tree_format import (
    PROBE_SQL, SUPPORTED_DUCKDB, check_format, check_installed_duckdb, format_problems,
)
from speedlayer.protocol.sql_tree import parse_tree

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_duckdb_writes_the_format_the_speed_layer_reads():
    check_installed_duckdb()
    assert format_problems(parse_tree(PROBE_SQL)) == []


def test_a_tree_without_group_expressions_is_refused_naming_the_version_and_the_range():
    tree = copy.deepcopy(parse_tree(PROBE_SQL))
    del tree["statements"][0]["node"]["group_expressions"]
    tree["statements"][0]["node"]["from_table"]["type"] = "TABLE_REF"
    with pytest.raises(ConfigError) as info:
        check_format(tree, "2.1.0")
    message = str(info.value)
    assert message.startswith("DuckDB 2.1.0 writes a parse tree (json_serialize_sql) the speed layer cannot read")
    assert "no statements.0.node.group_expressions.0" in message
    assert "statements.0.node.from_table.type is 'TABLE_REF', not 'BASE_TABLE'" in message
    assert f"supports {SUPPORTED_DUCKDB}" in message


def test_setup_cfg_allows_the_duckdb_the_probe_names():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    wanted = [line.strip() for line in setup["options.extras_require"]["speedlayer"].splitlines()
              if line.strip().startswith("duckdb")]
    assert wanted == [SUPPORTED_DUCKDB]


@pytest.mark.parametrize("argv", [["worker", "--tenant", "acme", "--id", "w1", "--masters", "127.0.0.1:1"],
                                  ["gateway", "--config", "conf/speedlayer.yaml"]])
def test_workers_and_gateways_do_not_start_on_a_duckdb_whose_tree_differs(argv, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(speedlayer_main, "check_installed_duckdb", lambda: check_format({"statements": []}, "9.9.9"))
    monkeypatch.setattr(speedlayer_main.SUBCOMMANDS[argv[0]], "run", lambda args: started.append(args) or 0)
    assert speedlayer_main.main(argv) == 2
    assert not started
    assert "DuckDB 9.9.9 writes a parse tree" in capsys.readouterr().err
