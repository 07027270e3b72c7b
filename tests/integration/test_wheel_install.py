"""The wheel as a user installs it: built from the tracked sources, installed with the
`connector` extra into a fresh venv (no system site-packages) where pyspark is already there.

* the wheel holds `pyspark_danube` (format("danube") is discovered without a register call),
  the compiled frame decoder, the broker's native front, the example configs and the console scripts;
* installing it leaves the venv's pyspark as it was (same version, same files): `connector`
  does not require pyspark, as on Databricks, where the runtime's pyspark must stay;
* the venv's Spark reads a topic (etcd + local storage, objects and WAL tail) with it, batch and
  availableNow stream (other Spark lines: test_spark_versions.py).

Without a C compiler and without cargo (stand-ins that fail on PATH, cargo off it) the build
goes on without either extension and says so once each. Installed from source that way, on
Python 3.12 and 3.10, the project reads topics and lands them in Delta with the pure decoder:
the Spark lines that name a Python run so (test_spark_versions.py).

Cost: each venv starts as a hard-linked copy of one holding just the pinned pyspark, made once
per interpreter (`tests.venvs.cached_venv`), so a run installs only the project and what it
needs; pip's cache holds the rest after the first run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.objectstore import ObjectStore
from devstack import REPO_ROOT
from tests.topic_builder import TopicBuilder
from tests.venvs import built_wheel, cached_venv, clean_env, pip_into, run, source_copy, venv_copy, without_toolchain

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


READ_TOPIC = r"""
import json, sys
from pyspark.sql import SparkSession
args = json.loads(sys.argv[1])
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "1").getOrCreate())
def danube(read):
    return read.format("danube").option("etcd.endpoints", args["etcd"]).option("storage.url", args["storage"]) \
        .option("topic", args["topic"])
rows = danube(spark.read).load().select("offset", "payload").collect()
query = (danube(spark.readStream).option("subscription", "wheel").option("startingOffsets", "earliest").load()
         .select("offset").writeStream.format("parquet").option("checkpointLocation", args["work"] + "/checkpoint")
         .trigger(availableNow=True).start(args["work"] + "/out"))
query.awaitTermination(300)
streamed = spark.read.parquet(args["work"] + "/out").collect()
print(json.dumps({"offsets": sorted(r["offset"] for r in rows),
                  "payloads": sorted(bytes(r["payload"]).decode() for r in rows),
                  "streamed": sorted(r["offset"] for r in streamed)}))
spark.stop()
"""


def _constraint(name: str) -> str:
    for line in (REPO_ROOT / "constraints.txt").read_text().splitlines():
        if line.startswith(f"{name}=="):
            return line
    raise AssertionError(f"{name} is not pinned in constraints.txt")


def _pyspark_state(python: Path, cwd: Path) -> dict:
    probe = ("import json, os, pyspark, importlib.metadata as m; f = pyspark.__file__; "
             "print(json.dumps({'version': m.version('pyspark'), 'file': f, 'mtime': os.stat(f).st_mtime_ns, "
             "'inode': os.stat(f).st_ino}))")
    return json.loads(run(str(python), "-c", probe, cwd=cwd, env=clean_env()))


@pytest.fixture(scope="module")
def wheel() -> Path:
    return built_wheel()


def test_wheel_holds_the_data_source_decoder_configs_and_scripts(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "pyspark_danube/__init__.py" in names
    assert any(n.startswith("danube_core/_fastdecode") and n.endswith(".so") for n in names)
    assert "broker/_grpc_front.abi3.so" in names  # the broker's native front (Rust)
    for config in ("conf/broker.yaml", "conf/speedlayer.yaml", "conf/pipelines/orders.yaml"):
        assert any(n.endswith(f".data/data/share/danube-spark/{config}") for n in names), config
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    for script in ("danube-broker", "danube-admin", "danube-tools", "danube-pipelines", "danube-speedlayer",
                   "danube-connectors"):
        assert f"{script} = " in scripts, script
    metadata = zipfile.ZipFile(wheel).read(entry_points.replace("entry_points.txt", "METADATA")).decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert not [r for r in requires if "pyspark" in r and "extra == \"spark\"" not in r], requires


def test_connector_extra_keeps_the_installed_pyspark_and_reads_a_topic(wheel, etcd_endpoint, tmp_path, unique_name):
    # The venv gets no pip of its own: this pip installs into it (`--python`), which spares a
    # copy of pip; `--no-compile` spares byte-compiling some 30 packages (botocore, pandas,
    # pyarrow...) ahead of use. Together about half of this test's CPU time; what is installed,
    # and how pip resolves it, is the same.
    venv = _venv_with_pyspark(tmp_path)
    python = venv / "bin" / "python"
    pip = pip_into(python)
    constraints = str(REPO_ROOT / "constraints.txt")
    before = _pyspark_state(python, tmp_path)

    run(*pip, "install", "--quiet", "--no-compile", "-c", constraints, f"{wheel}[connector]", cwd=tmp_path, env=clean_env())
    assert _pyspark_state(python, tmp_path) == before  # not upgraded, reinstalled or shadowed
    assert (venv / "bin" / "danube-connectors").exists()
    assert (venv / "share" / "danube-spark" / "conf" / "pipelines" / "orders.yaml").exists()

    _read_topic_in(venv, etcd_endpoint, tmp_path, f"/default/{unique_name('wheel')}")


def _venv_with_pyspark(tmp_path: Path) -> Path:
    """A fresh venv holding the pinned pyspark and nothing else, as a user's Spark environment
    has it: a copy of one made once (`cached_venv`), so each run spares pyspark's install."""
    pins = [line for line in (REPO_ROOT / "constraints.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    minor = "%d.%d" % sys.version_info[:2]
    base = cached_venv(f"pyspark-only-py{minor}", [_constraint("pyspark")], pins, keyed_by=_constraint("pyspark"))
    return venv_copy(base, tmp_path / "venv")


def _read_topic_in(venv: Path, etcd_endpoint: str, tmp_path: Path, name: str) -> None:
    """The venv's Spark reads a topic of 20 messages in objects and 5 in the WAL tail, in a batch
    and in an availableNow stream, with no registration call."""
    store = ObjectStore(str(tmp_path / "objects"))
    with EtcdMetadataStore(etcd_endpoint) as metadata:
        topic = TopicBuilder.with_backlog(metadata, store, str(tmp_path / "wal"), name, 20, 5)
        script = tmp_path / "read_topic.py"
        script.write_text(READ_TOPIC)
        args = json.dumps({"etcd": etcd_endpoint, "storage": store.url, "topic": str(topic.name),
                           "work": str(tmp_path / "stream")})
        out = run(str(venv / "bin" / "python"), str(script), args, cwd=tmp_path, env=clean_env(venv))
    read = json.loads(out.strip().splitlines()[-1])
    assert read["offsets"] == list(range(25))  # 20 from objects, then 5 from the WAL tail
    assert read["payloads"] == sorted(f"{topic.name}#{i}" for i in range(25))
    assert read["streamed"] == list(range(25))  # an availableNow stream of the same topic


def test_build_without_compiler_or_cargo_goes_on_and_says_so_once(tmp_path):
    source = source_copy(tmp_path / "source")
    done = subprocess.run([sys.executable, "setup.py", "build_ext", "--build-lib", str(tmp_path / "lib")],
                          cwd=source, env=without_toolchain(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for skipped in ("skipping its C frame decoder (danube_core._fastdecode)",
                    "skipping the broker's native front (broker._grpc_front, Rust)"):
        assert done.stdout.count(skipped) == 1, done.stdout[-3000:]
    assert "apt-get install gcc python3-dev" in done.stdout and "https://rustup.rs" in done.stdout
    assert "pure-Python decoder" in done.stdout and "~300 µs of CPU per SendMessage" in done.stdout
    assert "Traceback" not in done.stderr
    assert not list((tmp_path / "lib").rglob("*.so"))
