"""The Spark Declarative Pipelines example (`pipelines/sdp_example`) run by `spark-pipelines run`.

`spark-pipelines` starts its own Spark Connect server, so this is a subprocess test; the data
source is found through `pyspark_danube` on the workers' PYTHONPATH, as in a real project. The
streaming table is checked through its Delta log (record counts of the added files).
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.objectstore import ObjectStore
from devstack import REPO_ROOT
from tests.integration.test_spark_submit import delta_records
from tests.topic_builder import TopicBuilder

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EXAMPLE = REPO_ROOT / "pipelines" / "sdp_example"


def test_declarative_pipeline_streams_a_topic_into_a_delta_table(etcd_endpoint, tmp_path, unique_name):
    name = unique_name("sdp")
    store = ObjectStore(str(tmp_path / "objects"))
    with EtcdMetadataStore(etcd_endpoint) as metadata:
        topic = TopicBuilder.with_backlog(metadata, store, str(tmp_path / "wal"), f"/default/{name}", 25, 5)
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__"))
    spec = yaml.safe_load((project / "spark-pipeline.yaml").read_text())
    spec["storage"] = (tmp_path / "sdp-storage").as_uri()  # SDP wants an absolute URI
    spec["configuration"].update({"danube.etcd.endpoints": etcd_endpoint, "danube.storage.url": store.url,
                                  "danube.topic": topic.name, "danube.subscription": name})
    (project / "spark-pipeline.yaml").write_text(yaml.safe_dump(spec))

    done = subprocess.run(
        [str(EXAMPLE / "run.sh"), "--spec", str(project / "spark-pipeline.yaml"), "--conf", "spark.ui.enabled=false"],
        cwd=str(tmp_path),
        capture_output=True, text=True, timeout=900,
    )

    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert delta_records(tmp_path / "spark-warehouse" / "orders_bronze") == 30  # under the working dir
