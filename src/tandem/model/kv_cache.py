"""KVCache: preallocated per-layer K/V for a fixed number of sequence slots."""

from __future__ import annotations

import torch


class KVCache:
    """K and V of every layer for `num_slots` sequences of up to `max_seq_len` positions.

    The tensors never change shape (so a forward over them can be captured in a CUDA
    graph); the model writes rows at the positions it is told. `lengths` is host-side
    bookkeeping for the caller (how many positions of each slot are committed): the
    forward neither reads nor changes it. Rewinding after a rejected draft is just
    `set_length`: stale rows beyond the length are never attended (the forward's causal
    mask ends at each row's own position) and are overwritten by the next write.
    """

    def __init__(self, num_layers: int, num_slots: int, max_seq_len: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 scratch_slots: int = 0):
        if min(num_layers, num_slots, max_seq_len, num_kv_heads, head_dim) < 1:
            raise ValueError("KVCache sizes must all be >= 1, got "
                             f"layers={num_layers} slots={num_slots} max_seq_len={max_seq_len} "
                             f"kv_heads={num_kv_heads} head_dim={head_dim}")
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        # Slots past num_slots belong to no sequence: the padding rows of a captured forward
        # (a batch padded to its graph's size) write there.
        self.scratch_slot = num_slots if scratch_slots > 0 else None
        shape = (num_slots + scratch_slots, num_kv_heads, max_seq_len, head_dim)
        # k[layer], v[layer]: [slots, kv_heads, max_seq_len, head_dim]
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.lengths = [0] * num_slots

    @classmethod
    def for_model(cls, config, num_slots: int, max_seq_len: int, dtype: torch.dtype = torch.float32,
                  device: torch.device | str = "cpu", num_kv_heads: int | None = None,
                  scratch_slots: int = 0) -> "KVCache":
        """A cache shaped for `config` (a ModelConfig); pass `num_kv_heads` for one tensor-parallel rank."""
        return cls(config.num_layers, num_slots, max_seq_len, num_kv_heads or config.num_kv_heads,
                   config.head_dim, dtype, device, scratch_slots)

    def set_length(self, slot: int, length: int) -> None:
        self._check_slot(slot)
        if not 0 <= length <= self.max_seq_len:
            raise ValueError(f"length {length} for slot {slot} is outside 0..{self.max_seq_len}")
        self.lengths[slot] = length

    def reset(self, slot: int) -> None:
        self.set_length(slot, 0)

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot} is outside 0..{self.num_slots - 1}")


def consecutive_start(slots: list[int]) -> int | None:
    """slots[0] when slots are slots[0], slots[0] + 1, ... in order (the forward's
    slot_start: it then reads the cache in place), else None."""
    first = slots[0] if slots else None
    return first if first is not None and all(s == first + i for i, s in enumerate(slots)) else None
