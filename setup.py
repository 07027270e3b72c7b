"""Build hooks for the two compiled parts (the rest of the metadata lives in setup.cfg).

Both are optional, so `pip install danube-spark[connector]` (or `[pipelines]`) from source
needs neither a C compiler nor cargo: where a toolchain is missing the build goes on without
that part and says so once, with what it costs and how to get it.

`danube_core._fastdecode` (C) decodes frames into Arrow columns on the executors; without it
`danube_core.arrow_decode` falls back to its pure-Python decoder (same results, several times
slower per core: bench/README.md).

`broker._grpc_front` (Rust, `native/grpc_front`, built by setuptools-rust) serves the broker's
client port: Python's gRPC server alone spends more CPU per SendMessage than the broker's
whole durable publish. Without it the broker serves with Python's gRPC server
(`broker.grpc_front: auto`, broker/send_front.py).

`speedlayer/clients/danube-flight-sql-dialect.jar` (Java, built with `javac` by
`speedlayer.clients.spark_jdbc`) is the Spark JDBC dialect of the gateway's Flight SQL URLs: a
wheel carries it built, so its users need no JDK; without `javac` the build goes on and
`dialect_jar()` builds it on first use where a JDK is.

`DANUBE_LIMITED_API=cp311` builds the C decoder against the stable ABI of Python 3.11+
(`Py_LIMITED_API`; the buffer protocol it exports joined the limited API in 3.11), so one
wheel serves every later Python: deploy/build-wheels.sh uses it.
"""

import importlib.util
import os
import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools_rust import Binding, RustExtension

NO_COMPILER = """
danube-spark: skipping its C frame decoder (danube_core._fastdecode):
  {error}
The install goes on: readers decode frames with the pure-Python decoder instead, with the same
results at about 1/14 of the rate per core (bench/README.md, "Decoding frames"). To build it,
install a C compiler and the Python headers and install again
  (Debian/Ubuntu: apt-get install gcc python3-dev; RHEL: dnf install gcc python3-devel;
   macOS: xcode-select --install),
or install a prebuilt wheel of danube-spark (deploy/build-wheels.sh builds them).
"""

NO_CARGO = """
danube-spark: skipping the broker's native front (broker._grpc_front, Rust): `cargo` is not on
the PATH. The install goes on: the broker serves its client port with Python's gRPC server
alone (broker.grpc_front: auto), which spends ~300 µs of CPU per SendMessage, so publishes are
~3-4x slower (bench/README.md). To build it, install Rust (https://rustup.rs) and install
again, or install a prebuilt wheel of danube-spark (deploy/build-wheels.sh builds them).
"""

NO_JAVAC = """
danube-spark: skipping the Spark JDBC dialect jar (speedlayer/clients/danube-flight-sql-dialect.jar):
  {error}
The install goes on: `speedlayer.clients.spark_jdbc.dialect_jar()` builds it on first use where a
JDK's javac is; without it Spark's JDBC reader refuses zoned timestamps, lists, structs and maps
from the gateway by name (docs/speedlayer.md). Install a JDK 17+ and build again for a wheel that
carries it.
"""

FRAME_DECODER = "danube_core._fastdecode"
LIMITED_API = {"cp311": "0x030B0000"}
LIMITED = os.environ.get("DANUBE_LIMITED_API") or None


class BuildOptionalExtensions(build_ext):
    """`build_ext` that builds each compiled part where its toolchain is present.

    setuptools' own `Extension(optional=True)` swallows the failure into one line of a
    verbose log; this says what was skipped, what it costs and how to get it. setuptools-rust
    runs `build_rust` from this command's `run` (it subclasses it), so cargo is checked here.
    """

    def run(self):
        if self.distribution.rust_extensions and shutil.which(os.environ.get("CARGO", "cargo")) is None:
            print(NO_CARGO)
            self.distribution.rust_extensions = []
        super().run()

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # setuptools raises several types for a missing compiler or header
            print(NO_COMPILER.format(error=f"{type(exc).__name__}: {exc}"))


class BuildPyWithDialectJar(build_py):
    """`build_py` that also puts the Spark JDBC dialect's jar into the build, where javac is."""

    def run(self):
        super().run()
        if self.editable_mode:
            return  # an editable install builds it on first use, from the tree
        source = Path(__file__).parent / "speedlayer" / "clients" / "spark_jdbc.py"
        spec = importlib.util.spec_from_file_location("_spark_jdbc_build", source)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # the module alone: no package imports at build time
        try:
            module.build_jar(Path(self.build_lib) / "speedlayer" / "clients" / module.JAR_NAME)
        except module.DialectBuildError as exc:
            print(NO_JAVAC.format(error=str(exc).splitlines()[0]))


def frame_decoder() -> Extension:
    if LIMITED is not None and LIMITED not in LIMITED_API:
        raise SystemExit(f"DANUBE_LIMITED_API={LIMITED!r}: expected one of {', '.join(LIMITED_API)}")
    return Extension(
        FRAME_DECODER,
        sources=["danube_core/_fastdecode.c"],
        extra_compile_args=["-O3"],
        define_macros=[("Py_LIMITED_API", LIMITED_API[LIMITED])] if LIMITED else [],
        py_limited_api=LIMITED is not None,
        optional=True,  # also keeps `build_ext --inplace` from copying a decoder that was skipped
    )


setup(
    cmdclass={"build_ext": BuildOptionalExtensions, "build_py": BuildPyWithDialectJar},
    ext_modules=[frame_decoder()],
    # the wheel's tag says what the decoder was built against: cp311-abi3 for every Python >= 3.11
    options={"bdist_wheel": {"py_limited_api": LIMITED}} if LIMITED else {},
    rust_extensions=[
        RustExtension("broker._grpc_front", path="native/grpc_front/Cargo.toml", binding=Binding.PyO3, debug=False,
                      py_limited_api=True, optional=True),
    ],
)
