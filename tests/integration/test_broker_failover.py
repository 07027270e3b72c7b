"""Broker death and leader failover.

* kill -9 of the leader: another broker holds `/cluster/leader` within the lease TTL.
* kill -9 of a broker while a client produces, then a restart on the same WAL directory:
  every acknowledged message is readable and no offset is used twice.
* a dead broker's topic is reassigned to a survivor and continues after the last uploaded
  offset (recovered from storage), never at 0.
* kill -9 before the uploader ran: the survivor (its own WAL directory) uploads what the dead
  broker acknowledged from the dead broker's WAL; every acked message is readable, no offset
  is used twice.
"""

from __future__ import annotations

import asyncio
import glob
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from danube import DanubeClientBuilder, ProducerOptions, SubType

from danube_core.frames import iter_messages
from danube_core.keys import LEADER_KEY, cursor_key
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.records import parse_cursor, parse_u64
from danube_core.topics import TopicName
from tests.integration.broker_process import BrokerProcess, reliable_producer, run_admin
from tests.rig import eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _leader(etcd_endpoint: str) -> int | None:
    with EtcdMetadataStore(etcd_endpoint) as store:
        raw = store.get(LEADER_KEY)
        return None if raw is None else parse_u64(raw, LEADER_KEY)


def _owner(etcd_endpoint: str, topic: str) -> int | None:
    rows = run_admin(etcd_endpoint, "topics", "list", topic.split("/")[1])
    return next((row["owner"] for row in rows if row["topic"] == topic), None)


def _uploaded_through(etcd_endpoint: str, topic: str) -> int:
    rows = run_admin(etcd_endpoint, "topics", "storage", topic)
    return max((row["value"]["end_offset"] for row in rows if row["kind"] == "descriptor"), default=-1)


def _cursor(etcd_endpoint: str, topic: str, subscription: str) -> int | None:
    key = cursor_key(TopicName.parse(topic), subscription)
    with EtcdMetadataStore(etcd_endpoint) as store:
        raw = store.get(key)
    return None if raw is None else parse_cursor(raw, key)


async def _produce(url: str, topic: str, start: int, count: int) -> None:
    """Send f-<start>.. one by one; each send returns once the broker acknowledged it."""
    _, producer = await reliable_producer(url, topic, f"p-{start}")
    for i in range(start, start + count):
        await producer.send(f"f-{i}".encode())
    await producer.close()


async def _subscribe(url: str, topic: str, subscription: str):
    """An Exclusive consumer, attached (a new subscription starts at the latest offset)."""
    client = await DanubeClientBuilder().service_url(url).build()
    consumer = (client.new_consumer().with_topic(topic).with_consumer_name("reader")
                .with_subscription(subscription).with_subscription_type(SubType.EXCLUSIVE).build())
    await consumer.subscribe()
    return consumer, await consumer.receive()


async def _take(consumer, queue: asyncio.Queue, count: int) -> list:
    got = []
    for _ in range(count):
        msg = await asyncio.wait_for(queue.get(), 60)
        got.append(msg)
        await consumer.ack(msg)
    return got


async def _consume(url: str, topic: str, subscription: str, count: int) -> list:
    consumer, queue = await _subscribe(url, topic, subscription)
    got = await _take(consumer, queue, count)
    await consumer.close()
    return got


async def _produce_and_read_first(url: str, topic: str, subscription: str, produced: int, read: int) -> list:
    """Attach a consumer, produce 0..produced-1, receive and ack the first `read`."""
    consumer, queue = await _subscribe(url, topic, subscription)
    await _produce(url, topic, 0, produced)
    got = await _take(consumer, queue, read)
    await consumer.close()
    return got


def test_leader_failover_within_lease_ttl(etcd_endpoint, tmp_path):
    cloud = str(tmp_path / "cloud")
    brokers = [BrokerProcess(etcd_endpoint, tmp_path, f"b{i}", cloud).start() for i in range(2)]
    try:
        leader_id = eventually(lambda: _leader(etcd_endpoint) in {b.broker_id for b in brokers} and _leader(etcd_endpoint), 20)
        leader = next(b for b in brokers if b.broker_id == leader_id)
        survivor = next(b for b in brokers if b is not leader)
        killed_at = time.monotonic()
        leader.kill()
        eventually(lambda: _leader(etcd_endpoint) == survivor.broker_id, 15)
        # leader lease TTL 2 s (etcd may round small TTLs up), checked every 0.2 s
        assert time.monotonic() - killed_at < 10
    finally:
        for broker in brokers:
            broker.stop()


async def _produce_until(producer, sent: list, acked: list, stop: asyncio.Event) -> None:
    """Send m-0, m-1, ... until `stop`; `acked` gets those whose send returned."""
    i = 0
    while not stop.is_set():
        payload = f"m-{i}".encode()
        i += 1
        sent.append(payload)
        try:
            await producer.send(payload, {"i": str(i)})
        except Exception:  # not acknowledged: may or may not be stored
            await asyncio.sleep(0.05)
            continue
        acked.append(payload)


def _wal_offsets(wal_dir: str) -> list[tuple[int, bytes]]:
    found = []
    for path in glob.glob(os.path.join(wal_dir, "**", "wal*.log"), recursive=True):
        found += [(ref.offset, msg.payload) for ref, msg in iter_messages(Path(path).read_bytes(), path)]
    return found


async def _drain(queue: asyncio.Queue, consumer, received: dict) -> None:
    """Record payload -> offsets of every delivery, acking each."""
    while True:
        msg = await queue.get()
        received.setdefault(msg.payload, set()).add(msg.msg_id.topic_offset)
        await consumer.ack(msg)


async def _exclusive_consumer(client, topic: str):
    consumer = (client.new_consumer().with_topic(topic).with_consumer_name("crash-consumer")
                .with_subscription("crash-sub").with_subscription_type(SubType.EXCLUSIVE).build())
    await consumer.subscribe()
    return consumer, await consumer.receive()


def test_kill_9_while_producing_then_restart_keeps_every_acked_message(etcd_endpoint, tmp_path, unique_name):
    cloud = str(tmp_path / "cloud")
    procs = [BrokerProcess(etcd_endpoint, tmp_path, "a", cloud).start()]
    topic = f"/default/{unique_name('crash')}"
    sent, acked, received = [], [], {}

    async def scenario() -> None:
        client, producer = await reliable_producer(procs[0].url, topic, "crash-producer",
                                                   ProducerOptions(max_retries=3, base_backoff_ms=100))
        consumer, queue = await _exclusive_consumer(client, topic)
        stop = asyncio.Event()
        producing = asyncio.create_task(_produce_until(producer, sent, acked, stop))
        draining = asyncio.create_task(_drain(queue, consumer, received))
        await asyncio.to_thread(eventually, lambda: len(acked) >= 150, 60)
        procs[0].kill()
        acked_at_kill = len(acked)
        draining.cancel()
        await consumer.close()  # its client cannot follow a broker restart (unknown consumer id)
        procs.append(BrokerProcess(etcd_endpoint, tmp_path, "a", cloud, port=procs[0].port))
        await asyncio.to_thread(procs[1].start)
        await asyncio.to_thread(eventually, lambda: len(acked) >= acked_at_kill + 100, 90)
        stop.set()
        await producing
        await producer.close()
        fresh = await DanubeClientBuilder().service_url(procs[1].url).build()
        consumer, queue = await _exclusive_consumer(fresh, topic)
        draining = asyncio.create_task(_drain(queue, consumer, received))
        await asyncio.to_thread(eventually, lambda: set(acked) <= set(received), 60)
        draining.cancel()
        await consumer.close()

    try:
        asyncio.run(scenario())
        assert len(acked) >= 250
        by_offset: dict[int, bytes] = {}
        for payload, offsets in received.items():
            for offset in offsets:
                assert by_offset.setdefault(offset, payload) == payload, f"offset {offset} holds two messages"
        frames = _wal_offsets(procs[0].wal_dir)
        offsets = [offset for offset, _ in frames]
        assert len(offsets) == len(set(offsets)), "an offset was used twice in the WAL"
    finally:
        for proc in procs:
            proc.stop()


def test_kill_9_with_64_sends_in_flight_every_acked_message_is_in_the_wal_files(etcd_endpoint, tmp_path,
                                                                              unique_name):
    """Group commit under a pipelined producer: a send is acknowledged only after its frame is
    written (and fsynced: durable is on), so whatever the client saw acknowledged before the
    SIGKILL is in the WAL files the dead broker left. (A kill keeps the page cache, so this
    checks ack-after-write; tests/unit/test_durable_ack.py checks the frame is in the file.)"""
    proc = BrokerProcess(etcd_endpoint, tmp_path, "a", str(tmp_path / "cloud")).start()
    topic = f"/default/{unique_name('inflight')}"
    acked: list[bytes] = []
    in_flight_at_kill = []

    async def scenario() -> None:
        client, producer = await reliable_producer(proc.url, topic, "inflight-producer",
                                                   ProducerOptions(max_retries=1, base_backoff_ms=10))
        slots = asyncio.Semaphore(64)
        pending: set[asyncio.Task] = set()

        async def send(payload: bytes) -> None:
            try:
                await producer.send(payload, {})
            except Exception:  # not acknowledged: may or may not be stored
                return
            finally:
                slots.release()
            acked.append(payload)

        i = 0
        while len(acked) < 1500:
            await slots.acquire()
            task = asyncio.create_task(send(f"f-{i}".encode()))
            pending.add(task)
            task.add_done_callback(pending.discard)
            i += 1
        in_flight_at_kill.append(len(pending))
        proc.kill()
        await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 120)

    try:
        asyncio.run(scenario())
        assert in_flight_at_kill[0] > 1, "the kill should land while sends are pipelined"
        stored = _wal_offsets(proc.wal_dir)
        offsets = [offset for offset, _ in stored]
        assert len(offsets) == len(set(offsets)), "an offset was used twice in the WAL"
        missing = set(acked) - {payload for _, payload in stored}
        assert not missing, f"{len(missing)} acknowledged messages are not in the WAL, e.g. {sorted(missing)[:5]}"
    finally:
        proc.stop()


@contextmanager
def doomed_and_survivor(etcd_endpoint: str, tmp_path, topic: str,
                        doomed_config: dict | None = None) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    """Two brokers on one cloud: `topic` created and owned by "doomed", then "survivor" started
    to take it over; both stopped at the end (a killed one too)."""
    cloud = str(tmp_path / "cloud")
    overrides = {"wal_cloud": doomed_config} if doomed_config else {}
    doomed = BrokerProcess(etcd_endpoint, tmp_path, "doomed", cloud, **overrides).start()
    survivor = None
    try:
        run_admin(etcd_endpoint, "topics", "create", topic)
        eventually(lambda: _owner(etcd_endpoint, topic) == doomed.broker_id, 20)
        survivor = BrokerProcess(etcd_endpoint, tmp_path, "survivor", cloud).start()
        yield doomed, survivor
    finally:
        for proc in (survivor, doomed):
            if proc is not None:
                proc.stop()


def test_dead_broker_topic_continues_on_survivor_after_last_uploaded_offset(etcd_endpoint, tmp_path, unique_name):
    topic = f"/default/{unique_name('failover')}"
    with doomed_and_survivor(etcd_endpoint, tmp_path, topic) as (doomed, survivor):
        first = asyncio.run(_produce_and_read_first(doomed.url, topic, "from-zero", 30, 10))
        assert [m.msg_id.topic_offset for m in first] == list(range(10))
        eventually(lambda: _uploaded_through(etcd_endpoint, topic) == 29, 30)
        doomed.kill()
        eventually(lambda: _owner(etcd_endpoint, topic) == survivor.broker_id, 30)
        asyncio.run(_produce(survivor.url, topic, 30, 5))
        rest = asyncio.run(_consume(survivor.url, topic, "from-zero", 25))
        assert [m.msg_id.topic_offset for m in rest] == list(range(10, 35))
        assert [m.payload for m in rest] == [f"f-{i}".encode() for i in range(10, 35)]


def test_kill_9_before_upload_survivor_recovers_acked_messages_from_dead_brokers_wal(
    etcd_endpoint, tmp_path, unique_name
):
    no_upload = {"uploader": {"interval_seconds": 3600, "root_prefix": "/danube-data"}}
    topic = f"/default/{unique_name('unuploaded')}"
    with doomed_and_survivor(etcd_endpoint, tmp_path, topic, no_upload) as (doomed, survivor):
        first = asyncio.run(_produce_and_read_first(doomed.url, topic, "resume", 40, 10))
        assert [m.msg_id.topic_offset for m in first] == list(range(10))
        eventually(lambda: _cursor(etcd_endpoint, topic, "resume") == 9, 20)
        assert _uploaded_through(etcd_endpoint, topic) == -1  # the 40 acks exist only in doomed's WAL

        doomed.kill()
        eventually(lambda: _owner(etcd_endpoint, topic) == survivor.broker_id, 30)
        asyncio.run(_produce(survivor.url, topic, 40, 5))
        rest = asyncio.run(_consume(survivor.url, topic, "resume", 35))

        assert [m.msg_id.topic_offset for m in rest] == list(range(10, 45))
        assert [m.payload for m in rest] == [f"f-{i}".encode() for i in range(10, 45)]
        assert _uploaded_through(etcd_endpoint, topic) >= 39
        on_doomed = [offset for offset, _ in _wal_offsets(doomed.wal_dir)]
        on_survivor = [offset for offset, _ in _wal_offsets(survivor.wal_dir)]
        assert sorted(on_doomed) == list(range(40))
        assert sorted(on_survivor) == list(range(40, 45)), "an offset was handed out twice"


def test_restart_on_its_own_data_takes_its_topics_back_before_the_lease_expires(etcd_endpoint, metadata, tmp_path,
                                                                                unique_name):
    """kill -9, then the same broker restarted on its own WAL root: it resumes its still-live
    registration lease (same id), so the leader never moved its topic, and it accepts sends
    again long before the 30 s registration TTL would have let any failover happen."""
    cloud = str(tmp_path / "cloud")
    coordination = {"register_ttl_seconds": 30, "leader_ttl_seconds": 2, "leader_check_interval_seconds": 0.2,
                    "lookup_wait_seconds": 10}
    first = BrokerProcess(etcd_endpoint, tmp_path, "a", cloud, coordination=coordination).start()
    topic = f"/default/{unique_name('restart')}"
    owners_seen: set[int] = set()

    async def send(url: str, payloads: list[bytes]) -> float:
        """When (monotonic) the first send was acknowledged; every payload is acknowledged."""
        client, producer = await reliable_producer(url, topic, f"p-{len(owners_seen)}",
                                                   ProducerOptions(max_retries=20, base_backoff_ms=100))
        first_ack = None
        for payload in payloads:
            await producer.send(payload, None)
            first_ack = first_ack or time.monotonic()
        await producer.close()
        return first_ack

    second = None
    try:
        asyncio.run(send(first.url, [f"a-{i}".encode() for i in range(20)]))
        owners_seen.add(first.broker_id)
        first.kill()
        restarted_at = time.monotonic()
        second = BrokerProcess(etcd_endpoint, tmp_path, "a", cloud, port=first.port, coordination=coordination)
        second.start()
        assert second.broker_id == first.broker_id
        recovery_s = asyncio.run(send(second.url, [f"b-{i}".encode() for i in range(20)])) - restarted_at
        print(f"restart -> first acknowledged send: {recovery_s:.2f} s")
        assert recovery_s < 15, f"first acknowledged send {recovery_s:.1f}s after the restart"
        assignments = [key for key, _ in metadata.get_prefix("/cluster/brokers/", keys_only=True)
                       if key.endswith(topic)]
        assert assignments == [f"/cluster/brokers/{first.broker_id}{topic}"]  # never moved
        payloads = [payload for _, payload in _wal_offsets(second.wal_dir)]
        offsets = [offset for offset, _ in _wal_offsets(second.wal_dir)]
        assert sorted(offsets) == list(range(40)) and len(set(payloads)) == 40
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_a_topic_moved_away_while_its_broker_was_down_is_sealed_when_it_restarts(etcd_endpoint, tmp_path,
                                                                               unique_name):
    """kill -9 of the owner, an unload asked while it is down (its assignment is deleted; it
    never sees that), then the owner restarted on its own data: it seals what its WAL holds
    beyond the uploads, and the next owner continues after every offset it acknowledged. Before,
    nobody sealed: the leader gave up after its 30 s wait and the next owner continued after
    the last upload, handing out again offsets the old owner had acknowledged (found by the
    soak, issue 43)."""
    cloud = str(tmp_path / "cloud")
    coordination = {"register_ttl_seconds": 30, "leader_ttl_seconds": 2, "leader_check_interval_seconds": 0.2,
                    "lookup_wait_seconds": 10}
    no_upload = {"uploader": {"interval_seconds": 3600, "root_prefix": "/danube-data"}}
    topic = f"/default/{unique_name('moved-while-down')}"
    first = BrokerProcess(etcd_endpoint, tmp_path, "a", cloud, coordination=coordination, wal_cloud=no_upload).start()
    other = second = None
    try:
        run_admin(etcd_endpoint, "topics", "create", topic)
        eventually(lambda: _owner(etcd_endpoint, topic) == first.broker_id, 20)
        other = BrokerProcess(etcd_endpoint, tmp_path, "b", cloud, coordination=coordination).start()
        read = asyncio.run(_produce_and_read_first(first.url, topic, "resume", 20, 5))
        assert [m.msg_id.topic_offset for m in read] == list(range(5))
        eventually(lambda: _cursor(etcd_endpoint, topic, "resume") == 4, 20)
        assert _uploaded_through(etcd_endpoint, topic) == -1  # the 20 acks exist only in a's WAL

        first.kill()
        run_admin(etcd_endpoint, "topics", "unload", topic)
        second = BrokerProcess(etcd_endpoint, tmp_path, "a", cloud, port=first.port, coordination=coordination,
                               wal_cloud=no_upload).start()
        assert second.broker_id == first.broker_id
        restarted_at = time.monotonic()
        eventually(lambda: _owner(etcd_endpoint, topic) == other.broker_id, 40)
        moved_s = time.monotonic() - restarted_at
        assert moved_s < 20, f"moved {moved_s:.1f}s after the restart: the leader waited out its seal wait"
        assert _uploaded_through(etcd_endpoint, topic) == 19  # sealed: a uploaded its WAL first

        asyncio.run(_produce(other.url, topic, 20, 5))
        rest = asyncio.run(_consume(other.url, topic, "resume", 20))
        assert [m.msg_id.topic_offset for m in rest] == list(range(5, 25))
        assert [m.payload for m in rest] == [f"f-{i}".encode() for i in range(5, 25)]
        assert sorted(offset for offset, _ in _wal_offsets(other.wal_dir)) == list(range(20, 25))
    finally:
        for proc in (other, second, first):
            if proc is not None:
                proc.stop()


def test_a_broker_cut_off_from_etcd_stops_acknowledging_before_its_registration_can_expire(tmp_path, unique_name):
    """etcd stopped (SIGSTOP) under a producing client: the broker acknowledges nothing once its
    registration lease may have expired (its TTL, less a margin, after the last refresh etcd
    answered), since the leader may then fail its topics over and the next owner hand out the
    same offsets (the soak, issue 43: 20 s of acknowledged messages at offsets handed out again).
    After etcd is back it registers again, takes messages, and every acknowledged one is in its
    WAL once, at offsets handed out once."""
    import signal

    from danube_core.embedded_etcd import EmbeddedEtcd

    ttl_s = 3
    coordination = {"register_ttl_seconds": ttl_s, "leader_ttl_seconds": 2, "leader_check_interval_seconds": 0.2,
                    "lookup_wait_seconds": 10}
    topic = f"/default/{unique_name('cut-off')}"
    acked: list[tuple[float, int]] = []
    stopped_at: list[float] = []

    async def produce(url: str, until: float) -> None:
        from danube import ProducerOptions

        client, producer = await reliable_producer(url, topic, "p", ProducerOptions(max_retries=0))
        i = len(acked)
        while time.monotonic() < until:
            try:
                await asyncio.wait_for(producer.send(f"c-{i}".encode()), 2)
                acked.append((time.monotonic(), i))
            except Exception:  # refused or timed out: not acknowledged (a new producer after it)
                await asyncio.sleep(0.2)
                try:
                    await producer.close()
                except Exception:
                    pass
                try:
                    client, producer = await reliable_producer(url, topic, f"p{i}", ProducerOptions(max_retries=0))
                except Exception:
                    await asyncio.sleep(0.2)
                    continue
            i += 1
            if len(acked) == 20 and not stopped_at:
                os.kill(etcd.process.pid, signal.SIGSTOP)
                stopped_at.append(time.monotonic())
            await asyncio.sleep(0.05)

    with EmbeddedEtcd() as etcd:
        broker = BrokerProcess(etcd.endpoint, tmp_path, "a", str(tmp_path / "cloud"), coordination=coordination).start()
        try:
            run_admin(etcd.endpoint, "topics", "create", topic)
            eventually(lambda: _owner(etcd.endpoint, topic) == broker.broker_id, 20)

            async def scenario() -> None:
                producing = asyncio.ensure_future(produce(broker.url, time.monotonic() + 40))
                while not stopped_at:
                    await asyncio.sleep(0.05)
                await asyncio.sleep(ttl_s + 3)
                os.kill(etcd.process.pid, signal.SIGCONT)
                await producing

            asyncio.run(scenario())
        finally:
            os.kill(etcd.process.pid, signal.SIGCONT)
            broker.stop()
    stopped = stopped_at[0]
    # The last refresh etcd answered came before the stop: past its TTL nothing is acknowledged
    # (0.3 s for an acknowledgement sent just before to reach the client).
    during = [t - stopped for t, _ in acked if stopped + ttl_s + 0.3 <= t <= stopped + ttl_s + 3]
    assert during == [], f"acknowledged {len(during)} message(s) while the registration may have expired: {during}"
    after = [i for t, i in acked if t > stopped + ttl_s + 3]
    assert after, "no message acknowledged after etcd came back"
    stored = _wal_offsets(broker.wal_dir)
    offsets = [offset for offset, _ in stored]
    assert len(offsets) == len(set(offsets)), "an offset was handed out twice"
    payloads = {payload for _, payload in stored}
    assert {f"c-{i}".encode() for _, i in acked} <= payloads
