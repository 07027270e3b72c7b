"""The shared lease election (`danube_core.election`) on a real etcd server.

The broker's `/cluster/leader` must stay what the real Danube v0.7.3 broker writes and reads
(spec: the broker id as a JSON number under a 14 s lease kept alive about every 7 s), since
our brokers and real ones may share a cluster; the masters of the speed layer use the same
class with their own key. Failover through real broker processes is in test_broker_failover.
"""

from __future__ import annotations

import pyetcd
import pytest

from broker.leader import broker_election
from danube_core.election import LeaseElection
from danube_core.keys import LEADER_KEY
from danube_core.records import dump_u64
from tests.rig import eventually

pytestmark = pytest.mark.integration

BROKER_ID = 5951367860471965214  # an id as real Danube brokers draw them (u64)


@pytest.fixture
def etcd_client(etcd_endpoint):
    host, port = etcd_endpoint.rsplit(":", 1)
    client = pyetcd.client(host=host, port=int(port))
    yield client
    client.close()


@pytest.fixture
def clean_leader_key(metadata):
    """`/cluster/leader` is one key for the whole etcd server: no broker may hold it here."""
    eventually(lambda: metadata.get(LEADER_KEY) is None, 40)  # a broker test's lease expiring
    yield
    metadata.delete(LEADER_KEY)


def test_broker_election_writes_the_danube_leader_value_and_lease(metadata, etcd_client, clean_leader_key):
    elected = []
    election = broker_election(metadata, BROKER_ID, 14, 0.2, on_elected=lambda: elected.append(1),
                               on_deposed=lambda: None)
    election.start()
    try:
        eventually(lambda: election.is_leader, 10)
        value, meta = etcd_client.get(LEADER_KEY)
        assert value == b"5951367860471965214" == dump_u64(BROKER_ID)
        assert meta.lease_id != 0
        assert etcd_client.get_lease_info(meta.lease_id).grantedTTL == 14
        assert election._keep_alive_interval_s == 7.0  # Danube refreshes every half TTL
        assert elected == [1]
    finally:
        election.stop()
    assert metadata.get(LEADER_KEY) is None  # a stopping leader gives the key up at once


def test_broker_follows_a_leader_value_written_by_a_real_broker(metadata, clean_leader_key):
    """A key written by another (real) broker is never taken over while its lease lives."""
    lease = metadata.grant_lease(30)
    assert metadata.put_if_absent(LEADER_KEY, dump_u64(BROKER_ID + 1), lease=lease)
    election = broker_election(metadata, BROKER_ID, 2, 0.05, on_elected=lambda: None, on_deposed=lambda: None)
    election.start()
    try:
        assert election.leader_id() == b"5951367860471965215"
        lease.revoke()  # the real broker died: its key goes with the lease
        eventually(lambda: election.is_leader, 10)
        assert metadata.get(LEADER_KEY) == dump_u64(BROKER_ID)
    finally:
        election.stop()


def test_leader_steps_down_when_another_holds_the_key(metadata, unique_name):
    key = f"/{unique_name('election')}/leader"
    deposed = []
    election = LeaseElection(metadata, key, b"a", ttl_s=5, check_interval_s=0.05,
                             on_deposed=lambda: deposed.append(1))
    election.start()
    try:
        eventually(lambda: election.is_leader, 10)
        metadata.put(key, b"b")  # an operator (or a split brain) hands the key to another id
        eventually(lambda: not election.is_leader, 10)
        assert deposed == [1]
    finally:
        election.stop()
        metadata.delete(key)


def test_follower_takes_over_when_the_leader_stops(metadata, unique_name):
    key = f"/{unique_name('election')}/leader"
    first = LeaseElection(metadata, key, b"first", ttl_s=5, check_interval_s=0.05)
    # its periodic check comes too late for the test's deadline: only the watch can wake it
    second = LeaseElection(metadata, key, b"second", ttl_s=5, check_interval_s=300.0)
    first.start()
    try:
        eventually(lambda: first.is_leader, 10)
        second.start()
        assert not second.is_leader and second.leader_id() == b"first"
    finally:
        first.stop()
    try:
        eventually(lambda: second.is_leader, 30)
        assert metadata.get(key) == b"second"
    finally:
        second.stop()
        metadata.delete(key)


@pytest.mark.parametrize("ttl_s, keep_alive_s", [(0, None), (4, 4.0), (4, 0.0), (4, -1.0)])
def test_bad_election_timing_is_refused(metadata, ttl_s, keep_alive_s):
    with pytest.raises(ValueError, match="ttl_s" if keep_alive_s is None else "keep_alive_interval_s"):
        LeaseElection(metadata, "/x/leader", b"a", ttl_s=ttl_s, keep_alive_interval_s=keep_alive_s)
