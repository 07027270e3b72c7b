"""A master (seed §11 `internal/master` and `internal/transport/grpc`): admission, quotas, placement,
leadership, and the gRPC services and worker streams they are reached through."""
