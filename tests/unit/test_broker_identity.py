"""A broker's identity across restarts: the data-dir lock, the identity file, resuming a lease."""

from __future__ import annotations

import pytest

from broker.identity import (
    IDENTITY_FILE, BrokerIdentity, DataDirLock, read_identity, resume_identity, write_identity,
)
from danube_core.errors import ConfigError
from danube_core.keys import register_key
from danube_core.metadata_memory import MemoryMetadataStore

pytestmark = pytest.mark.unit


def test_one_live_broker_per_wal_root(tmp_path):
    lock = DataDirLock(str(tmp_path))
    with pytest.raises(ConfigError, match=f"{tmp_path} is in use by another running broker"):
        DataDirLock(str(tmp_path))
    lock.release()
    DataDirLock(str(tmp_path)).release()  # free again once the holder is gone


def test_identity_round_trip_and_unreadable_files(tmp_path):
    assert read_identity(str(tmp_path)) is None
    write_identity(str(tmp_path), BrokerIdentity(2**63 + 5, 0x1234))
    assert read_identity(str(tmp_path)) == BrokerIdentity(2**63 + 5, 0x1234)
    (tmp_path / IDENTITY_FILE).write_text('{"broker_id": 1')  # torn: start as a new broker
    assert read_identity(str(tmp_path)) is None


def test_resume_only_a_live_lease_that_still_holds_the_registration():
    store = MemoryMetadataStore()
    lease = store.grant_lease(30)
    store.put(register_key(7), b"{}", lease=lease)
    resumed = resume_identity(store, BrokerIdentity(7, lease.id), 30)
    assert resumed is not None and resumed.id == lease.id
    assert resume_identity(store, BrokerIdentity(8, lease.id), 30) is None  # not that broker's registration
    assert resume_identity(store, None, 30) is None
    lease.revoke()  # the registration went with it: the leader may have moved the topics
    assert resume_identity(store, BrokerIdentity(7, lease.id), 30) is None
