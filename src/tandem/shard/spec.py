"""ShardSpec: what one rank is built from (the wire's InitRequest.spec). No torch here:
the codec and the scheduler side read it without loading a model.

Its defaults are EngineConfig's, field by field (the same options, some named for a
rank): an engine's config.shard_spec() fills every one."""
from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields

from tandem.config import DEFAULT_NUM_SPECULATIVE_TOKENS, EngineConfig

_ENGINE = {f.name: f for f in fields(EngineConfig)}


def _engine_default(name: str):
    f = _ENGINE[name]
    return field(default=f.default) if f.default_factory is MISSING else field(default_factory=f.default_factory)


@dataclass(frozen=True)
class ShardSpec:
    model: str | None = _engine_default("model")
    dtype: str = _engine_default("dtype")
    device: str = _engine_default("device")
    num_slots: int = _engine_default("max_num_seqs")
    max_model_len: int | None = _engine_default("max_model_len")
    row_budget: int = _engine_default("row_budget")
    drafter: str = "none"  # the drafter on rank 0: one that runs on a rank (drafters.registry), or none
    draft_model: str | None = _engine_default("draft_model")
    dflash_checkpoint: str | None = _engine_default("dflash_checkpoint")
    num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS
    cuda_graphs: bool = _engine_default("cuda_graphs")
    dflash_cuda_graphs: bool = _engine_default("dflash_cuda_graphs")
    dflash_dtype: str | None = _engine_default("dflash_dtype")
    block_size: int = _engine_default("block_size")
    kv_cache_memory_gb: float | None = _engine_default("kv_cache_memory_gb")
    gpu_memory_utilization: float = _engine_default("gpu_memory_utilization")
    quantization: str = _engine_default("quantization")
