"""The speed layer (seed 002): hot snapshots of Delta (and Iceberg) tables in worker memory.

An **epoch** is one version of a dataset; a **LoadPlan** is the immutable list of what a worker
loads for it. Masters (one leader, elected through etcd) admit datasets, plan epochs and place
them on a tenant's workers; workers pull exactly the files of their plans into DuckDB.

Packages: `master/` (admission, quotas, strategies, rebalancing, worker directory),
`transport/` (gRPC handlers, leader gate), `catalog/` (Delta and Iceberg connectors),
`worker/` (control agent, loader), `observability/` (audit, metrics, logs), `api/v1` (protos).
"""
