"""`python -m bench.fault_pipeline run <file.yaml>`: `python -m pipelines run` with the fault
battery's hooks (`bench.fault_hook.FaultHooks`) passed into the sink.

The battery starts every pipeline this way (`bench.fault_kit.Pipeline`); without
`DANUBE_FAULT_AT` the hooks do nothing and the run is the product's own command.
"""

import sys

from bench.fault_hook import FaultHooks
from pipelines.__main__ import main

if __name__ == "__main__":
    sys.exit(main(hooks=FaultHooks()))
