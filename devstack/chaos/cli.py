"""The soak: the whole platform under a seeded schedule of overlapping faults, then judged.

    python bench/soak.py --minutes 60 --seed 7 [--faults all|kind,...] [--plant duplicate|lose]

Starts the whole platform on this machine (a 3-member etcd, two brokers, S3 on moto, two
pipelines into Delta, the speed layer with two masters, three workers and a gateway), runs
steady producers and gateway readers, carries out the seed's schedule of overlapping faults
for `--minutes`, heals, waits for everything to catch up, and prints the checker's counts
per anomaly class, the schedule and the figures. Exit 0: every anomaly class is 0; 1: the
checker found anomalies (logs and tables kept, path printed); 2: bad arguments; 3: a part of
the platform could not start (named, with why).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from devstack.chaos.plant import PLANTS
from devstack.chaos.run import SoakOptions, run_soak
from devstack.chaos.schedule import KINDS, NOT_DONE, parse_kinds


def parse_options(argv: list[str] | None = None) -> SoakOptions:
    parser = argparse.ArgumentParser(prog="python bench/soak.py", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="fault kinds: " + ", ".join(KINDS) + "\nnot available: "
                                     + "; ".join(f"{k} ({why})" for k, why in NOT_DONE.items()))
    parser.add_argument("--minutes", type=float, default=60.0, help="length of the fault window (default 60)")
    parser.add_argument("--seed", type=int, default=1, help="the schedule's seed (same seed, same schedule)")
    parser.add_argument("--faults", default="all", help="'all' or comma-separated fault kinds")
    parser.add_argument("--rate", type=float, default=5.0, help="messages a second per producer (default 5)")
    parser.add_argument("--plant", choices=PLANTS, default=None,
                        help="plant a defect halfway (the negative control): the checker must fail the run")
    parser.add_argument("--workdir", type=Path, default=None, help="where to run (default: a new temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir even when the run passes")
    parser.add_argument("--results", type=Path, default=None, help="also write the report's JSON there")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.rate <= 0:
        parser.error(f"--minutes {args.minutes} / --rate {args.rate}: both must be > 0")
    try:
        kinds = parse_kinds(args.faults)
    except ValueError as exc:
        parser.error(str(exc))
    return SoakOptions(minutes=args.minutes, seed=args.seed, kinds=kinds, rate_per_s=args.rate, plant=args.plant,
                       workdir=args.workdir, keep=args.keep, results=args.results)


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = run_soak(options, lambda line: print(line, flush=True))
    if result.verdict is None:
        return 3
    return 0 if result.verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
