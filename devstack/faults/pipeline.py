"""`python -m devstack.faults.pipeline run <file.yaml>`: `python -m pipelines run` with the fault
battery's hooks (`devstack.faults.hook.FaultHooks`) passed into the sink.

The battery starts every pipeline this way (`devstack.faults.kit.Pipeline`); without
`DANUBE_FAULT_AT` the hooks do nothing and the run is the product's own command.
"""

import sys

from devstack.faults.hook import FaultHooks
from pipelines.__main__ import main

if __name__ == "__main__":
    sys.exit(main(hooks=FaultHooks()))
