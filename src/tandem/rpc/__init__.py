"""The sharded target over gRPC: protos/shard.proto, its codec, the shard server, and
GrpcShardGroup, the scheduler's side of it."""
