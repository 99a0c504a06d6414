"""Build one rank (target weights, its KV pool, rank-side drafter) from a ShardSpec.

The same spec builds the in-process rank of LocalShardGroup and each rank of a
shard server, so every rank of a group is made the same way.
"""
from __future__ import annotations

import logging
import time
from copy import deepcopy
from dataclasses import replace

import torch

from tandem.model.kv_cache import PagedKVCache
from tandem.model.loader import LoadedModel, load_model
from tandem.model.verify_graphs import VerifyGraphs
from tandem.shard.commands import RankDrafterInfo
from tandem.shard.kv_budget import activation_reserve, pool_size
from tandem.shard.model_shard import ModelShard
from tandem.shard.spec import ShardSpec

log = logging.getLogger("tandem.shard")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def _quantization(spec: ShardSpec, device: torch.device, loaded: LoadedModel, given: bool) -> tuple[str, LoadedModel]:
    """The method the rank's linear layers take (model.quant) and the LoadedModel to build
    on: a model the caller passed in is shared (a test's session model, a scheduler's
    own), so a copy of it is quantized, never the model itself."""
    from tandem.model import quant

    method = quant.resolve(spec.quantization, device, spec.dtype, loaded.source_quantized)
    have = loaded.model.quantization
    if have != method and have != "none":
        raise ValueError(f"the model given was quantized to {have}; this rank needs {method}")
    if have != method and given:
        loaded = replace(loaded, model=deepcopy(loaded.model))
    return method, loaded


def _quantize(model, method: str, loaded: LoadedModel, device: torch.device) -> None:
    """Quantize after any sharding: each tensor-parallel rank quantizes its own share."""
    from tandem.model import quant

    if model.quantization == method:
        return
    quant.quantize(model, method, loaded.tokenizer)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the float weights' memory goes to the KV pool


def build_model_shard(
    spec: ShardSpec,
    *,
    rank: int = 0,
    world_size: int = 1,
    tp_group=None,
    loaded: LoadedModel | None = None,
    progress: bool = True,
) -> tuple[ModelShard, LoadedModel]:
    device = resolve_device(spec.device)
    dtype = resolve_dtype(spec.dtype, device)
    given = loaded is not None
    if loaded is None:
        loaded = load_model(spec.model, dtype=dtype, device=device, progress=progress)
    method, loaded = _quantization(spec, device, loaded, given)
    model = loaded.model
    cfg = loaded.config
    num_kv_heads = cfg.num_kv_heads
    if world_size > 1:
        from tandem.model.tensor_parallel import kv_heads_for_rank, shard_model

        shard_model(model, rank, world_size, group=tp_group)
        num_kv_heads = len(kv_heads_for_rank(cfg.num_kv_heads, rank, world_size))
    _quantize(model, method, loaded, device)
    # CUDA graphs for the verify forward: one GPU rank (a tensor-parallel forward's collectives
    # stay eager), unless the spec turns them off.
    graphed = device.type == "cuda" and world_size == 1 and spec.cuda_graphs
    draft = None
    if rank == 0 and spec.drafter == "draft-model":
        from tandem.drafters.factory import load_draft_model

        draft = load_draft_model(spec, loaded, device=device, dtype=dtype, progress=progress)
    # One budget for the target's blocks and, beside them, the draft model's (as many).
    per_block = PagedKVCache.bytes_per_block(cfg.num_layers, spec.block_size, num_kv_heads, cfg.head_dim, dtype)
    if draft is not None:
        c = draft.config
        per_block += PagedKVCache.bytes_per_block(c.num_layers, spec.block_size, c.num_kv_heads, c.head_dim, dtype)
    reserve = activation_reserve(spec.row_budget, cfg.vocab_size, cfg.hidden_size)
    pool = pool_size(spec, cfg.max_position_embeddings, per_block, device, reserve)
    cache = PagedKVCache(cfg.num_layers, pool.num_blocks, spec.block_size, num_kv_heads, cfg.head_dim,
                         dtype, device, scratch_blocks=1)
    if device.type == "cpu":
        from tandem.model.paged_attention_cpu import load_kernel

        load_kernel()  # built (or loaded) now, inside Init: a first forward's build would outlast its deadline
    log.info("KV pool: %d blocks of %d tokens (%d tokens, %.2f GiB); max_model_len %d",
             pool.num_blocks, spec.block_size, cache.num_tokens, pool.pool_bytes / (1 << 30),
             pool.max_model_len)
    spec = replace(spec, max_model_len=pool.max_model_len)
    drafter = None
    if rank == 0 and spec.drafter != "none":  # "none": no drafter on the ranks
        from tandem.drafters.factory import build_rank_drafter

        drafter = build_rank_drafter(spec, loaded, device=device, dtype=dtype, progress=progress,
                                     draft=draft, num_blocks=pool.num_blocks)
    shard = ModelShard(
        model,
        cache,
        num_slots=spec.num_slots,
        max_model_len=pool.max_model_len,
        row_budget=spec.row_budget,
        vocab_size=cfg.vocab_size,
        rank=rank,
        world_size=world_size,
        drafter=drafter,
        # A batch within the row budget pads to under twice its rows: graphs of up to 2x
        # the budget keep every verify graphed (with 256, a batch of 33-51 sequences x 5
        # rows padded to 64 x 5 = 320 ran eagerly, launch-bound); capped, as each graph
        # keeps its [rows, vocab] float32 logits.
        graphs=VerifyGraphs(model, cache, pool.max_model_len, max_rows=min(2 * spec.row_budget, 512)) if graphed else None,
    )
    if graphed:
        t0 = time.perf_counter()
        n = shard.capture_graphs_ahead(spec.num_speculative_tokens + 1)
        log.info("captured %d verify and prefill CUDA graphs in %.1f s", n, time.perf_counter() - t0)
    return shard, loaded


def build_rank(spec: ShardSpec, rank: int, world_size: int, join_collective) -> tuple[ModelShard, RankDrafterInfo]:
    """One rank of a shard server (its Init): its own GPU where a process sees several,
    the collective group (join_collective(device)) when world_size > 1, then the shard."""
    from tandem.drafters.factory import rank_drafter_info

    device = resolve_device(spec.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", rank % torch.cuda.device_count())
    if device.type == "cuda":
        torch.cuda.set_device(device)
    spec = replace(spec, device=str(device))
    tp_group = join_collective(device) if world_size > 1 else None
    shard, _ = build_model_shard(spec, rank=rank, world_size=world_size, tp_group=tp_group, progress=False)
    drafter = rank_drafter_info(spec, shard.drafter)
    log.info("rank %d/%d ready on %s (drafter %s %s)", rank, world_size, device, drafter.kind, drafter.source)
    return shard, drafter
