"""The worker's SQL guard remembers what it accepted and refuses anew every time."""

from __future__ import annotations

import pytest

from speedlayer.errors import InvalidQueryError
from speedlayer.worker import sql_guard


@pytest.fixture
def parses(monkeypatch) -> list[str]:
    """The texts the guard parsed (the real parser, counted), from an empty memory."""
    seen: list[str] = []
    real = sql_guard._parse_tree

    def counted(sql: str):
        seen.append(sql)
        return real(sql)

    monkeypatch.setattr(sql_guard, "_parse_tree", counted)
    sql_guard._accepted.cache_clear()
    yield seen
    sql_guard._accepted.cache_clear()


def test_an_accepted_query_is_parsed_once(parses):
    sql = "SELECT count(*) FROM orders"
    for _ in range(3):
        sql_guard.check_query(sql, "orders")
    assert parses == [sql]


def test_acceptance_is_per_dataset(parses):
    sql_guard.check_query("SELECT * FROM orders", "orders")
    with pytest.raises(InvalidQueryError, match="it reads 'orders'"):
        sql_guard.check_query("SELECT * FROM orders", "payments")


def test_a_refused_query_is_refused_every_time(parses):
    sql = "SELECT * FROM read_text('/etc/passwd')"
    for _ in range(2):
        with pytest.raises(InvalidQueryError, match=r"table function read_text\(\) is not allowed"):
            sql_guard.check_query(sql, "orders")
    assert parses == [sql, sql]
