"""SlotBlocks: the block tables of the draft model's own KV pool, one per slot.

The draft model lives on rank 0 only, so its pool needs no layout shared across ranks and
no prefix cache: a prefilled sequence's draft KV is fed again from its tokens (the draft
model is the small one). Blocks are taken as a slot's context grows and given back when
a verdict shortens it past them.
"""
from __future__ import annotations


class DraftPoolFull(RuntimeError):
    """No free block for a draft model's rows: the propose fails, the sequence decodes plainly."""


class SlotBlocks:
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.free = list(range(num_blocks - 1, -1, -1))
        self.tables: dict[int, list[int]] = {}

    def cover(self, slot: int, positions: int) -> list[int]:
        """The slot's table, grown to cover positions 0..positions-1."""
        table = self.tables.setdefault(slot, [])
        need = -(-positions // self.block_size) - len(table)
        if need > len(self.free):
            raise DraftPoolFull(f"the draft model's KV pool has {len(self.free)} free blocks, slot {slot} needs {need}")
        for _ in range(max(0, need)):
            table.append(self.free.pop())
        return table

    def shrink(self, slot: int, positions: int) -> None:
        """Give back the slot's blocks wholly past its first `positions` positions."""
        table = self.tables.get(slot)
        if table is None:
            return
        keep = -(-positions // self.block_size)
        while len(table) > keep:
            self.free.append(table.pop())
        if not table:
            del self.tables[slot]
