"""The uploader contract (tests/unit/test_uploader.py) against a real etcd with local files
(`file://`) and with S3 (moto): descriptor JSON, keys and `cur` exactly as spec §5.2, object
bytes equal to the WAL frames, the sparse index, resume across restarts, half-written frames
and crashes on either side of the descriptor put."""

from __future__ import annotations

from typing import Iterator

import pytest

from broker.wal import Wal, WalConfig
from danube_core.keys import StorageKeys
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.objectstore import ObjectStore
from tests.unit.test_uploader import Backend, FakeClock, UploaderContract, make_msg


class TestFileStoreWithEtcd(UploaderContract):
    @pytest.fixture
    def backend(self, tmp_path, etcd_endpoint) -> Iterator[Backend]:
        metadata = EtcdMetadataStore(etcd_endpoint)
        yield Backend(ObjectStore(f"file://{tmp_path}/cloud"), metadata, StorageKeys(), str(tmp_path / "wal"))
        metadata.close()


class TestS3WithEtcd(UploaderContract):
    @pytest.fixture
    def backend(self, tmp_path, etcd_endpoint, moto_s3, s3_bucket) -> Iterator[Backend]:
        metadata = EtcdMetadataStore(etcd_endpoint)
        store = ObjectStore(f"s3://{s3_bucket}/prefix", moto_s3.storage_options)
        yield Backend(store, metadata, StorageKeys(), str(tmp_path / "wal"))
        metadata.close()

    def test_s3_object_key_has_no_etcd_root_and_the_descriptor_an_etag(self, backend, topic, s3_bucket):
        with Wal.open(topic, WalConfig(root=backend.wal_root, fsync_interval_ms=3_600_000, durable=False)) as wal:
            wal.append(make_msg(0, topic.broker_name))
            wal.flush()
            descriptor = self.uploader(backend, topic, wal, FakeClock()).run_cycle()
        assert descriptor.etag  # S3 reports one; the fs backends give null (§9.3)
        key = f"{s3_bucket}/prefix/storage/topics/{topic.storage_path}/objects/{descriptor.object_id}"
        assert backend.store.exists(f"s3://{key}")
