"""Column expressions a query builds once and reuses on every micro-batch.

Why: with classic PySpark each function that builds a `Column` (`F.col`, `F.when`, `==`,
`alias`, ...) is two or three Py4J round trips into the driver's JVM, and passing a list of
names or columns costs one more per element. A micro-batch of the pipeline built some 700 such
expressions anew, about 1 ms each on a loaded machine: most of a second of every batch spent
before Spark ran anything. A `Column` is an unresolved expression, so the same object serves
every batch of the query; a cache lives as long as the object that owns it (one query's
writer or decoder), never across Spark sessions.
"""

from __future__ import annotations

from typing import Callable, Hashable, TypeVar

T = TypeVar("T")


class ExpressionCache:
    """Values built once per key: `get(key, build)` calls `build()` the first time only."""

    def __init__(self) -> None:
        self._built: dict[Hashable, object] = {}

    @classmethod
    def given(cls, cache: "ExpressionCache | None") -> "ExpressionCache":
        """`cache`, or a new one for a caller that has none (tests, one-off use). Tested for
        None, not truth: an empty cache is still the query's cache."""
        return cls() if cache is None else cache

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        if key not in self._built:
            self._built[key] = build()
        return self._built[key]  # type: ignore[return-value]
