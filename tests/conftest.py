"""Session-wide test rig: a real etcd server, a moto S3 server and one local Spark session.

Every server is started once per test session on a free loopback port and torn down at the
end. Tests get unique names (topics, buckets, key prefixes) from `unique_name` so they never
see each other's data.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest

from devstack.short_spark_runs import SHORT_RUN_JVM_OPTIONS
from devstack.short_spark_runs import python_exec_without_zips
from danube_core.embedded_etcd import EXTRA_FLAGS_ENV, EmbeddedEtcd
from danube_core.ports import free_port, wait_for_port
from tests import jvm_class_archive

REPO_ROOT = Path(__file__).resolve().parents[1]

_ARCHIVE_MAKER = pytest.StashKey["subprocess.Popen | None"]()
_PYTHON_EXEC_DIR = pytest.StashKey[Path]()

# DANUBE_TEST_CPU_REPORT=<file>: one JSON line per test with the CPU it and its processes used.
pytest_plugins = ["tests.cpu_report"]

# Each test directory is one marker, so `-m integration` (or spark, speedlayer) selects the whole
# directory; the markers are declared in setup.cfg. `-m unit` selects every test that needs no
# server: all of tests/unit, and the modules of other directories that mark themselves `unit`
# (the speed layer's planners, configuration and routing), which the check below holds to it.
DIRECTORY_MARKERS = ("unit", "integration", "spark", "speedlayer")
UNIT = "unit"
# Fixtures that start a server or a Spark session: a `unit` test that needs one is a mistake.
SERVER_FIXTURES = frozenset({"etcd_server", "etcd_endpoint", "metadata", "moto_s3", "s3_bucket", "s3_store",
                             "spark", "golden_etcd", "golden", "moto_process", "cluster_factory"})


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the `xdist_group` marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        try:
            relative = Path(str(item.path)).resolve().relative_to(tests_dir)
        except ValueError:
            continue
        if len(relative.parts) > 1 and relative.parts[0] in DIRECTORY_MARKERS:
            directory = relative.parts[0]
            # A module's own mark naming another directory (a speed layer test marked
            # `integration`) would pull it into that directory's selection; `unit` stays.
            for node in item.listchain():
                node.own_markers[:] = [m for m in node.own_markers
                                       if m.name not in DIRECTORY_MARKERS or m.name in (directory, UNIT)]
            item.add_marker(directory)
        if item.get_closest_marker(UNIT) is not None:
            servers = [name for name in SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
                       if _shared_fixture(item, name)]
            if servers:
                raise pytest.UsageError(f"{item.nodeid} is marked `unit` but uses {sorted(servers)}: "
                                        "a unit test needs no server (move it, or drop the mark)")
    for item, group in _worker_groups(items).items():
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_configure(config: pytest.Config) -> None:
    """Before any worker starts: Spark drivers run with the C1 compiler alone and the serial GC
    and map a class-data archive (`jvm_class_archive`, made in the background the first time),
    and Spark's Python processes import the installed pyspark rather than compile it from
    Spark's zip (`_import_installed_pyspark`); none of it for `-m unit`, which starts no Spark.
    Then refuse the pytest-xdist and pytest releases whose loadgroup does not group
    (pytest-xdist#1386; constraints.txt has working ones).

    The suite is bound by CPU, and its drivers (the one Spark session, and the pipelines,
    spark-submit runs and batteries it starts as processes) work on small data for seconds to
    minutes: C2's compilations and G1's threads cost more than they return there. Measured on
    two Spark-session modules, two runs each: 129-154 CPU s with the JVM's defaults, 105-116
    with these (wall time the same or shorter)."""
    if hasattr(config, "workerinput"):
        return
    # Every etcd the tests start (the session's, the batteries', the brokers' and stacks' own)
    # skips fsync: a kill -9 keeps what the kernel holds, and no test outlives a machine crash.
    # Its fsyncs were about a fifth of its CPU (two broker modules: 2.5 -> 2.0 CPU s), and the
    # suite's etcds used some 240 CPU s of a run.
    os.environ.setdefault(EXTRA_FLAGS_ENV, "--unsafe-no-fsync")
    if config.getoption("markexpr", default="") != UNIT:
        opts = os.environ.get("SPARK_SUBMIT_OPTS", "")
        os.environ["SPARK_SUBMIT_OPTS"] = f"{SHORT_RUN_JVM_OPTIONS} {opts}".strip()
        config.stash[_ARCHIVE_MAKER] = jvm_class_archive.start(REPO_ROOT)
        _import_installed_pyspark(config)
    if config.getoption("dist", default="no") != "loadgroup":
        return
    import xdist
    from packaging.version import Version

    if Version(pytest.__version__) >= Version("9.2") and Version(xdist.__version__) <= Version("3.8.0"):
        raise pytest.UsageError(f"pytest-xdist {xdist.__version__} cannot group tests on pytest {pytest.__version__} "
                                "(`--dist loadgroup`, pytest-xdist#1386): install the versions in constraints.txt")


def _import_installed_pyspark(config: pytest.Config) -> None:
    """`PYSPARK_PYTHON` for every Spark the suite starts (the session's, and the pipelines,
    spark-submit runs and clusters it starts as processes, which inherit it): this interpreter
    without `pyspark.zip` on its path (`devstack.short_spark_runs`), unless the caller set one.

    Spark's zip holds no bytecode, so each Python process Spark starts compiled the pyspark
    modules it imports: a pipeline run's daemons, workers and source runner spent 9.7 CPU s,
    4.9 with the installed package (one battery case, measured by /proc); a Spark-session
    module 119.8 -> 110.4 CPU s. The same pyspark runs either way (checked); with another
    Spark on SPARK_HOME nothing changes."""
    if "PYSPARK_PYTHON" in os.environ:
        return
    work = Path(tempfile.mkdtemp(prefix="danube-spark-python-"))
    try:
        os.environ["PYSPARK_PYTHON"] = str(python_exec_without_zips(work))
    except ValueError:
        shutil.rmtree(work)
        return
    config.stash[_PYTHON_EXEC_DIR] = work


def pytest_unconfigure(config: pytest.Config) -> None:
    maker = config.stash.get(_ARCHIVE_MAKER, None)
    if maker is not None:
        jvm_class_archive.stop(maker, timeout_s=300)
    python_exec_dir = config.stash.get(_PYTHON_EXEC_DIR, None)
    if python_exec_dir is not None:
        shutil.rmtree(python_exec_dir, ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse to run split groups: pytest-xdist marks a grouped test by renaming its node id,
    which some pytest releases ignore (constraints.txt); the tests would then run apart."""
    if not session.config.getoption("loadgroup", default=False):
        return
    for item in session.items:
        if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid:
            pytest.exit(f"pytest-xdist did not group {item.nodeid} (pytest {pytest.__version__}): "
                                    "install the versions in constraints.txt", returncode=pytest.ExitCode.USAGE_ERROR)


SPARK_GROUP = "spark-session"
SHARED_SCOPES = ("module", "class", "package")
# Module-scoped, but a cleanup after a module's tests wherever they ran, not a shared resource.
PER_MODULE_CLEANUPS = frozenset({"_fake_registrations_removed"})


def _worker_groups(items: list[pytest.Item]) -> dict[pytest.Item, str]:
    """Which tests must share one pytest-xdist worker (run-tests.sh runs several, `--dist
    loadgroup`): every test of a module where one uses the session's SparkSession, so the suite
    starts one and a module's fixtures are set up once; and a module's tests where they share a
    module-scoped fixture (a cluster, a server), so it is started once. Every other test goes to
    whichever worker is free (each fault battery case, each unit test)."""
    by_module: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_module.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    groups: dict[pytest.Item, str] = {}
    for module, module_items in by_module.items():
        if any("spark" in getattr(item, "fixturenames", ()) for item in module_items):
            groups.update(dict.fromkeys(module_items, SPARK_GROUP))
        elif any(_uses_shared_fixture(item) for item in module_items):
            groups.update(dict.fromkeys(module_items, module))
    return groups


def _uses_shared_fixture(item: pytest.Item) -> bool:
    definitions = item._fixtureinfo.name2fixturedefs  # type: ignore[attr-defined]
    return any(defs and defs[-1].scope in SHARED_SCOPES and name not in PER_MODULE_CLEANUPS
               for name, defs in definitions.items())


def _shared_fixture(item: pytest.Item, name: str) -> bool:
    """Whether `item` gets fixture `name` from a conftest (a server), not from its own module
    (a module may call its in-memory store `metadata`)."""
    definitions = item._fixtureinfo.name2fixturedefs.get(name, ())  # type: ignore[attr-defined]
    return bool(definitions) and definitions[-1].func.__module__.endswith("conftest")


class MotoS3Server:
    """moto's S3 server on a free port, as s3fs's own test suite uses it."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port)
        self.server.start()
        wait_for_port(self.port)

    @property
    def storage_options(self) -> dict:
        """fsspec/s3fs storage options that reach this server."""
        return {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"},
        }

    @property
    def delta_options(self) -> dict[str, str]:
        """delta-rs (`deltalake`) storage options that reach this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
                "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}

    def write_orders_table(self, bucket: str, rows: int) -> str:
        """A Delta table of `rows` rows (`id`, `day` d0..d2, partitioned by day) at
        `s3://bucket/tables/orders` in a bucket created here; its URI."""
        import pyarrow as pa
        from deltalake import write_deltalake

        self.create_bucket(bucket)
        uri = f"s3://{bucket}/tables/orders"
        table = pa.table({"id": pa.array(range(rows), pa.int64()), "day": [f"d{i % 3}" for i in range(rows)]})
        write_deltalake(uri, table, partition_by=["day"], storage_options=self.delta_options)
        return uri

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket=name)

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EmbeddedEtcd]:
    server = EmbeddedEtcd()
    _RUNNING_ETCD.append(server)
    yield server
    _RUNNING_ETCD.remove(server)
    server.stop()


@pytest.fixture(scope="session")
def etcd_endpoint(etcd_server: EmbeddedEtcd) -> str:
    """`host:port` of the session's etcd server."""
    return etcd_server.endpoint


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3Server]:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(var, "testing")
    server = MotoS3Server()
    yield server
    server.stop()


@pytest.fixture
def unique_name(request) -> Callable[[str], str]:
    """Names that no other test uses: `unique_name("orders")` -> `orders-<test>-<hex>`."""
    test_part = "".join(ch if ch.isalnum() else "-" for ch in request.node.name)[:30].strip("-")

    def make(prefix: str) -> str:
        return f"{prefix}-{test_part}-{uuid.uuid4().hex[:8]}".lower()

    return make


@pytest.fixture
def s3_bucket(moto_s3: MotoS3Server, unique_name) -> str:
    """A fresh, empty bucket on the moto server."""
    name = unique_name("bkt")[:63].rstrip("-")
    moto_s3.create_bucket(name)
    return name


@pytest.fixture
def metadata(etcd_endpoint):
    """An `EtcdMetadataStore` on the session's etcd server, closed after the test."""
    from danube_core.metadata_etcd import EtcdMetadataStore

    store = EtcdMetadataStore(etcd_endpoint)
    yield store
    store.close()


@pytest.fixture
def s3_store(moto_s3, s3_bucket):
    """An `ObjectStore` on a fresh bucket of the moto S3 server."""
    from danube_core.objectstore import ObjectStore

    return ObjectStore(f"s3://{s3_bucket}", moto_s3.storage_options)


@pytest.fixture(scope="session")
def spark():
    """The one local[2] SparkSession with Delta for the whole run (fast settings, UI off)."""
    from pyspark.sql import SparkSession

    from pipelines.session import package_settings

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    warehouse = tempfile.mkdtemp(prefix="spark-warehouse-")
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("danube-spark-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.warehouse.dir", warehouse)
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.sql.sources.parallelPartitionDiscovery.parallelism", "2")
        # Python workers can be slow to connect back on a loaded 2-core machine.
        .config("spark.python.authenticate.socketTimeout", "120s")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
    )
    # The same Delta and spark-avro jars the pipelines use (one place: pipelines.session).
    session = builder.config(map=package_settings()).getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    from connectors import register

    register(session)
    yield session
    session.stop()
    shutil.rmtree(warehouse, ignore_errors=True)


_RUNNING_ETCD: list[EmbeddedEtcd] = []  # the session's etcd once a test has started it


@pytest.fixture(scope="session")
def golden_etcd() -> Iterator[EmbeddedEtcd]:
    """An etcd of its own for the real broker's golden scenarios: their keys are cluster-wide
    (`/cluster/leader`, registrations) and must never meet the suite's brokers."""
    from tests.golden import require_golden

    require_golden()
    server = EmbeddedEtcd()
    yield server
    server.stop()


@pytest.fixture
def golden(golden_etcd: EmbeddedEtcd):
    """`golden("moved")` replays that scenario's etcd keys and returns its read options."""
    from danube_core.metadata_etcd import EtcdMetadataStore
    from tests.golden import GoldenScenario, replay

    def load(scenario: str) -> GoldenScenario:
        with EtcdMetadataStore(golden_etcd.endpoint) as store:
            replay(store, scenario)
        return GoldenScenario(scenario, golden_etcd.endpoint)

    return load


@pytest.fixture(scope="module", autouse=True)
def _fake_registrations_removed() -> Iterator[None]:
    """After each test module, remove the fake broker registrations its TopicBuilders left in etcd.

    They carry no lease, so they would outlive the module, and the leader of a later module's
    real broker could place topics on a broker that does not exist. (Per module, not per test:
    module fixtures keep builders for all their tests.) The stores the builders used may be
    closed by now, so a store of this fixture's own does the deleting.
    """
    yield
    from danube_core.keys import register_key
    from danube_core.metadata_etcd import EtcdMetadataStore
    from tests.topic_builder import TopicBuilder

    left = {broker_id for builder in TopicBuilder.unclosed for broker_id in builder.registered
            if isinstance(builder.metadata, EtcdMetadataStore)}
    TopicBuilder.unclosed.clear()
    if left and _RUNNING_ETCD:
        with EtcdMetadataStore(_RUNNING_ETCD[0].endpoint) as store:
            for broker_id in left:
                store.delete(register_key(broker_id))
