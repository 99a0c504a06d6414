"""A fixed block table per slot over a paged KV cache, for tests that drive the model's
forward without a scheduler. The blocks are shuffled, so no sequence's blocks lie in order
and every forward reads them where they lie."""
from __future__ import annotations

import torch


class SlotTables:
    def __init__(self, model, num_slots: int, positions: int, block_size: int = 4, seed: int = 0):
        per = -(-positions // block_size)
        self.cache = model.new_cache(num_slots * per, block_size)
        order = torch.randperm(num_slots * per, generator=torch.Generator().manual_seed(seed))
        self.tables = order.view(num_slots, per).to(torch.int32).to(model.device)
        self.device = model.device

    def __call__(self, model, tokens: torch.Tensor, slots: list[int], starts: list[int], **kw):
        """The forward of tokens [n, k]: sequence i in slot slots[i], from position starts[i]."""
        return model(tokens.to(self.device), torch.tensor(starts, dtype=torch.int32, device=self.device), self.cache,
                     self.tables[torch.tensor(slots, device=self.device)], **kw)
