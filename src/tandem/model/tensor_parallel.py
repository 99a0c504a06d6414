"""Tensor parallelism applied to a finished LlamaForCausalLM from outside (gpt-fast style).

Each rank keeps a contiguous block of KV heads (with the query heads that read them) and a
contiguous block of MLP intermediate columns:
  q/k/v_proj, gate/up_proj  column-parallel: keep this rank's output rows (and bias rows)
  o_proj, down_proj         row-parallel: keep this rank's input columns; the partial
                            outputs are summed over ranks by an all-reduce hook
Embeddings, norms and the LM head stay replicated (simplest; the head is one matmul and
every rank then holds the full logits, so rank 0 can answer without a gather).
Splits need not be even: SmolLM2's 3 KV heads over 2 ranks give {0, 1} and {2}.
The model code is untouched; its attention reads the local head counts from the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from tandem.model.cpu_linear import share_fused_storage
from tandem.model.llama import LlamaForCausalLM


def split_range(size: int, rank: int, world_size: int) -> range:
    """Rank's contiguous block of `size` items; the first size % world_size ranks get one more."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    base, extra = divmod(size, world_size)
    if base == 0:
        raise ValueError(f"cannot split {size} items over {world_size} ranks: some rank would get none")
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


def kv_heads_for_rank(num_kv_heads: int, rank: int, world_size: int) -> range:
    """The KV heads (global indices) that `rank` holds; build its KVCache with len() of this."""
    return split_range(num_kv_heads, rank, world_size)


@dataclass(frozen=True)
class TensorParallelShare:
    """Which share of the model a rank holds (read by quant.packed_cache), and its group."""

    rank: int
    world_size: int
    group: object = None

    def __deepcopy__(self, memo):
        return self  # immutable, and a process group cannot be copied


def shard_model(model: LlamaForCausalLM, rank: int, world_size: int, group=None) -> LlamaForCausalLM:
    """Narrow `model` in place to this rank's share; every rank must run every forward."""
    if world_size == 1:
        return model
    config = model.config
    d, g = config.head_dim, config.queries_per_kv
    kv = kv_heads_for_rank(config.num_kv_heads, rank, world_size)
    q_rows = range(kv.start * g * d, kv.stop * g * d)  # query heads j*g .. j*g+g-1 read kv head j
    kv_rows = range(kv.start * d, kv.stop * d)
    columns = split_range(config.intermediate_size, rank, world_size)
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for linear in (attn.q_proj,):
            _keep_output_rows(linear, q_rows)
        for linear in (attn.k_proj, attn.v_proj):
            _keep_output_rows(linear, kv_rows)
        for linear in (mlp.gate_proj, mlp.up_proj):
            _keep_output_rows(linear, columns)
        _keep_input_columns(attn.o_proj, q_rows, rank, group)
        _keep_input_columns(mlp.down_proj, columns, rank, group)
    model.tensor_parallel_share = TensorParallelShare(rank, world_size, group)
    if model.lm_head.weight.is_cuda:
        share_fused_storage(model)  # the narrowed q/k/v and gate/up as one GEMM each again
    return model


def _keep_output_rows(linear: nn.Linear, rows: range) -> None:
    linear.weight = nn.Parameter(linear.weight[rows.start:rows.stop].clone(), requires_grad=False)
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias[rows.start:rows.stop].clone(), requires_grad=False)
    linear.out_features = len(rows)


def _keep_input_columns(linear: nn.Linear, columns: range, rank: int, group) -> None:
    linear.weight = nn.Parameter(linear.weight[:, columns.start:columns.stop].clone(), requires_grad=False)
    linear.in_features = len(columns)
    if linear.bias is not None and rank != 0:
        linear.bias = None  # added once, on rank 0, so the all-reduced sum has it exactly once
    linear.register_forward_hook(_all_reduce_hook(group))


def _all_reduce_hook(group):
    def hook(module: nn.Module, inputs, output: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(output, group=group)  # partial sums -> full output, on every rank
        return output
    return hook
