"""Admin CLI: `python -m speedlayer admin --masters h:p[,h:p] admit|status|workers|drain|quota ...`.

Output is JSON (one object), so scripts can read it; a refused request prints the master's
status code and message to stderr and exits 1. So does a wrong `--masters`, within the connect
timeout: one line naming each address and why it was not reached, or that the server there is
not a master (`MastersUnreachableError`, `WrongServerError`).
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid

import grpc
from google.protobuf.json_format import MessageToDict

from speedlayer.clients.management_client import DEFAULT_CONNECT_TIMEOUT_S, ManagementClient, delta_request


def add_parser(sub: argparse._SubParsersAction) -> None:
    admin = sub.add_parser("admin", help="admin CLI over the ManagementService")
    admin.add_argument("--masters", required=True, help="host:port of one or more masters (comma-separated)")
    admin.add_argument("--deadline-s", type=float, default=30.0, help="give up retrying after this long")
    admin.add_argument("--connect-timeout-s", type=float, default=DEFAULT_CONNECT_TIMEOUT_S,
                       help="give up on a master that accepts no connection within this long")
    commands = admin.add_subparsers(dest="admin_command", required=True)
    admit = commands.add_parser("admit", help="admit a Delta table (or an Iceberg table) as a dataset")
    admit.add_argument("--tenant", required=True)
    admit.add_argument("--dataset", required=True)
    admit.add_argument("--delta", help="Delta table URI (path, file:// or s3://)")
    admit.add_argument("--version", type=int, help="Delta version (default: latest)")
    admit.add_argument("--iceberg", help="Iceberg table as catalog.database.table")
    admit.add_argument("--partition", action="append", default=[],
                       help="col=value[,col=value] to load (repeatable; default: every partition)")
    admit.add_argument("--replication", type=int, default=0,
                       help="replicas wanted, each on its own worker (0: replication_factor of /tenants/{t}/config, "
                            "else of /config/global, default 2); given again for an admitted version, changes its epoch's")
    admit.add_argument("--request-id", help="idempotency key (default: a new one; reuse it to retry)")
    admit.add_argument("--tail-pipeline", metavar="FILE",
                       help="serve the topic's tail beside each epoch: the pipeline file that writes the --delta "
                            "table (sent as text; off without it)")
    admit.add_argument("--tail-limit-rows", type=int, default=1_000_000,
                       help="tail rows a worker holds at most (default 1000000); past it the tail says it is behind")
    admit.add_argument("--tail-limit-bytes", type=int, default=0, help="tail bytes a worker holds at most (0: none)")
    status = commands.add_parser("status", help="a dataset's epochs and their replicas")
    status.add_argument("--tenant", required=True)
    status.add_argument("--dataset", required=True)
    status.add_argument("--epoch", default="")
    workers = commands.add_parser("workers", help="live workers")
    workers.add_argument("--tenant", default="")
    drain = commands.add_parser("drain", help="move a worker's epochs away and tell it to DRAIN")
    drain.add_argument("--tenant", required=True)
    drain.add_argument("--worker", required=True)
    quota = commands.add_parser("quota", help="show or set a tenant's memory quota")
    quota.add_argument("--tenant", required=True)
    quota.add_argument("--memory-bytes", type=int, help="new quota (0: unlimited); omit to show")
    quota.add_argument("--source-root", action="append", default=[], help="table URIs the tenant may admit")


def _partitions(values: list[str]) -> list[dict[str, str]]:
    specs = []
    for value in values:
        pairs = [item.split("=", 1) for item in value.split(",")]
        if any(len(p) != 2 for p in pairs):
            raise SystemExit(f"--partition {value!r}: expected col=value[,col=value]")
        specs.append(dict(pairs))
    return specs


def _admit_request(args: argparse.Namespace):
    from speedlayer.api.v1 import management_service_pb2 as mg

    request_id = args.request_id or uuid.uuid4().hex
    if args.iceberg:
        parts = args.iceberg.split(".")
        if len(parts) != 3:
            raise SystemExit(f"--iceberg {args.iceberg!r}: expected catalog.database.table")
        source = mg.DataSourceIdentifier(iceberg_table=mg.IcebergTable(catalog=parts[0], database=parts[1], table=parts[2]))
        return mg.AdmitDatasetRequest(tenant_id=args.tenant, dataset_id=args.dataset, source=source,
                                      request_id=request_id, replication=args.replication,
                                      partitions_to_load=[mg.PartitionSpec(values=p) for p in _partitions(args.partition)])
    if not args.delta:
        raise SystemExit("admit: give --delta URI or --iceberg catalog.database.table")
    tail = None
    if args.tail_pipeline:
        try:
            text = open(args.tail_pipeline, encoding="utf-8").read()
        except OSError as exc:
            raise SystemExit(f"--tail-pipeline {args.tail_pipeline!r}: {exc.strerror or exc}") from exc
        tail = mg.TailOptions(pipeline_config=text, limit_rows=args.tail_limit_rows, limit_bytes=args.tail_limit_bytes)
    return delta_request(args.tenant, args.dataset, args.delta, request_id=request_id,
                         partitions=_partitions(args.partition), replication=args.replication, version=args.version,
                         tail=tail)


def run(args: argparse.Namespace) -> int:
    try:
        client = ManagementClient(args.masters, deadline_s=args.deadline_s, connect_timeout_s=args.connect_timeout_s)
    except ValueError as exc:
        print(f"error: --masters {args.masters!r}, --connect-timeout-s {args.connect_timeout_s}: {exc}",
              file=sys.stderr)
        return 2
    try:
        command = args.admin_command
        if command == "admit":
            reply = client.admit(_admit_request(args))
        elif command == "status":
            reply = client.status(args.tenant, args.dataset, args.epoch)
        elif command == "workers":
            reply = client.workers(args.tenant)
        elif command == "drain":
            reply = client.drain(args.tenant, args.worker)
        else:
            reply = client.quota(args.tenant, args.memory_bytes, args.source_root)
    except grpc.RpcError as exc:
        print(f"error: {exc.code().name}: {' '.join((exc.details() or '').split())}", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(json.dumps(MessageToDict(reply, preserving_proto_field_name=True), indent=2, sort_keys=True))
    return 0
