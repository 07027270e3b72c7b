"""Build hooks for the two compiled parts (the rest of the metadata lives in setup.cfg).

`danube_core._fastdecode` (C) decodes frames into Arrow columns on the executors; there is no
pure-Python equivalent fast enough to replace it silently. Without a C compiler (or Python's
headers) the build stops with one clear message saying what to install, or to install the
prebuilt wheel instead, rather than the compiler's traceback.

`broker._grpc_front` (Rust, `native/grpc_front`, built by setuptools-rust) serves the broker's
client port: Python's gRPC server alone spends more CPU per SendMessage than the broker's
whole durable publish. Building it needs cargo (https://rustup.rs); setuptools-rust says so
when it is missing.
"""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools_rust import Binding, RustExtension

NO_COMPILER = """
danube-spark: cannot build its frame decoder (danube_core._fastdecode, a C extension):
  {error}
Either install a C compiler and the Python headers and install again
  (Debian/Ubuntu: apt-get install gcc python3-dev; RHEL: dnf install gcc python3-devel;
   macOS: xcode-select --install),
or install a prebuilt wheel of danube-spark built on a machine with the same platform and
Python version (pip wheel . on that machine; then pip install danube_spark-*.whl here).
"""


class BuildFrameDecoder(build_ext):
    """`build_ext` that turns a missing compiler into the message above."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # distutils/setuptools raise several types for a missing compiler
            sys.exit(NO_COMPILER.format(error=f"{type(exc).__name__}: {exc}"))

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            sys.exit(NO_COMPILER.format(error=f"{type(exc).__name__}: {exc}"))


setup(
    cmdclass={"build_ext": BuildFrameDecoder},
    ext_modules=[
        Extension(
            "danube_core._fastdecode",
            sources=["danube_core/_fastdecode.c"],
            extra_compile_args=["-O3"],
        )
    ],
    rust_extensions=[
        RustExtension("broker._grpc_front", path="native/grpc_front/Cargo.toml", binding=Binding.PyO3, debug=False,
                      py_limited_api=True),
    ],
)
