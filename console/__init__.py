"""The operations console: a read-only web view of the whole platform (topics, brokers,
pipelines, the speed layer, a topic browser), served by `python -m console --config
conf/console.yaml`, with admission and drain behind `--allow-actions` and a token.

Everything it shows comes from etcd (through one watch-synced `LocalCache`), storage, Delta
logs and the components' Prometheus endpoints; nothing is asked of the components.
"""
