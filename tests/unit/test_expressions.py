"""`ExpressionCache`: what a query builds once and reuses on every micro-batch."""

from __future__ import annotations

from pipelines.expressions import ExpressionCache


def test_each_key_is_built_once_and_an_empty_cache_is_still_the_one_used():
    cache = ExpressionCache()
    calls: list[str] = []

    def build(name: str):
        return lambda: calls.append(name) or [name]

    first = cache.get(("a", 1), build("a"))
    assert cache.get(("a", 1), build("again")) is first
    assert cache.get(("b",), build("b")) == ["b"]
    assert calls == ["a", "b"]
    assert ExpressionCache()  # a fresh (empty) cache is truthy: `cache or ExpressionCache()` would keep it
