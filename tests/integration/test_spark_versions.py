"""The connector on every Spark line users run, besides the suite's own (constraints.txt pins
it; the `spark-line:` comments there name the others, with the Delta release for each).

Each line gets a venv of its own (cached: `tests.venvs`), holding that pyspark, its Delta where
one exists and the project with the `connector` and `pipelines` extras, installed as a user
installs it: the suite's built wheel, or, on a line naming a Python minor, the project's source
built with no C compiler and no cargo on the PATH (the pure decoder, no native front), on that
Python. There, `tests/spark_version_smoke.py` reads a topic whose first messages are
in objects and the rest only in the WAL, with no registration call: a batch read, an
availableNow stream, run again after more messages (exactly the new ones), a per-trigger limit
(refused by name where Spark cannot honour it), and the orders pipeline into Delta where Delta
runs on that Spark; where it does not, the pipeline's one-line refusal naming both versions.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from danube_core.keys import cursor_key
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.objectstore import ObjectStore
from danube_core.records import parse_cursor
from danube_core.schema_registry import register_schema
from danube_core.topics import TopicName
from devstack import REPO_ROOT
from devstack.demo import ORDER_SCHEMA, sample_orders
from tests.pipeline_files import orders_pipeline_file
from tests.topic_builder import TopicBuilder
from tests.venvs import (built_wheel, cached_venv, clean_env, constraints_without, declared_requirements, pip_into,
                         pyenv_python, run, source_copy, without_toolchain)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

SMOKE = Path(__file__).resolve().parents[1] / "spark_version_smoke.py"
UPLOADED, TAIL, MORE = 20, 5, 7  # messages in objects, then in the WAL; appended between the runs


def spark_lines() -> list[tuple[str, str | None, str | None]]:
    """(pyspark, delta-spark or None, Python minor or None) of each `# spark-line:` comment in
    constraints.txt."""
    lines = []
    for line in (REPO_ROOT / "constraints.txt").read_text().splitlines():
        if line.startswith("# spark-line:"):
            pins = dict(pin.split("==") for pin in line.split(":", 1)[1].split())
            lines.append((pins["pyspark"], pins.get("delta-spark"), pins.get("python")))
    return lines


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


@pytest.fixture
def wheel() -> Path:
    """Built once per content (`built_wheel`), so the fixture need not be module-wide: the tests
    of this module then spread over the suite's workers."""
    return built_wheel()


def _venv(pyspark: str, delta: str | None, wheel: Path, extras: str = "connector,pipelines", name: str = "") -> Path:
    """The line's venv on the suite's Python with `wheel` installed."""
    spark_pins = [f"pyspark=={pyspark}"] + ([f"delta-spark=={delta}"] if delta else [])
    venv = cached_venv(f"pyspark-{pyspark}{'-' + name if name else ''}", [*spark_pins, f"{wheel}[{extras}]"],
                       constraints_without("pyspark", "delta-spark"),
                       keyed_by="\n".join([*spark_pins, *declared_requirements(extras.split(","))]))
    # The wheel of this run, over whatever wheel the venv was made with.
    run(*pip_into(venv / "bin" / "python"), "install", "--quiet", "--no-compile", "--no-deps", "--force-reinstall",
        str(wheel), cwd=venv, env=clean_env())
    return venv


def _venv_from_source(pyspark: str, delta: str | None, python: str, work: Path,
                      extras: str = "connector,pipelines") -> Path:
    """The line's venv on pyenv's Python `python`, holding what `extras` require (cached), with
    the project installed from a copy of its source with no compiler and no cargo on the PATH.
    Python 3.10 takes what setup.cfg's ranges allow (constraints.txt pins numpy 2.4, which
    needs 3.11)."""
    interpreter = pyenv_python(python)
    if interpreter is None:
        pytest.skip(f"no Python {python} under pyenv")
    spark_pins = [f"pyspark=={pyspark}"] + ([f"delta-spark=={delta}"] if delta else [])
    requirements = [*spark_pins, *declared_requirements(extras.split(","))]
    constraints = [] if python == "3.10" else constraints_without("pyspark", "delta-spark")
    venv = cached_venv(f"pyspark-{pyspark}-py{python}", requirements, constraints, keyed_by="\n".join(requirements),
                       interpreter=interpreter)
    source = source_copy(work / "source")
    run(*pip_into(venv / "bin" / "python"), "install", "--quiet", "--no-compile", "--no-deps", "--force-reinstall",
        str(source), cwd=work, env=without_toolchain(work))
    probe = ("import importlib.util as u; from danube_core import arrow_decode; "
             "print(arrow_decode.FRAME_DECODER.__name__, u.find_spec('broker._grpc_front'))")
    assert run(str(venv / "bin" / "python"), "-c", probe, cwd=work, env=clean_env(venv)).split() == [
        "danube_core.pure_decode", "None"]
    return venv


def _pipeline(tmp_path: Path, etcd: str, storage: str, topic: str, subject: str) -> Path:
    # No per-batch cap: Spark 4.0/4.1 refuse one (tests/unit/test_spark_compat.py).
    return orders_pipeline_file(tmp_path, subject=subject, name="smoke-orders", source_keys=dict(
        etcd_endpoints=etcd, storage_url=storage, topics=[topic], subscription="smoke-orders",
        max_messages_per_trigger=None))


def _delta_rows(table: Path) -> int:
    from deltalake import DeltaTable

    return DeltaTable(str(table)).to_pyarrow_table().num_rows


@pytest.mark.parametrize("pyspark, delta, python", spark_lines(),
                         ids=[f"spark-{p}" + (f"-py{py}-source" if py else "") for p, _, py in spark_lines()])
def test_a_spark_line_reads_streams_and_lands_in_delta(pyspark, delta, python, wheel, etcd_endpoint, tmp_path,
                                                       unique_name):
    venv = _venv(pyspark, delta, wheel) if python is None else _venv_from_source(pyspark, delta, python, tmp_path)
    python = venv / "bin" / "python"
    store = ObjectStore(str(tmp_path / "objects"))
    subject = unique_name("smoke-orders")
    orders = sample_orders(UPLOADED + TAIL + MORE)
    with EtcdMetadataStore(etcd_endpoint) as metadata:
        register_schema(metadata, subject, "JsonSchema", json.dumps(ORDER_SCHEMA))
        name = f"/default/{unique_name('spark-line')}"
        topic = TopicBuilder(metadata, store, str(tmp_path / "wal"), name)
        order = lambda offset: orders[offset][0]  # noqa: E731
        topic.append(UPLOADED, payload=order)
        topic.upload()
        topic.append(TAIL, payload=order)
        pipeline = _pipeline(tmp_path, etcd_endpoint, store.url, name, subject) if delta else None
        args = {"etcd": etcd_endpoint, "storage": store.url, "topic": name, "work": str(tmp_path / "work"),
                "pipeline": None if pipeline is None else str(pipeline)}
        log = tmp_path / "smoke.log"  # Spark's log: a file, so a full pipe never stalls the script
        smoke = subprocess.Popen([str(python), str(SMOKE), json.dumps(args)], cwd=tmp_path, env=clean_env(venv),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
        steps: list[dict] = []
        try:
            assert smoke.stdout is not None and smoke.stdin is not None
            for line in smoke.stdout:
                if not line.startswith('{"step"'):
                    continue
                steps.append(json.loads(line))
                if steps[-1]["step"] == "wait":
                    topic.append(MORE, payload=order)
                    smoke.stdin.write("go\n")
                    smoke.stdin.flush()
            smoke.wait(600)
        finally:
            smoke.kill()
        stderr = log.read_text(errors="replace")
        assert smoke.returncode == 0, f"steps: {steps}\nstderr:\n{stderr[-6000:]}"
        key = cursor_key(TopicName.parse(name), "smoke")
        cursor = parse_cursor(metadata.get(key), key)

    by_step = {step["step"]: step for step in steps}
    assert by_step["spark"]["version"] == pyspark
    first = UPLOADED + TAIL
    assert by_step["batch"]["offsets"] == list(range(first))  # objects, then the WAL tail
    assert by_step["batch"]["payloads"] == sorted(p.decode() for p, _ in orders[:first])
    streams = [step["offsets"] for step in steps if step["step"] == "stream"]
    assert streams == [list(range(first)), list(range(first + MORE))]  # the new ones, once each
    # The stream commits its cursor itself; Spark 4.0/4.1 run availableNow as one batch and call
    # nothing after it, so there the second run commits the first run's end (README, Databricks).
    assert cursor == (first + MORE - 1 if _minor(pyspark) >= (4, 2) else first - 1), cursor

    limited = by_step["limited"]["error"]
    if _minor(pyspark) >= (4, 2):
        assert limited is None
    else:
        assert "'maxMessagesPerTrigger'" in limited and f"this is Spark {pyspark}" in limited, limited
        assert "needs Spark 4.2 or later" in limited and "Traceback" not in limited, limited

    if delta is not None:
        assert by_step["pipeline"]["exit"] == 0, stderr[-6000:]
        valid = sum(ok for _, ok in orders)
        assert _delta_rows(tmp_path / "target") + _delta_rows(tmp_path / "quarantine") == len(orders)
        assert _delta_rows(tmp_path / "target") == valid
    else:
        refused = subprocess.run([str(python), "-m", "pipelines", "run",
                                  str(_pipeline(tmp_path, etcd_endpoint, store.url, name, subject))],
                                 cwd=tmp_path, env=clean_env(venv), capture_output=True, text=True, timeout=300)
        assert refused.returncode == 2, refused.stderr[-3000:]
        (line,) = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
        assert re.search(rf"no Delta Lake release runs on Spark {re.escape(pyspark)}: .* delta-spark 4\.4\.0 on "
                         r"Spark 4\.0, 4\.1, 4\.2", line), line


def test_the_notebooks_run_on_the_lowest_spark_line(wheel) -> None:
    """tests/spark/test_notebooks.py, unchanged, in a venv of the lowest Spark line with Delta
    (Databricks Runtime 17.3 LTS's Spark 4.0), with the suite's own rig: its etcd, moto S3 and
    a Spark session of that line with Delta."""
    pyspark, delta = min(((p, d) for p, d, _ in spark_lines() if d), key=lambda line: _minor(line[0]))
    venv = _venv(pyspark, delta, wheel, extras="connector,pipelines,speedlayer,test", name="notebooks")
    env = {**clean_env(venv), "PYTHONPATH": str(REPO_ROOT), "DANUBE_TEST_JVM_ARCHIVE": "0"}
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-o", "addopts=--strict-markers", "tests/spark/test_notebooks.py"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1100)
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    assert re.search(r"\b\d+ passed\b", done.stdout) and " failed" not in done.stdout, done.stdout[-2000:]
    version = subprocess.run([str(venv / "bin" / "python"), "-c", "import pyspark; print(pyspark.__version__)"],
                             env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert version == pyspark


def test_every_spark_line_names_its_delta_as_the_pipelines_do() -> None:
    """constraints.txt's spark lines and `pipelines.session.DELTA_FOR_SPARK` say the same."""
    from pipelines.session import DELTA_FOR_SPARK

    for pyspark, delta, _ in spark_lines():
        minor = ".".join(pyspark.split(".")[:2])
        assert DELTA_FOR_SPARK.get(minor) == delta, (pyspark, delta)


def test_the_pinned_spark_is_not_repeated_as_a_spark_line() -> None:
    pinned = next(line.split("==")[1] for line in (REPO_ROOT / "constraints.txt").read_text().splitlines()
                  if line.startswith("pyspark=="))
    assert all(_minor(p) != _minor(pinned) for p, _, _ in spark_lines())
