"""The wheel as a user installs it: built from the tracked sources, installed with the
`connector` extra into a fresh venv (no system site-packages) where pyspark is already there.

* the wheel holds `pyspark_danube` (format("danube") is discovered without a register call),
  the compiled frame decoder, the broker's native front, the example configs and the console scripts;
* installing it leaves the venv's pyspark as it was (same version, same files): `connector`
  does not require pyspark, as on Databricks, where the runtime's pyspark must stay;
* the venv's Spark reads a topic (etcd + local storage, objects and WAL tail) with it.

Without a C compiler and without cargo (stand-ins that fail on PATH, cargo off it) the build
goes on without either extension and says so once each; `pip install <source>[connector]` then
works in fresh venvs of Python 3.10 and 3.12 (pyenv's, skipped where missing), whose Spark reads
the same kind of topic with the pure decoder.

Cost: pip's cache holds pyspark's wheel after the first run; the rest are small downloads.
The two source installs without a toolchain (venv, pyspark, the build, Spark's read) took 74 s
(3.10) and 108 s (3.12) of wall time, about 95 CPU seconds together, on 2 cores at load 2.5
with a warm pip cache; 174 s and 112 s with a cold one.
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

# Python minors a source install without a toolchain is checked on (pyenv's interpreters).
NO_TOOLCHAIN_PYTHONS = ("3.10", "3.12")
COMPILERS = ("cc", "gcc", "c++", "g++")

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

    _read_topic_in(venv, etcd_endpoint, tmp_path, f"/default/{unique_name('wheel')}")


def _read_topic_in(venv: Path, etcd_endpoint: str, tmp_path: Path, name: str) -> None:
    """The venv's Spark reads a topic of 20 messages in objects and 5 in the WAL tail."""
    store = ObjectStore(str(tmp_path / "objects"))
    with EtcdMetadataStore(etcd_endpoint) as metadata:
        topic = TopicBuilder.with_backlog(metadata, store, str(tmp_path / "wal"), name, 20, 5)
        script = tmp_path / "read_topic.py"
        script.write_text(READ_TOPIC)
        args = json.dumps({"etcd": etcd_endpoint, "storage": store.url, "topic": str(topic.name)})
        out = _run(str(venv / "bin" / "python"), str(script), args, cwd=tmp_path, env=_clean_env(venv))
    read = json.loads(out.strip().splitlines()[-1])
    assert read["offsets"] == list(range(25))  # 20 from objects, then 5 from the WAL tail
    assert read["payloads"] == sorted(f"{topic.name}#{i}" for i in range(25))


def _pyenv_python(minor: str) -> Path | None:
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found = root.glob(f"versions/{minor}.*/bin/python")
    return max(found, key=lambda p: [int(x) for x in p.parts[-3].split(".") if x.isdigit()], default=None)


def _without_toolchain(tmp_path: Path) -> dict[str, str]:
    """An environment with no C compiler (stand-ins that fail, as a missing one does) and no cargo."""
    stand_ins = tmp_path / "no-toolchain"
    stand_ins.mkdir(exist_ok=True)
    for name in COMPILERS:
        (stand_ins / name).write_text(f"#!/bin/sh\necho '{name}: not installed' >&2\nexit 127\n")
        (stand_ins / name).chmod(0o755)
    path = [d for d in _clean_env()["PATH"].split(os.pathsep) if not (Path(d) / "cargo").exists()]
    env = {k: v for k, v in _clean_env().items() if k not in ("CC", "CXX", "LDSHARED", "CARGO")}
    return {**env, "PATH": os.pathsep.join([str(stand_ins), *path])}


def test_build_without_compiler_or_cargo_goes_on_and_says_so_once(tmp_path):
    source = _source_copy(tmp_path / "source")
    done = subprocess.run([sys.executable, "setup.py", "build_ext", "--build-lib", str(tmp_path / "lib")],
                          cwd=source, env=_without_toolchain(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for skipped in ("skipping its C frame decoder (danube_core._fastdecode)",
                    "skipping the broker's native front (broker._grpc_front, Rust)"):
        assert done.stdout.count(skipped) == 1, done.stdout[-3000:]
    assert "apt-get install gcc python3-dev" in done.stdout and "https://rustup.rs" in done.stdout
    assert "pure-Python decoder" in done.stdout and "~300 µs of CPU per SendMessage" in done.stdout
    assert "Traceback" not in done.stderr
    assert not list((tmp_path / "lib").rglob("*.so"))


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory) -> Path:
    return _source_copy(tmp_path_factory.mktemp("source"))


@pytest.mark.parametrize("minor", NO_TOOLCHAIN_PYTHONS)
def test_source_install_without_toolchain_reads_a_topic_with_the_pure_decoder(
        minor, source_tree, etcd_endpoint, tmp_path, unique_name):
    interpreter = _pyenv_python(minor)
    if interpreter is None:
        pytest.skip(f"no Python {minor} under pyenv")
    venv = tmp_path / "venv"
    _run(str(interpreter), "-m", "venv", "--without-pip", str(venv), cwd=tmp_path)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", "--no-input"]
    # constraints.txt pins numpy 2.4, which needs Python >= 3.11: 3.10 takes what setup.cfg's ranges allow
    pins = ["-c", str(REPO_ROOT / "constraints.txt")] if minor != "3.10" else []
    _run(*pip, "install", "--quiet", "--no-compile", *pins, _constraint("pyspark"), cwd=tmp_path, env=_clean_env())
    _run(*pip, "install", "--quiet", "--no-compile", *pins, f"{source_tree}[connector]", cwd=tmp_path,
         env=_without_toolchain(tmp_path))
    probe = ("import importlib.util as u; from danube_core import arrow_decode; "
             "print(arrow_decode.FRAME_DECODER.__name__, u.find_spec('broker._grpc_front'))")
    assert _run(str(python), "-c", probe, cwd=tmp_path, env=_clean_env(venv)).split() == [
        "danube_core.pure_decode", "None"]
    _read_topic_in(venv, etcd_endpoint, tmp_path, f"/default/{unique_name('pure')}")
