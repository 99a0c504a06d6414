"""The forward's logit_rows: the LM head on chosen rows only (the draft model's catch-up)."""
from __future__ import annotations

import torch

from paged_slots import SlotTables
from tandem.model.loader import load_model


def _model(tiny_model_dir, variant="qwen2"):
    return load_model(tiny_model_dir(variant), progress=False).model


def _run(model, tokens, slots, starts, **kw):
    cache = SlotTables(model, num_slots=4, positions=64)
    for slot, start in zip(slots, starts):  # some context before the rows
        cache(model, torch.arange(1, start + 1)[None], [slot], [0])
    return cache(model, tokens, slots, starts, **kw), cache.cache


def test_chosen_rows_equal_the_full_heads_rows(tiny_model_dir):
    for variant in ("qwen2", "llama-tied-llama3-rope"):
        model = _model(tiny_model_dir, variant)
        tokens = torch.randint(0, 256, (3, 7), generator=torch.Generator().manual_seed(0))
        rows = torch.tensor([[6], [2], [0]])  # e.g. each sequence's last real row
        full, _ = _run(model, tokens, [0, 2, 3], [5, 9, 1])
        some, _ = _run(model, tokens, [0, 2, 3], [5, 9, 1], logit_rows=rows)
        assert some.logits.shape == (3, 1, full.logits.shape[-1]) and some.logits.dtype == torch.float32
        want = full.logits.gather(1, rows[:, :, None].expand(-1, -1, full.logits.shape[-1]))
        torch.testing.assert_close(some.logits, want, rtol=1e-5, atol=1e-5)
        two = _run(model, tokens, [0, 2, 3], [5, 9, 1], logit_rows=torch.tensor([[0, 6], [1, 2], [3, 0]]))[0]
        torch.testing.assert_close(two.logits[:, 1], want[:, 0], rtol=1e-5, atol=1e-5)


def test_no_rows_writes_the_same_kv_and_returns_no_logits(tiny_model_dir):
    model = _model(tiny_model_dir)
    tokens = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(1))
    full, cache_full = _run(model, tokens, [1, 2], [3, 4])
    none, cache_none = _run(model, tokens, [1, 2], [3, 4], logit_rows=torch.empty(2, 0, dtype=torch.long))
    assert none.logits.shape == (2, 0, full.logits.shape[-1])
    for k_full, k_none in zip(cache_full.k + cache_full.v, cache_none.k + cache_none.v):
        assert torch.equal(k_full, k_none)
