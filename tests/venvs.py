"""The project as users install it, for tests that run it outside the suite's own environment:
a wheel built from the tracked sources, and venvs that install it beside another pyspark.

Both are cached under `~/.cache/danube-spark` (the wheel by the hash of the sources it is built
from, a venv by everything it installs), so a CI run on a machine that ran before rebuilds
nothing that did not change, and concurrent pytest-xdist workers build each once (file locks).
"""

from __future__ import annotations

import configparser
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from devstack import REPO_ROOT

CACHE = Path(os.environ.get("DANUBE_TEST_CACHE", Path.home() / ".cache" / "danube-spark"))


def run(*args: str, cwd: Path, env: dict | None = None, timeout: int = 600) -> str:
    """`args` run to completion; AssertionError with the output's tail when it fails."""
    done = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:  # Java stack frames left out: the Python error is what tells
        stderr = "\n".join(line for line in done.stderr.splitlines() if not line.strip().startswith("at "))
        raise AssertionError(f"{args[:4]} failed:\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{stderr[-6000:]}")
    return done.stdout


def clean_env(venv: Path | None = None) -> dict[str, str]:
    """No PYTHONPATH: the venv must not see this checkout; no PYSPARK_PYTHON (the suite's
    names this interpreter). With `venv`: activated, as a user has it (Spark starts its Python
    workers with the `python3` on PATH)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "SPARK_HOME", "PYSPARK_PYTHON")}
    if venv is not None:
        env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv))
    return env


def tracked_files() -> list[str]:
    """The files git tracks (or would: untracked and not ignored), as a clean checkout has them."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                            cwd=REPO_ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    return sorted(name for name in filter(None, listed) if (REPO_ROOT / name).is_file())


def source_copy(target: Path) -> Path:
    """A copy of the tracked files at `target`."""
    for name in tracked_files():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, target / name)
    return target


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created), across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def built_wheel() -> Path:
    """The project's wheel for this interpreter, built from the tracked sources (once per
    content: later calls and other workers get the same file)."""
    digest = hashlib.sha256(sys.version.encode())
    for name in tracked_files():
        digest.update(name.encode() + b"\0" + (REPO_ROOT / name).read_bytes())
    wheels = CACHE / "wheels"
    dist = wheels / digest.hexdigest()[:16]
    with locked(wheels / ".lock"):
        found = sorted(dist.glob("danube_spark-*.whl"))
        if found:
            return found[0]
        for old in wheels.iterdir():  # one wheel kept: the sources it came from are gone
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        # At one path (under the lock), the files keeping their mtimes: cargo then finds the
        # native front of an earlier wheel up to date where native/ has not changed since (as
        # .ci/run gives it one fixed mtime), instead of rebuilding the crate for a new path.
        source = wheels / "source"
        shutil.rmtree(source, ignore_errors=True)
        source_copy(source)
        # The native front's crates compile once: the checkout's cargo target directory (or the
        # one CARGO_TARGET_DIR names, as .ci/run sets) serves the copy too.
        target = os.environ.get("CARGO_TARGET_DIR") or str(REPO_ROOT / "native" / "grpc_front" / "target")
        try:
            run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                "--disable-pip-version-check", "-w", str(dist), str(source), cwd=source,
                env={**os.environ, "CARGO_TARGET_DIR": target})
        finally:
            shutil.rmtree(source, ignore_errors=True)
        (wheel,) = dist.glob("danube_spark-*.whl")
        return wheel


def declared_requirements(extras: list[str]) -> list[str]:
    """What installing the project with `extras` requires, as setup.cfg declares it (extras that
    name other extras, `danube-spark[...]`, expanded): what a venv's contents depend on, so an
    edit elsewhere in setup.cfg does not make a cached venv anew."""
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "setup.cfg")
    declared = config["options.extras_require"]
    found: list[str] = list(filter(None, config["options"]["install_requires"].splitlines()))
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in filter(None, declared[extra].splitlines()):
            nested = re.fullmatch(r"danube-spark\[([\w,]+)\]", line.strip())
            if nested:
                pending.extend(nested.group(1).split(","))
            else:
                found.append(line.strip())
    return sorted(set(found))


COMPILERS = ("cc", "gcc", "c++", "g++")


def pyenv_python(minor: str) -> Path | None:
    """pyenv's newest interpreter of Python `minor` ("3.12"), None where pyenv has none."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found = root.glob(f"versions/{minor}.*/bin/python")
    return max(found, key=lambda p: [int(x) for x in p.parts[-3].split(".") if x.isdigit()], default=None)


def without_toolchain(work: Path) -> dict[str, str]:
    """An environment with no C compiler (stand-ins in `work` that fail, as a missing one does)
    and no cargo: what a user without a toolchain builds the project in."""
    stand_ins = work / "no-toolchain"
    stand_ins.mkdir(parents=True, exist_ok=True)
    for name in COMPILERS:
        (stand_ins / name).write_text(f"#!/bin/sh\necho '{name}: not installed' >&2\nexit 127\n")
        (stand_ins / name).chmod(0o755)
    path = [d for d in clean_env()["PATH"].split(os.pathsep) if not (Path(d) / "cargo").exists()]
    env = {k: v for k, v in clean_env().items() if k not in ("CC", "CXX", "LDSHARED", "CARGO")}
    return {**env, "PATH": os.pathsep.join([str(stand_ins), *path])}


def constraints_without(*packages: str) -> list[str]:
    """constraints.txt's pins, less those of `packages` (a venv pins its own Spark)."""
    lines = (REPO_ROOT / "constraints.txt").read_text().splitlines()
    return [line for line in lines
            if line and not line.startswith("#") and line.split("==")[0].strip() not in packages]


def pip_into(python: Path) -> list[str]:
    """This interpreter's pip installing into the venv of `python`: the venv needs no pip of its
    own, and `--no-compile` spares byte-compiling packages ahead of use."""
    return [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", "--no-input"]


def cached_venv(name: str, requirements: list[str], constraints: list[str], keyed_by: str,
                interpreter: Path | None = None) -> Path:
    """A venv (of `interpreter`, by default this one) holding `requirements` installed under
    `constraints`, made once and kept under `name` plus a hash of `keyed_by` (what decides its
    contents: pins, the project's declared dependencies), `constraints` and the interpreter's
    version; other venvs of `name` go."""
    python = interpreter or Path(sys.executable)
    version = sys.version if interpreter is None else run(str(interpreter), "-c", "import sys; print(sys.version)",
                                                          cwd=REPO_ROOT).strip()
    key = hashlib.sha256("\n".join([version, keyed_by, "--", *constraints]).encode()).hexdigest()[:12]
    venvs = CACHE / "spark-venvs"
    venv = venvs / f"{name}-{key}"
    with locked(venvs / f".{name}.lock"):
        if (venv / ".ready").exists():
            return venv
        for old in venvs.glob(f"{name}-*"):
            if re.fullmatch(rf"{re.escape(name)}-[0-9a-f]{{12}}", old.name):
                shutil.rmtree(old, ignore_errors=True)
        run(str(python), "-m", "venv", "--without-pip", str(venv), cwd=venvs)
        pins = venv / "constraints.txt"
        pins.write_text("\n".join(constraints) + "\n")
        run(*pip_into(venv / "bin" / "python"), "install", "--quiet", "--no-compile", "-c", str(pins),
            *requirements, cwd=venvs, env=clean_env(), timeout=1200)
        (venv / ".ready").write_text("\n".join(requirements) + "\n")
        return venv


def venv_copy(venv: Path, target: Path) -> Path:
    """A venv of its own at `target` holding what the cached `venv` holds, its files hard-linked
    (copied where `target` is on another filesystem): a test installs into it without paying
    for pyspark's install (some 430 MB unpacked) each run, and without changing the cache, since
    pip and Python replace files (write anew, rename) and never write into an installed one."""
    def link(source: str, destination: str) -> None:
        try:
            os.link(source, destination)
        except OSError:
            shutil.copy2(source, destination)

    shutil.copytree(venv, target, symlinks=True, copy_function=link)
    return target
