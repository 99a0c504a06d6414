"""The one way an engine's shard group is built from an EngineConfig: one in-process rank,
or a GrpcShardGroup over the shard servers a launcher starts (local processes by default,
Ray actors for the scheduler actor)."""
from __future__ import annotations

from tandem.config import EngineConfig


def build_group(config: EngineConfig, *, launcher=None, progress: bool = True, **group_options):
    """(the group, the LoadedModel whose tokenizer the engine uses)."""
    if launcher is None and config.shards == 1:
        from tandem.shard.factory import build_model_shard
        from tandem.shard.local_group import LocalShardGroup

        shard, loaded = build_model_shard(config.shard_spec(), progress=progress)
        return LocalShardGroup(shard), loaded
    from tandem.model.loader import load_tokenizer
    from tandem.rpc.grpc_group import GrpcShardGroup
    from tandem.rpc.launcher import ProcessLauncher

    group = GrpcShardGroup(config.shard_spec(), launcher or ProcessLauncher(config.shards), **group_options)
    return group, load_tokenizer(config.model, progress=progress)
