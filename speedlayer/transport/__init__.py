"""gRPC transport (seed §11 `internal/transport/grpc`): service handlers, worker streams, the leader gate."""
