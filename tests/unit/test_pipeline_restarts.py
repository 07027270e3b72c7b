"""Which query failures a pipeline cures by restarting its query (same JVM)."""

from __future__ import annotations

import pytest

from pipelines.runner import _worth_restarting

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("error, restart", [
    ("danube_core.errors.SubscriptionBusyError: subscription 's' is already consumed by a live query", True),
    ("MetadataError: subscription 's' is already consumed by a live query (etcd key ...)", False),  # type decides
    ("[STREAM_FAILED] Query ... terminated with exception: Python worker failed to connect back. SQLSTATE: XXKST", True),
    ("DataLossError: data loss in topic /default/t: offsets [0, 90)", False),
    ("SubscriptionLockLostError: subscription 's': lost the subscription lock", False),
])
def test_restartable_failures(error: str, restart: bool) -> None:
    assert _worth_restarting(error) is restart
