"""Capped exponential backoff for calls that fail with a retriable `DanubeError`.

The metadata store (etcd) and the object store (fsspec) both retry their reads through this one
wrapper, so the retry rules live in one place: only errors whose `retriable` flag is set are
retried (a missing object or a bad key will not get better by waiting), the delay doubles up
to a cap, and both the number of attempts and the total time are bounded so a dead backend
surfaces as an error instead of a hang. Writes are not retried here: whether a write may be
repeated is the caller's decision.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from danube_core.errors import DanubeError

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry.

    `max_attempts` counts the first call. The delay before retry `n` (1-based) is
    `min(max_backoff_s, initial_backoff_s * multiplier**(n-1))`, shortened by up to
    `jitter_ratio` of itself at random so many clients do not retry in lockstep. No retry
    starts if its delay would end after `deadline_s` from the first call.
    """

    max_attempts: int = 5
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    deadline_s: float = 10.0
    jitter_ratio: float = 0.2

    def __post_init__(self) -> None:
        checks = {
            "max_attempts": self.max_attempts >= 1,
            "initial_backoff_s": self.initial_backoff_s >= 0,
            "max_backoff_s": self.max_backoff_s >= self.initial_backoff_s,
            "multiplier": self.multiplier >= 1,
            "deadline_s": self.deadline_s >= 0,
            "jitter_ratio": 0 <= self.jitter_ratio <= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(
                    f"RetryPolicy.{name}={getattr(self, name)!r} is invalid: expected "
                    "max_attempts >= 1, 0 <= initial_backoff_s <= max_backoff_s, "
                    "multiplier >= 1, deadline_s >= 0, 0 <= jitter_ratio <= 1"
                )

    def backoff_s(self, retry_number: int) -> float:
        """Delay before retry `retry_number` (1-based), before jitter."""
        return min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (retry_number - 1))


DEFAULT_RETRY_POLICY = RetryPolicy()


def call_with_retry(
    fn: Callable[[], T],
    *,
    what: str,
    policy: RetryPolicy = DEFAULT_RETRY_POLICY,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Call `fn` until it succeeds, raises a non-retriable error, or the policy is exhausted.

    `what` names the operation (and its key or URL) in the log lines. The last error is
    re-raised unchanged, so callers see the same class and message as without retries.
    Exceptions that are not `DanubeError` are never retried: the boundary must translate
    third-party errors first.
    """
    deadline = clock() + policy.deadline_s
    attempt = 1
    while True:
        try:
            return fn()
        except DanubeError as exc:
            if not exc.retriable or attempt >= policy.max_attempts:
                raise
            delay = policy.backoff_s(attempt) * (1.0 - policy.jitter_ratio * random.random())
            if clock() + delay > deadline:
                raise
            logger.warning(
                "%s failed (attempt %d of %d), retrying in %.2fs: %s",
                what, attempt, policy.max_attempts, delay, exc,
            )
            sleep(delay)
            attempt += 1
