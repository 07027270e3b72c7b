"""`python -m devstack.faults.master [--pause-after-planned-s S] master --config ...`: `python -m
speedlayer master` with the failover tests' admission hook passed in.

With `--pause-after-planned-s`, the leader's admissions wait that long after their epoch is
persisted PLANNED and before any worker is assigned: the window in which
`tests/speedlayer/test_failover.py` kills the leader to prove the next one resumes the record.
Without it the hook does nothing and the run is the product's own command.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from speedlayer.master import process
from speedlayer.master.admission_hooks import AdmissionHooks
from speedlayer.records import AssignmentRecord

logger = logging.getLogger(__name__)


class PauseAfterPlanned(AdmissionHooks):
    """Sleeps `seconds` once an admission's epoch is PLANNED, before it is assigned."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def after_planned(self, record: AssignmentRecord) -> None:
        if self.seconds > 0:
            logger.warning("fault injection: pausing %.1fs after PLANNED of %s/%s/%s", self.seconds,
                           record.tenant, record.dataset, record.epoch)
            time.sleep(self.seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.faults.master", description=__doc__.splitlines()[0])
    parser.add_argument("--pause-after-planned-s", type=float, default=0.0,
                        help="seconds the leader waits between PLANNED and assigning an admission's epoch")
    process.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return process.run(args, hooks=PauseAfterPlanned(args.pause_after_planned_s))


if __name__ == "__main__":
    sys.exit(main())
