"""Simulated speed-layer workers for control-plane scale runs: many agents in one process.

Each agent is the product's `WorkerAgent` (its EventStream, registration with a memory
capacity, heartbeats at the interval the master's ack names, leader following, reconnect
backoff, IN_PROGRESS/COMPLETED reports, drain), with one change: an assigned plan is not read.
Its epoch is held as an empty table name and reported COMPLETED (READY) with the plan's row
count at once, so the masters and etcd see the traffic of real workers while the agents cost
almost nothing. The agents of one process share one DuckDB (never written to) for the memory
figure their heartbeats report.

    python bench/speedlayer_agents.py --masters 127.0.0.1:7001,127.0.0.1:7002 \\
        --tenant bench --prefix w --first 0 --count 25 --memory-mb 1024

runs workers w0..w24 until SIGTERM/SIGINT (a SIGKILL of the process is a crash of all of them).
It prints one line `agents started N` on stdout once the agents' threads run.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from speedlayer.api.v1 import control_plane_service_pb2 as cp  # noqa: E402
from speedlayer.config import WorkerConfig  # noqa: E402
from speedlayer.worker.agent import WorkerAgent  # noqa: E402
from speedlayer.worker.loader import EpochLoader, LoadResult  # noqa: E402


class SimulatedWorker(WorkerAgent):
    """A `WorkerAgent` whose loads take no time and read nothing (see the module docstring)."""

    def _base_parts(self, event: cp.DataAssignmentEvent) -> tuple[str, ...] | None:
        return None  # every epoch is "loaded" whole: there are no tables to build on

    def _load_tables(self, event: cp.DataAssignmentEvent, base_parts: tuple[str, ...] | None) -> LoadResult:
        plan = event.load_plan
        self.tables.add_full((event.dataset_id, event.epoch_id), plan.destination_table_name)
        return LoadResult(rows=plan.total_rows, bytes=0, seconds=0.0, memory_bytes=0)


def start_agents(masters: list[str], tenant: str, worker_ids: list[str], memory_bytes: int) -> list[SimulatedWorker]:
    """Start one `SimulatedWorker` thread per id; they run until `stop()`."""
    loader = EpochLoader(memory_limit_bytes=64 * 1024 * 1024, threads=1)
    agents = [SimulatedWorker(WorkerConfig(tenant=tenant, worker_id=worker_id, masters=tuple(masters),
                                           address=f"127.0.0.1:{10000 + index}", memory_bytes=memory_bytes,
                                           threads=1), loader=loader)
              for index, worker_id in enumerate(worker_ids)]
    for agent in agents:
        threading.Thread(target=agent.run, name=f"agent-{agent.config.worker_id}", daemon=True).start()
    return agents


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--masters", required=True, help="host:port,host:port of the masters")
    parser.add_argument("--tenant", default="bench")
    parser.add_argument("--prefix", default="w", help="worker ids are <prefix><n>")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--memory-mb", type=int, default=1024, help="the capacity each agent registers")
    args = parser.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    ids = [f"{args.prefix}{n}" for n in range(args.first, args.first + args.count)]
    agents = start_agents(args.masters.split(","), args.tenant, ids, args.memory_mb * 1024 * 1024)
    print(f"agents started {len(agents)}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    for agent in agents:
        agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
