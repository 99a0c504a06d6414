"""PagedKVCache: every layer's K and V as one pool of fixed-size blocks.

Which blocks hold a sequence is not the cache's business: the scheduler owns the block
tables (tandem.kv.KVBlockManager) and every command says where its rows go, so every
tensor-parallel rank keeps the same layout without an allocator of its own.
"""
from __future__ import annotations

import mmap

import torch


class PagedKVCache:
    """k[layer], v[layer]: [num_blocks + scratch, kv_heads, block_size, head_dim].

    The tensors never change shape (a forward over them can be captured in a CUDA graph).
    A block past num_blocks, when `scratch_blocks` asks for it, belongs to no sequence:
    the padding rows of a captured forward write there. Rows past a sequence's committed
    length (rejected drafts) are never read: the attention ends at each row's own
    position, and the next write of that position overwrites them.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", scratch_blocks: int = 0):
        if min(num_layers, num_blocks, block_size, num_kv_heads, head_dim) < 1:
            raise ValueError("PagedKVCache sizes must all be >= 1, got "
                             f"layers={num_layers} blocks={num_blocks} block_size={block_size} "
                             f"kv_heads={num_kv_heads} head_dim={head_dim}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.scratch_block = num_blocks if scratch_blocks > 0 else None
        shape = (num_blocks + scratch_blocks, num_kv_heads, block_size, head_dim)
        # zeros, not empty: a block's unwritten rows are masked, and 0 * NaN would not be 0
        self.k = [_zeros(shape, dtype, device) for _ in range(num_layers)]
        self.v = [_zeros(shape, dtype, device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """What one block of K and V costs across every layer."""
        return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def table_tensor(self, tables: list[list[int]], reach: int) -> torch.Tensor:
        """Block tables as one int32 [n, W] tensor on the cache's device, wide enough for
        positions 0..reach-1, each padded with the scratch block: a forward's pad rows past
        a sequence's own blocks write there."""
        if self.scratch_block is None:
            raise ValueError("padded block tables need a cache with a scratch block (scratch_blocks=1)")
        width = max(-(-reach // self.block_size), max(len(t) for t in tables))
        rows = [t + [self.scratch_block] * (width - len(t)) for t in tables]
        return torch.tensor(rows, dtype=torch.int32, device=self.k[0].device)

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, blocks: torch.Tensor,
              offsets: torch.Tensor) -> None:
        """Rows [n, k, hkv, d] into block blocks[i, r] at offset offsets[i, r] ([n, k] each)."""
        self.k[layer][blocks, :, offsets] = key
        self.v[layer][blocks, :, offsets] = value


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """Zeros; on the CPU in anonymous memory the kernel maps on first write, so a pool costs
    the memory its sequences have touched, not its whole budget up front."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    count = 1
    for size in shape:
        count *= size
    buffer = mmap.mmap(-1, max(1, count * torch.empty(0, dtype=dtype).element_size()))
    return torch.frombuffer(buffer, dtype=dtype, count=count).view(shape)




def fixed_tables(num_seqs: int, positions: int, block_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Block tables [num_seqs, m] that give sequence i the blocks i*m .. i*m + m - 1, m blocks
    of `positions` positions each: for tools that run a fixed batch through the model (a
    cache of num_seqs * m blocks) without a scheduler."""
    m = -(-positions // block_size)
    return torch.arange(num_seqs * m, dtype=torch.int32, device=device).view(num_seqs, m)
