"""Shared core of danube-spark: what both the broker and the Spark connector need.

Codecs for the Danube v0.7.3 on-disk and on-wire formats (WAL frames, bincode payloads,
checkpoints), the etcd key layout and JSON records, the metadata and object stores. No gRPC
and no Spark here, so executors and the broker can import it cheaply. Import submodules
directly (``from danube_core.frames import scan_frames``); this package imports nothing heavy.
"""
