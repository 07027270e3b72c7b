"""The capped-backoff retry wrapper: what is retried, how long it waits, when it gives up."""

from __future__ import annotations

import pytest

from danube_core.errors import (
    MetadataError,
    MetadataUnavailableError,
    ObjectMissingError,
    ObjectStoreError,
)
from danube_core.retry import RetryPolicy, call_with_retry

NO_JITTER = RetryPolicy(
    max_attempts=5, initial_backoff_s=0.1, max_backoff_s=0.3, deadline_s=100.0, jitter_ratio=0.0
)


class FakeClock:
    """Time that only moves when the wrapper sleeps, so tests run instantly."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def failing(times: int, error: Exception, result: str = "ok"):
    calls = {"n": 0}

    def fn() -> str:
        calls["n"] += 1
        if calls["n"] <= times:
            raise error
        return result

    return fn, calls


def run(fn, policy: RetryPolicy = NO_JITTER, clock: FakeClock | None = None):
    clock = clock or FakeClock()
    return call_with_retry(fn, what="test op", policy=policy, sleep=clock.sleep, clock=clock.clock)


def test_retriable_error_is_retried_until_success_with_capped_doubling_backoff():
    clock = FakeClock()
    fn, calls = failing(4, MetadataUnavailableError("etcd down"))
    assert run(fn, clock=clock) == "ok"
    assert calls["n"] == 5
    assert clock.sleeps == pytest.approx([0.1, 0.2, 0.3, 0.3])


@pytest.mark.parametrize(
    "error",
    [
        MetadataError("bad key /x"),
        ObjectMissingError("object s3://b/k does not exist"),
        ValueError("bug"),
    ],
)
def test_non_retriable_errors_are_raised_at_once(error):
    clock = FakeClock()
    fn, calls = failing(1, error)
    with pytest.raises(type(error)):
        run(fn, clock=clock)
    assert calls["n"] == 1 and clock.sleeps == []


def test_instance_level_retriable_flag_is_honoured():
    permanent = ObjectStoreError("access denied on s3://b/k")
    permanent.retriable = False
    fn, calls = failing(1, permanent)
    with pytest.raises(ObjectStoreError):
        run(fn)
    assert calls["n"] == 1


def test_gives_up_after_max_attempts_with_the_last_error():
    error = ObjectStoreError("connection reset")
    fn, calls = failing(10, error)
    with pytest.raises(ObjectStoreError) as raised:
        run(fn)
    assert raised.value is error
    assert calls["n"] == NO_JITTER.max_attempts


def test_gives_up_when_the_next_delay_would_pass_the_deadline():
    clock = FakeClock()
    policy = RetryPolicy(
        max_attempts=100, initial_backoff_s=1.0, max_backoff_s=1.0, deadline_s=2.5, jitter_ratio=0.0
    )
    fn, calls = failing(100, MetadataUnavailableError("etcd down"))
    with pytest.raises(MetadataUnavailableError):
        run(fn, policy=policy, clock=clock)
    assert clock.sleeps == [1.0, 1.0]
    assert calls["n"] == 3


def test_jitter_only_shortens_delays():
    clock = FakeClock()
    policy = RetryPolicy(
        max_attempts=6, initial_backoff_s=0.1, max_backoff_s=0.4, deadline_s=100.0, jitter_ratio=0.5
    )
    fn, _ = failing(5, MetadataUnavailableError("etcd down"))
    run(fn, policy=policy, clock=clock)
    for delay, base in zip(clock.sleeps, [0.1, 0.2, 0.4, 0.4, 0.4]):
        assert base * 0.5 <= delay <= base


@pytest.mark.parametrize(
    "field, value",
    [("max_attempts", 0), ("initial_backoff_s", -1.0), ("max_backoff_s", 0.01), ("multiplier", 0.5),
     ("deadline_s", -1.0), ("jitter_ratio", 1.5)],
)
def test_invalid_policy_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        RetryPolicy(**{field: value})
