"""What crosses the wire between the speed layer's processes and their clients, in one place.

`master_rpc` is the gRPC protocol of the masters (message limits, keepalive, the leader gate's
trailing metadata, the workers' reconnect backoff cap); `query` is the Arrow Flight query
protocol of the gateway and the workers. Both ends of a call import these modules, so neither
end imports the other: nothing here imports a role (`master/`, `worker/`, `gateway/`) or
`clients/`.
"""
