"""How big a rank's KV pool is: blocks from a memory budget, not from a slot count.

On a GPU the budget is what `gpu_memory_utilization` of the device leaves once the
weights are loaded (less room for a forward's activations, the way vLLM sizes its pool);
on the CPU a byte budget. An explicit `kv_cache_memory_gb` wins on either. The context of
one sequence, max_model_len, is the model's own (or the spec's), limited by the pool.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from tandem.errors import InvalidRequestError

log = logging.getLogger("tandem.shard")

CPU_DEFAULT_GB = 2.0
MAX_POOL_PER_SLOT_CONTEXT = 4
MIN_POOL_CAP = 1 << 14  # blocks: the cap never binds a small config below this
GIB = 1 << 30


@dataclass(frozen=True)
class PoolSize:
    num_blocks: int
    max_model_len: int
    pool_bytes: int  # what the pool takes: num_blocks x bytes a block


def activation_reserve(row_budget: int, vocab_size: int, hidden_size: int) -> int:
    """Room a forward of row_budget rows needs beside the pool: its float32 logits a few times
    over, and its hidden activations (the CUDA graphs' buffers come out of what
    gpu_memory_utilization leaves unused)."""
    return GIB + 3 * row_budget * vocab_size * 4 + 32 * row_budget * hidden_size * 4


def budget_bytes(spec, device: torch.device, reserve: int) -> int:
    if spec.kv_cache_memory_gb is not None:
        return int(spec.kv_cache_memory_gb * GIB)
    if device.type != "cuda":
        return int(CPU_DEFAULT_GB * GIB)
    free, total = torch.cuda.mem_get_info(device)
    left = int(spec.gpu_memory_utilization * total) - (total - free) - reserve
    if left <= 0:
        raise InvalidRequestError(
            "gpu_memory_utilization",
            f"{spec.gpu_memory_utilization} of {total / GIB:.1f} GiB leaves no room for the KV cache "
            f"({(total - free) / GIB:.1f} GiB in use, {reserve / GIB:.1f} GiB kept for activations)")
    return left


def pool_size(spec, model_context: int, bytes_per_block: int, device: torch.device, reserve: int) -> PoolSize:
    """Blocks of the pool and the context one sequence may use."""
    budget = budget_bytes(spec, device, reserve)
    context = spec.max_model_len or model_context
    # more blocks than every slot at its whole context several times over only hold old
    # prefixes (and a small model on a large GPU would get tens of millions of them)
    most = max(MAX_POOL_PER_SLOT_CONTEXT * spec.num_slots * -(-context // spec.block_size), MIN_POOL_CAP)
    num_blocks = min(budget // bytes_per_block, most)
    if num_blocks < 1:
        raise InvalidRequestError("kv_cache_memory_gb", f"{budget} bytes hold no KV block of {bytes_per_block} bytes")
    if spec.max_model_len is not None and spec.max_model_len > model_context:
        raise InvalidRequestError("max_model_len", f"{spec.max_model_len} exceeds the model's context of {model_context}")
    pool_tokens = num_blocks * spec.block_size
    wanted = spec.max_model_len or model_context
    if spec.max_model_len is not None and spec.max_model_len > pool_tokens:
        raise InvalidRequestError(
            "max_model_len", f"{spec.max_model_len} positions do not fit the KV pool of {pool_tokens} "
            f"({num_blocks} blocks of {spec.block_size}); raise kv_cache_memory_gb or gpu_memory_utilization")
    return PoolSize(num_blocks=num_blocks, max_model_len=min(wanted, pool_tokens), pool_bytes=num_blocks * bytes_per_block)
