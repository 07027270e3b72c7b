"""The speed layer (seed 002): hot snapshots of Delta (and Iceberg) tables in worker memory.

An **epoch** is one version of a dataset; a **LoadPlan** is the immutable list of what a worker
loads for it. Masters (one leader, elected through etcd) admit datasets, plan epochs and place
them on a tenant's workers; workers pull exactly the files of their plans into DuckDB.

Packages, one direction only (`tests/unit/test_package_edges.py` holds it): the roles
`master/` (admission, quotas, strategies, rebalancing, worker directory, its gRPC services and
the worker streams), `worker/` (control agent, loader, Flight queries) and `gateway/` (routing,
Flight forwarding), each with its own `process.py`, never import one another; `clients/` (the
management and query clients, the admin and query CLIs) imports no role; all of them share
`protocol/` (what crosses the wire), `sources/` (Delta and Iceberg readers), `observability/`,
`api/v1` (protos), `config`, `keys`, `records` and `errors`. `__main__` only dispatches.
"""
