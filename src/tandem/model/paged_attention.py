"""Attention over a paged KV cache: each sequence's keys and values lie in blocks of the
pool, found through its block table.

    q:            [n, k, hq, d]   row r of sequence i sits at position start_pos[i] + r
    k/v cache:    [num_blocks, hkv, block_size, d]
    block_tables: [n, max_blocks] int32; position t of sequence i lives at
                  cache[block_tables[i, t // block_size], :, t % block_size]
    start_pos:    [n] int32
    -> out:       [n, k, hq, d] in q's dtype

Row r attends to positions 0..start_pos[i] + r of its own sequence (the rows of this
forward are written to the cache before the attention runs). Query head h reads kv head
h // (hq // hkv). Entries of a table past the blocks a sequence uses are never read.

`paged_attention` picks the kernel for the device; `paged_attention_reference` is the
plain definition (gather the blocks, then scaled_dot_product_attention) the kernels are
tested against.

Kernels: on CUDA tensors paged_attention_triton; on the CPU the C++ kernel of
paged_attention_cpu (built at first use), for every row count: it beat the reference at
every shape measured (2 threads; SmolLM2-135M, Qwen2.5-1.5B and Llama-8B heads):
decode and verify calls (1 or 5 rows, n 1..32, 512-2048 tokens) by 3.5-10x in float32
and 3.4-6.3x in bfloat16 (bench/paged_attention_cpu.py), and prefill chunks of 64-1024
rows by 1.2-1.9x over 256-2048 cached tokens and 1.8-3x from an empty cache in float32
(1.7-3.4x in bfloat16). SDPA's CPU kernel with an explicit mask computes the whole
masked rectangle; the kernel skips the keys past each row tile's last position. So no
row threshold sends work back to the reference. The reference serves where the kernel
does not: autograd, other dtypes, no compiler (one warning), or
TANDEM_PAGED_ATTENTION=reference in the environment.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

CPU_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def paged_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              block_tables: torch.Tensor, start_pos: torch.Tensor) -> torch.Tensor:
    """The definition: every sequence's blocks gathered into a contiguous context first."""
    n, k, hq, d = q.shape
    _, hkv, bs, _ = k_cache.shape
    g = hq // hkv
    ctx = int(start_pos.max()) + k
    nblk = -(-ctx // bs)
    table = block_tables[:, :nblk].long()
    # [n, nblk, hkv, bs, d] -> [n, hkv, nblk * bs, d]
    keys = k_cache[table].permute(0, 2, 1, 3, 4).reshape(n, hkv, nblk * bs, d)
    values = v_cache[table].permute(0, 2, 1, 3, 4).reshape(n, hkv, nblk * bs, d)
    pos = start_pos.long()[:, None] + torch.arange(k, device=q.device)  # [n, k]
    allowed = torch.arange(nblk * bs, device=q.device) <= pos[:, :, None]  # [n, k, L]
    mask = allowed[:, None, None].expand(n, 1, g, k, nblk * bs).reshape(n, 1, g * k, nblk * bs)
    # the g query heads of a kv head folded into the row dim (no repeated K/V)
    qf = q.view(n, k, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(n, hkv, g * k, d)
    out = F.scaled_dot_product_attention(qf, keys, values, attn_mask=mask)  # [n, hkv, g*k, d]
    return out.view(n, hkv, g, k, d).permute(0, 3, 1, 2, 4).reshape(n, k, hq, d)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, start_pos: torch.Tensor) -> torch.Tensor:
    """The attention of `q` over the paged cache, with the kernel for its device."""
    if q.is_cuda:
        from tandem.model.paged_attention_triton import paged_attention_triton

        return paged_attention_triton(q, k_cache, v_cache, block_tables, start_pos)
    if _cpu_kernel_serves(q, k_cache, v_cache):
        from tandem.model.paged_attention_cpu import load_kernel, paged_attention_cpu

        if load_kernel() is not None:
            return paged_attention_cpu(q, k_cache, v_cache, block_tables, start_pos)
    return paged_attention_reference(q, k_cache, v_cache, block_tables, start_pos)


def _cpu_kernel_serves(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    if os.environ.get("TANDEM_PAGED_ATTENTION", "") == "reference":
        return False
    if q.device.type != "cpu" or q.dtype not in CPU_KERNEL_DTYPES:
        return False
    # no backward in the kernel
    return not (torch.is_grad_enabled() and (q.requires_grad or k_cache.requires_grad or v_cache.requires_grad))
