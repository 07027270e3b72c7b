"""The development stack: the local processes the demo, the tests and the benchmarks run on.

`broker_stack` (etcd + our broker on local storage), `speedlayer_stack` (a master, workers and
a gateway) and `demo` (`./demo.sh`, i.e. `python -m devstack demo`) start the product's own
commands as processes; the local etcd and the port helpers are the product's
(`danube_core.embedded_etcd`, `danube_core.ports`), since the broker can start that etcd too.
Nothing of the product imports this package, so a stack that starts everything never becomes a
dependency of what it starts (`tests/unit/test_package_edges.py` holds that).
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]  # the checkout: `conf/`, the demo's pipeline file
