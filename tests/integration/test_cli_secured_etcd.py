"""The command-line tools on an etcd secured as an operator runs one: TLS only, client
certificates required, authentication on. `python -m broker.admin`, `python -m broker.tools
objects` and `python -m connectors runs` each reach it through the shared `--etcd-*` flags
(`danube_core.etcd_cli`), the password from $DANUBE_ETCD_PASSWORD or `--etcd-password-file`;
a wrong password and a missing CA each fail with one error naming what to fix, and the
password is printed nowhere."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.objectstore import ObjectStore
from tests.integration.broker_process import REPO_ROOT
from tests.rig import eventually
from tests.tls import secured_etcd
from tests.topic_builder import TopicBuilder

PASSWORD = "cli-etcd-Pw-5Rk2-not-for-output"
ROOT_PREFIX = "/cli-secured"
TOPIC = "/default/cli-secured-orders"
GRPC_LOG_LINE = re.compile(r"[DIWEF]\d{4} \d\d:\d\d:\d\d\.\d+ ")  # I1127 09:45:04.417598 ...


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """(etcd endpoint, the TLS flags every call passes, storage URL): a secured etcd holding one
    reliable topic with 5 uploaded messages and 2 more in its WAL."""
    root = tmp_path_factory.mktemp("cli-secured")
    with secured_etcd(root / "certs", PASSWORD) as (server, certs):
        cloud = f"file://{root / 'cloud'}"
        os.makedirs(root / "cloud")
        with EtcdMetadataStore(server.endpoint, user="root", password=PASSWORD, ca_cert=certs.ca_cert,
                               cert_key=certs.key, cert_cert=certs.cert) as store:
            builder = TopicBuilder(store, ObjectStore(cloud), str(root / "wal"), TOPIC, root_prefix=ROOT_PREFIX)
            builder.append(5)
            builder.upload()
            builder.append(2)
            tls = ["--etcd", server.endpoint, "--etcd-user", "root", "--etcd-ca-cert", certs.ca_cert,
                   "--etcd-cert-key", certs.key, "--etcd-cert-cert", certs.cert, "--etcd-timeout-ms", "3000"]
            yield server.endpoint, tls, cloud
            builder.close()


def run_cli(module: str, *args: str, password: str | None = PASSWORD) -> subprocess.CompletedProcess:
    """`python -m <module> args`, the password in $DANUBE_ETCD_PASSWORD (none: unset)."""
    env = {key: value for key, value in os.environ.items() if key != "DANUBE_ETCD_PASSWORD"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    if password is not None:
        env["DANUBE_ETCD_PASSWORD"] = password
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    for secret in {PASSWORD, password or PASSWORD}:
        assert secret not in done.stdout + done.stderr, f"a password appears in python -m {module}'s output"
    return done


def json_lines(done: subprocess.CompletedProcess) -> list[dict]:
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def commands(tls: list[str], cloud: str) -> dict[str, list[str]]:
    """One real call of each tool (module -> arguments), `tls` where the etcd flags go."""
    return {
        "broker.admin": [*tls, "--root-prefix", ROOT_PREFIX, "topics", "storage", TOPIC],
        "broker.tools": ["objects", *tls, "--topic", TOPIC, "--root-prefix", ROOT_PREFIX],
        "connectors": ["runs", *tls, "--storage-url", cloud, "--topic", TOPIC, "--option", f"rootPrefix={ROOT_PREFIX}"],
    }


def test_admin_lists_the_topic_on_the_secured_etcd(secured):
    _, tls, _ = secured
    rows = json_lines(run_cli("broker.admin", *tls, "topics", "list", "default"))
    assert [(row["topic"], row["delivery"]) for row in rows] == [(TOPIC, "Reliable")]
    storage = json_lines(run_cli("broker.admin", *commands(tls, "")["broker.admin"]))
    assert [row["kind"] for row in storage] == ["descriptor", "cur", "sealed_state"]


def test_tools_lists_the_objects_with_the_password_from_a_file(secured, tmp_path):
    _, tls, cloud = secured
    path = tmp_path / "etcd-password"
    path.write_text(PASSWORD + "\n")
    rows = json_lines(run_cli("broker.tools", *commands([*tls, "--etcd-password-file", str(path)], cloud)
                              ["broker.tools"], password="not-this-one"))
    assert [row["kind"] for row in rows] == ["descriptor", "cur", "state"]
    assert (rows[0]["descriptor"]["start_offset"], rows[0]["descriptor"]["end_offset"]) == (0, 4)


def test_connectors_lists_the_topics_runs(secured):
    _, tls, cloud = secured
    rows = json_lines(run_cli("connectors", *commands(tls, cloud)["connectors"]))
    assert {row["run"] for row in rows} == {"current"}
    assert min(row["first_offset"] for row in rows) == 0 and max(row["last_offset"] for row in rows) == 6


def test_the_token_goes_as_call_metadata_and_reads_writes_leases_and_watches_pass(secured):
    """Authenticated calls carry etcd's token as call metadata alone: no Python credentials
    plugin, whose release on a gRPC thread can deadlock `close()` against the GIL (a test
    worker once hung there, closing this module's store)."""
    endpoint, tls, _ = secured
    flag = dict(zip(tls[::2], tls[1::2]))
    key = f"{ROOT_PREFIX}/token-check"
    with EtcdMetadataStore(endpoint, user="root", password=PASSWORD, ca_cert=flag["--etcd-ca-cert"],
                           cert_key=flag["--etcd-cert-key"], cert_cert=flag["--etcd-cert-cert"]) as store:
        assert store._client(0).call_credentials is None
        seen: list[bytes | None] = []
        watch = store.watch_prefix(key, lambda event: seen.append(event.value))
        lease = store.grant_lease(10)
        store.put(key, b"v", lease=lease)
        assert store.get(key) == b"v" and store.refresh_leases([lease]) == []
        eventually(lambda: seen[:1] == [b"v"], deadline_s=30)
        watch.cancel()
        store.revoke_lease(lease.id)
        assert store.get(key) is None


def error_of(done: subprocess.CompletedProcess) -> str:
    """The tool's one error line (gRPC's own handshake log lines may surround it), no traceback."""
    lines = [line for line in done.stderr.splitlines() if line.strip() and not GRPC_LOG_LINE.match(line)]
    assert done.returncode != 0 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("module", ["broker.admin", "broker.tools", "connectors"])
def test_a_wrong_password_fails_naming_the_user_flag_and_the_variable(secured, module):
    endpoint, tls, cloud = secured
    error = error_of(run_cli(module, *commands(tls, cloud)[module], password="wrong-" + PASSWORD[::-1]))
    assert f"etcd at {endpoint} rejected the connection check" in error, error
    assert "etcd refused the user and password: check --etcd-user and $DANUBE_ETCD_PASSWORD" in error, error


@pytest.mark.parametrize("module", ["broker.admin", "broker.tools", "connectors"])
def test_a_missing_ca_fails_naming_the_ca_flag(secured, module):
    endpoint, tls, cloud = secured
    at = tls.index("--etcd-ca-cert")
    without_ca = [*tls[:at], *tls[at + 2:]]
    error = error_of(run_cli(module, *commands(without_ca, cloud)[module]))
    assert f"etcd unreachable at {endpoint}" in error, error
    assert "the TLS handshake failed: check --etcd-ca-cert" in error, error

