"""The fault battery's parts: real processes to fault (`kit`: etcd, broker, pipeline, an
acknowledging producer, the Delta tally), the proxies that slow or cut etcd and S3
(`proxies`), the hooks a pipeline or a master is started with to die or pause at a named step
(`hook`, `pipeline`, `master`), and the cases (`cases`, `cases_infra`). `bench/faults.py` runs
them as the battery, `tests/integration/test_fault_battery.py` small, and the soak
(`devstack.chaos`) faults the same processes at once.
"""
