"""Generated Protobuf/gRPC code of the speed layer API, package `speedlayer.v1`."""
