"""A pipeline's first mistakes fail before Spark starts, in one line (`pipelines.preflight`).

A wrong etcd endpoint used to fail after ~24 s of Spark start-up with two chained tracebacks,
and an unregistered schema subject after ~33 s. Now `python -m pipelines run` checks etcd,
storage and the subject first: one `error:` line on stderr naming the file, the key and what
was tried, a non-zero exit code. The subprocess tests run without Java (`NO_JAVA`), so a run
that got as far as starting Spark would fail with Spark's error instead; the in-process ones
(`main`) name the check's own timeout where one applies. (How fast the checks are is not timed
here: wall time on a busy machine measures the machine.)
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.ports import free_port
from danube_core.schema_registry import register_schema
from pipelines.__main__ import main
from pipelines.config import load_config
from pipelines.preflight import ETCD_CHECK_TIMEOUT_MS, check_services
from tests.pipeline_files import orders_pipeline_file
from tests.rig import one_line, run_module

pytestmark = pytest.mark.timeout(120)

# A JAVA_HOME with no Java, and no `java` on PATH: Spark cannot start.
NO_JAVA = {"JAVA_HOME": "/nonexistent-java-home", "PATH": "/usr/local/sbin:/usr/sbin:/sbin"}


def pipeline_file(tmp_path: Path, *, subject: str = "orders", **source: Any) -> Path:
    """The shipped orders.yaml with `source` keys and `decode.subject` replaced, tables under tmp_path."""
    return orders_pipeline_file(tmp_path, subject=subject, source_keys=source)


def run_main(capsys, path: Path) -> tuple[int, str]:
    """`python -m pipelines run path` in this process: exit code, stderr."""
    code = main(["run", str(path)])
    return code, capsys.readouterr().err


def run_cli(path: Path) -> subprocess.CompletedProcess:
    return run_module("pipelines", "run", str(path), env=NO_JAVA)[0]


def test_closed_etcd_port_fails_in_one_line_before_spark_starts(tmp_path):
    endpoints = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    path = pipeline_file(tmp_path, etcd_endpoints=endpoints)
    done = run_cli(path)
    line = one_line(done.stderr)
    assert done.returncode == 3
    assert line.startswith(f"error: {path}: source.etcd_endpoints: etcd unreachable at {endpoints.replace(',', ', ')}")


def test_silent_etcd_fails_within_the_check_timeout_not_the_runs(capsys, tmp_path):
    with socket.socket() as silent:  # accepts connections, never answers: a host that hangs
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        endpoint = f"127.0.0.1:{silent.getsockname()[1]}"
        code, stderr = run_main(capsys, pipeline_file(tmp_path, etcd_endpoints=endpoint))
    line = one_line(stderr)
    assert code == 3
    assert f"etcd unreachable at {endpoint} during connect (timeout {ETCD_CHECK_TIMEOUT_MS / 1000}s" in line


@pytest.mark.parametrize("under, problem", [
    ("cloud-storage", "NotADirectoryError: [Errno 20] Not a directory"),  # can never be created
    ("", "file://{file} is a file, not a directory"),
], ids=["through-a-file", "a-file"])
def test_storage_url_at_or_through_a_file_is_named(capsys, tmp_path, etcd_endpoint, under, problem):
    file = tmp_path / "a-file"
    file.write_text("")
    url = str(file / under) if under else str(file)
    code, stderr = run_main(capsys, pipeline_file(tmp_path, etcd_endpoints=etcd_endpoint, storage_url=url))
    line = one_line(stderr)
    assert code == 3
    assert f"source.storage_url {url}: {problem.format(file=file)}" in line


def test_s3_storage_at_a_closed_endpoint_is_named_without_botocore_retries(capsys, tmp_path, etcd_endpoint):
    endpoint = f"http://127.0.0.1:{free_port()}"
    options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    path = pipeline_file(tmp_path, etcd_endpoints=etcd_endpoint, storage_url="s3://orders/cloud", storage_options=options)
    code, stderr = run_main(capsys, path)
    line = one_line(stderr)
    assert code == 3
    assert "source.storage_url s3://orders/cloud: not reachable: EndpointConnectionError" in line
    assert endpoint in line


def test_s3_bucket_that_does_not_exist_is_named(capsys, tmp_path, etcd_endpoint, moto_s3, unique_name):
    bucket = unique_name("missing")[:63]
    path = pipeline_file(tmp_path, etcd_endpoints=etcd_endpoint, storage_url=f"s3://{bucket}/cloud",
                         storage_options=moto_s3.storage_options)
    code, stderr = run_main(capsys, path)
    assert code == 3
    assert one_line(stderr).endswith(f"source.storage_url s3://{bucket}/cloud: s3://{bucket} does not exist")


def test_unregistered_subject_is_named_with_how_to_register_it(tmp_path, etcd_endpoint, unique_name):
    subject = unique_name("orders")
    path = pipeline_file(tmp_path, subject=subject, etcd_endpoints=etcd_endpoint,
                         storage_url=str(tmp_path / "cloud-storage"))
    done = run_cli(path)
    line = one_line(done.stderr)
    assert done.returncode == 2
    assert line.startswith(f"error: {path}: decode.subject: schema registry subject {subject!r} is not registered")
    assert f"register_schema({subject!r})" in line and "decode.inline_schema" in line


def test_reachable_etcd_and_storage_and_a_registered_subject_pass(tmp_path, etcd_endpoint, unique_name):
    from pipelines.runner import reader_options

    subject = unique_name("orders")
    with EtcdMetadataStore(etcd_endpoint) as metadata:
        register_schema(metadata, subject, "JsonSchema", '{"type": "object"}')
    # A storage root the broker has not created yet (no upload so far) under a directory is fine.
    config = load_config(pipeline_file(tmp_path, subject=subject, etcd_endpoints=etcd_endpoint,
                                       storage_url=str(tmp_path / "not-yet" / "cloud-storage")))
    check_services(config, reader_options(config.source))
