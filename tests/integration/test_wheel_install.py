"""The wheel as a user installs it: built from the tracked sources, installed with the
`connector` extra into a fresh venv (no system site-packages) where pyspark is already there.

* the wheel holds `pyspark_danube` (format("danube") is discovered without a register call),
  the compiled frame decoder, the broker's native front, the example configs and the console scripts;
* installing it leaves the venv's pyspark as it was (same version, same files): `connector`
  does not require pyspark, as on Databricks, where the runtime's pyspark must stay;
* the venv's Spark reads a topic (etcd + local storage, objects and WAL tail) with it.

Cost: pip's cache holds pyspark's wheel after the first run; the rest are small downloads.
A machine without a C compiler gets `setup.py`'s message, checked here with a compiler that fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.objectstore import ObjectStore
from devstack import REPO_ROOT
from tests.topic_builder import TopicBuilder

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

READ_TOPIC = r"""
import json, sys
from pyspark.sql import SparkSession
args = json.loads(sys.argv[1])
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "1").getOrCreate())
rows = (spark.read.format("danube").option("etcd.endpoints", args["etcd"]).option("storage.url", args["storage"])
        .option("topic", args["topic"]).load().select("offset", "payload").collect())
print(json.dumps({"offsets": sorted(r["offset"] for r in rows),
                  "payloads": sorted(bytes(r["payload"]).decode() for r in rows)}))
spark.stop()
"""


def _constraint(name: str) -> str:
    for line in (REPO_ROOT / "constraints.txt").read_text().splitlines():
        if line.startswith(f"{name}=="):
            return line
    raise AssertionError(f"{name} is not pinned in constraints.txt")


def _source_copy(target: Path) -> Path:
    """The files git tracks (or would: untracked and not ignored), as a clean checkout has them."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                            cwd=REPO_ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO_ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def _run(*args: str, cwd: Path, env: dict | None = None, timeout: int = 600) -> str:
    done = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:  # Java stack frames left out: the Python error is what tells
        stderr = "\n".join(line for line in done.stderr.splitlines() if not line.strip().startswith("at "))
        raise AssertionError(f"{args[:4]} failed:\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{stderr[-6000:]}")
    return done.stdout


def _clean_env(venv: Path | None = None) -> dict[str, str]:
    """No PYTHONPATH: the venv must not see this checkout; no PYSPARK_PYTHON (the suite's
    names this interpreter). With `venv`: activated, as a user has it (Spark starts its Python
    workers with the `python3` on PATH)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "SPARK_HOME", "PYSPARK_PYTHON")}
    if venv is not None:
        env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv))
    return env


def _pyspark_state(python: Path, cwd: Path) -> dict:
    probe = ("import json, os, pyspark, importlib.metadata as m; f = pyspark.__file__; "
             "print(json.dumps({'version': m.version('pyspark'), 'file': f, 'mtime': os.stat(f).st_mtime_ns, "
             "'inode': os.stat(f).st_ino}))")
    return json.loads(_run(str(python), "-c", probe, cwd=cwd, env=_clean_env()))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = _source_copy(tmp_path_factory.mktemp("source"))
    dist = tmp_path_factory.mktemp("dist")
    # The native front's crates compile once: the checkout's cargo target directory (or the one
    # CARGO_TARGET_DIR names, as .ci/run sets) serves the copy too (cargo rebuilds whatever
    # differs), which saves a minute of the suite.
    target = os.environ.get("CARGO_TARGET_DIR") or str(REPO_ROOT / "native" / "grpc_front" / "target")
    env = {**os.environ, "CARGO_TARGET_DIR": target}
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--disable-pip-version-check",
         "-w", str(dist), str(source), cwd=source, env=env)
    (built,) = dist.glob("danube_spark-*.whl")
    return built


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
    venv = tmp_path / "venv"
    # The venv gets no pip of its own: this pip installs into it (`--python`), which spares a
    # copy of pip; `--no-compile` spares byte-compiling some 30 packages (botocore, pandas,
    # pyarrow...) ahead of use. Together about half of this test's CPU time; what is installed,
    # and how pip resolves it, is the same.
    _run(sys.executable, "-m", "venv", "--without-pip", str(venv), cwd=tmp_path)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", "--no-input"]
    constraints = str(REPO_ROOT / "constraints.txt")
    _run(*pip, "install", "--quiet", "--no-compile", "-c", constraints, _constraint("pyspark"), cwd=tmp_path, env=_clean_env())
    before = _pyspark_state(python, tmp_path)

    _run(*pip, "install", "--quiet", "--no-compile", "-c", constraints, f"{wheel}[connector]", cwd=tmp_path, env=_clean_env())
    assert _pyspark_state(python, tmp_path) == before  # not upgraded, reinstalled or shadowed
    assert (venv / "bin" / "danube-connectors").exists()
    assert (venv / "share" / "danube-spark" / "conf" / "pipelines" / "orders.yaml").exists()

    store = ObjectStore(str(tmp_path / "objects"))
    with EtcdMetadataStore(etcd_endpoint) as metadata:
        topic = TopicBuilder.with_backlog(metadata, store, str(tmp_path / "wal"), f"/default/{unique_name('wheel')}",
                                          20, 5)
        script = tmp_path / "read_topic.py"
        script.write_text(READ_TOPIC)
        args = json.dumps({"etcd": etcd_endpoint, "storage": store.url, "topic": str(topic.name)})
        out = _run(str(python), str(script), args, cwd=tmp_path, env=_clean_env(venv))
    read = json.loads(out.strip().splitlines()[-1])
    assert read["offsets"] == list(range(25))  # 20 from objects, then 5 from the WAL tail
    assert read["payloads"] == sorted(f"{topic.name}#{i}" for i in range(25))


def test_no_c_compiler_gets_a_clear_message(tmp_path):
    source = _source_copy(tmp_path / "source")
    env = {**_clean_env(), "CC": "/nonexistent/cc", "LDSHARED": "/nonexistent/cc -shared"}
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib")],
                          cwd=source, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "cannot build its frame decoder (danube_core._fastdecode" in done.stderr, done.stderr[-2000:]
    assert "apt-get install gcc python3-dev" in done.stderr and "prebuilt wheel" in done.stderr
    assert "Traceback" not in done.stderr
