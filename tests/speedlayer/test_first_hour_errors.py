"""A new user's first mistakes get a straight answer, without servers of the speed layer.

A wrong `--masters` or `--gateway` (a closed port, a host that accepts nothing, another
server's port) fails within the connect timeout with one line naming the address and what to
check, exit code 1, no traceback; a tenant typo is named as an unknown tenant, while a known
tenant asking for another tenant's dataset keeps the isolation error; an epoch short of
replicas says what is missing and how replication is set.
"""

from __future__ import annotations

import socket
import subprocess
import time
from concurrent import futures

import grpc
import pytest

from danube_core.metadata_memory import MemoryMetadataStore
from danube_core.ports import free_port
from speedlayer.__main__ import main
from speedlayer.clients.query_client import QueryClient
from speedlayer.errors import (
    GatewayUnreachableError, NotFoundError, ReplicaUnavailableError, TenantIsolationError, UnknownTenantError,
)
from speedlayer.gateway.routing import RoutingTable
from speedlayer.keys import SpeedLayerKeys
from speedlayer.master.replication import shortfall, with_replication
from speedlayer.records import (
    ASSIGNED, PLANNED, R_LOADING, R_READY, AssignmentRecord, ReplicaRecord, TenantConfig, WorkerRecord,
)
from tests.rig import one_line, run_module

pytestmark = pytest.mark.timeout(120)

STATUS = ["status", "--tenant", "acme", "--dataset", "orders"]
QUERY = ["--tenant", "acme", "--dataset", "orders", "SELECT count(*) FROM orders"]


def run_main(capsys, argv: list[str]) -> tuple[int, str, float]:
    """`python -m speedlayer ...` in this process (imports already paid): exit code, stderr, seconds."""
    started = time.perf_counter()
    code = main(argv)
    elapsed = time.perf_counter() - started
    return code, capsys.readouterr().err, elapsed


def run_cli(argv: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    return run_module("speedlayer", *argv)


@pytest.fixture
def silent_port():
    """A port that accepts TCP connections and never says a word (a host that is not answering)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


@pytest.fixture
def bare_grpc_port():
    """A gRPC server with no services: some other server's port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    server.stop(None)


# ---- 1. admin --masters <wrong> ------------------------------------------------------------------


def test_admin_with_closed_master_ports_fails_at_once_naming_every_address(capsys):
    first, second = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    code, stderr, elapsed = run_main(capsys, ["admin", "--masters", f"{first},{second}", *STATUS])
    line = one_line(stderr)
    assert code == 1
    assert elapsed < 1.0, elapsed  # was 30 s (the retry deadline)
    assert line.startswith(f"error: no speed layer master reachable at {first} (connection refused), "
                           f"{second} (connection refused)"), line
    assert "check --masters" in line and "python -m speedlayer master" in line


def test_admin_cli_process_with_a_closed_master_port_prints_one_line_and_exits_1():
    address = f"127.0.0.1:{free_port()}"
    done, elapsed = run_cli(["admin", "--masters", address, *STATUS])
    line = one_line(done.stderr)
    assert done.returncode == 1 and done.stdout == ""
    assert f"no speed layer master reachable at {address} (connection refused)" in line
    assert elapsed < 15, elapsed  # interpreter start and imports on a busy machine; was over 30 s


def test_admin_with_a_silent_master_fails_within_its_connect_timeout(capsys, silent_port):
    address = f"127.0.0.1:{silent_port}"
    code, stderr, elapsed = run_main(capsys, ["admin", "--masters", address, "--connect-timeout-s", "0.5", *STATUS])
    line = one_line(stderr)
    assert code == 1
    assert 0.4 < elapsed < 1.5, elapsed  # gRPC alone would wait 20 s for it, then retry until 30 s
    assert f"no speed layer master reachable at {address} (no answer) (connect timeout 0.5 s)" in line


def test_admin_against_a_port_that_is_not_a_master(capsys, bare_grpc_port):
    address = f"127.0.0.1:{bare_grpc_port}"
    code, stderr, elapsed = run_main(capsys, ["admin", "--masters", address, *STATUS])
    line = one_line(stderr)
    assert code == 1 and elapsed < 1.0, elapsed
    assert f"error: {address} is not a speed layer master: it answered UNIMPLEMENTED" in line
    assert "check --masters" in line


# ---- 3. query --gateway <wrong> ------------------------------------------------------------------


def test_query_with_a_closed_gateway_port_names_the_gateway_not_a_replica(capsys):
    address = f"127.0.0.1:{free_port()}"
    code, stderr, elapsed = run_main(capsys, ["query", "--gateway", address, *QUERY])
    line = one_line(stderr)
    assert code == 1 and elapsed < 1.0, elapsed
    assert line.startswith(f"error: GatewayUnreachableError: the gateway at {address} is unreachable "
                           "(connection refused, connect timeout 2000 ms); check --gateway"), line
    assert "Replica" not in line and "replica" not in line

    with QueryClient(address, "acme") as client, pytest.raises(GatewayUnreachableError) as caught:
        client.query("orders", "SELECT 1")
    assert not isinstance(caught.value, ReplicaUnavailableError) and caught.value.retriable


def test_query_cli_process_with_a_closed_gateway_port_prints_one_line_and_exits_1():
    address = f"127.0.0.1:{free_port()}"
    done, elapsed = run_cli(["query", "--gateway", address, *QUERY])
    line = one_line(done.stderr)
    assert done.returncode == 1 and done.stdout == ""
    assert f"GatewayUnreachableError: the gateway at {address} is unreachable (connection refused" in line
    assert elapsed < 15, elapsed


def test_query_with_a_silent_gateway_fails_within_its_connect_timeout(capsys, silent_port):
    address = f"127.0.0.1:{silent_port}"
    code, stderr, elapsed = run_main(capsys, ["query", "--gateway", address, "--connect-timeout-ms", "500", *QUERY])
    line = one_line(stderr)
    assert code == 1
    assert 0.4 < elapsed < 1.5, elapsed  # was the query's whole deadline (30 s + 2 s)
    assert f"the gateway at {address} is unreachable (no answer, connect timeout 500 ms)" in line


def test_query_against_a_port_that_is_not_a_gateway(capsys, bare_grpc_port):
    address = f"127.0.0.1:{bare_grpc_port}"
    code, stderr, elapsed = run_main(capsys, ["query", "--gateway", address, *QUERY])
    line = one_line(stderr)
    assert code == 1 and elapsed < 1.0, elapsed
    assert f"WrongServerError: {address} is not a speed layer gateway: it answered UNIMPLEMENTED" in line


# ---- 2. a tenant typo at the gateway ------------------------------------------------------------


def test_unknown_tenant_is_named_unknown_and_another_tenants_dataset_stays_isolated():
    store, keys = MemoryMetadataStore(), SpeedLayerKeys()
    ready = AssignmentRecord(tenant="acme", dataset="orders", epoch="v1-a", request_id="r", status=ASSIGNED,
                             version=1, replicas={"w1": ReplicaRecord(state=R_READY)})
    store.put(keys.assignment("acme", "orders", "v1-a"), ready.to_json())
    store.put(keys.worker("acme", "w1"), WorkerRecord("h:1", 1, 1, "m1").to_json())
    store.put(keys.tenant_config("other"), TenantConfig().to_json())                   # configured only
    store.put(keys.worker("solo", "w9"), WorkerRecord("h:9", 1, 1, "m1").to_json())   # a worker only
    routing = RoutingTable(store, keys).start()
    try:
        with pytest.raises(UnknownTenantError) as caught:
            routing.route("acne", "orders", "client-1")
        message = str(caught.value)
        assert message.startswith("unknown tenant 'acne': the speed layer has no workers, datasets or "
                                  "configuration for it; check the tenant's name"), message
        assert "acme" not in message and "other" not in message and "solo" not in message  # names no tenant
        assert not isinstance(caught.value, TenantIsolationError)

        for known in ("other", "solo"):  # a known tenant reaching for acme's dataset: isolation, as before
            with pytest.raises(TenantIsolationError, match=f"tenant '{known}' may not query dataset 'orders'"):
                routing.route(known, "orders", "client-1")
        with pytest.raises(NotFoundError, match="dataset 'missing' of tenant 'other' is not admitted") as missing:
            routing.route("other", "missing", "client-1")
        assert not isinstance(missing.value, UnknownTenantError)
        assert routing.route("acme", "orders", "client-1").epoch == "v1-a"
    finally:
        routing.close()


# ---- 4. replication: what is missing and how to set it ------------------------------------------


def _epoch(replicas: dict[str, str], replication: int = 2, status: str = ASSIGNED) -> AssignmentRecord:
    return AssignmentRecord(tenant="acme", dataset="orders", epoch="v1-a", request_id="r", status=status,
                            replication=replication, estimated_memory_bytes=1000,
                            replicas={w: ReplicaRecord(state=s) for w, s in replicas.items()})


def test_an_epoch_short_of_replicas_says_what_is_missing_and_how_to_set_replication():
    one_worker = shortfall(_epoch({"w1": R_READY}), workers=1)
    assert one_worker.startswith("1 of 2 replicas placed: tenant acme has 1 worker(s)"), one_worker
    assert "start 1 more worker(s) of tenant acme" in one_worker
    assert "--replication 1" in one_worker and "replication_factor=1 in /tenants/acme/config" in one_worker
    assert "/config/global" in one_worker and "default 2" in one_worker

    none_yet = shortfall(_epoch({}, status=PLANNED), workers=0)
    assert none_yet.startswith("no eligible worker of tenant acme yet") and "--tenant acme" in none_yet
    unusable = shortfall(_epoch({"w1": R_READY}), workers=3)
    assert "other workers are draining, short of memory" in unusable and "--replication N" in unusable
    assert shortfall(_epoch({"w1": R_READY, "w2": R_LOADING}), workers=2) == ""
    assert shortfall(_epoch({"w1": R_READY}, replication=1), workers=1) == ""


def test_lowering_replication_drops_loading_replicas_first_and_lets_ready_ones_leave():
    record = _epoch({"w1": R_READY, "w2": R_LOADING, "w3": R_READY}, replication=3)
    lowered = with_replication(record, 1)
    assert lowered.replication == 1 and "w2" not in lowered.replicas
    assert lowered.staying() == ("w3",) and lowered.replicas["w1"].leaving  # make before break
    raised = with_replication(_epoch({"w1": R_READY}, replication=2), 3)
    assert raised.replication == 3 and raised.staying() == ("w1",)
