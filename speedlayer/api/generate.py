"""Regenerate the committed `_pb2` / `_pb2_grpc` stubs: `python -m speedlayer.api.generate`.

The stubs are committed so that running the speed layer needs only `protobuf` and `grpcio`;
`grpcio-tools` is needed only to change a `.proto`.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ["speedlayer/api/v1/control_plane_service.proto", "speedlayer/api/v1/management_service.proto"]
# Messages only (no service of ours): no _pb2_grpc module.
MESSAGE_PROTOS = ["speedlayer/api/flight_sql.proto"]


def main() -> int:
    from grpc_tools import protoc

    args = ["protoc", f"-I{ROOT}", f"--python_out={ROOT}", f"--pyi_out={ROOT}"]
    services = protoc.main(args + [f"--grpc_python_out={ROOT}"] + [str(ROOT / p) for p in PROTOS])
    return services or protoc.main(args + [str(ROOT / p) for p in MESSAGE_PROTOS])


if __name__ == "__main__":
    sys.exit(main())
