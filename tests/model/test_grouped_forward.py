"""One forward of a verify's rectangle and prompt chunks side by side (forward_groups)
gives each rectangle what its own forward gives: the same logits, captured rows and KV."""
from __future__ import annotations

import torch

from paged_slots import SlotTables
from tandem.model.grouped_forward import RowRectangle, forward_groups
from tandem.model.loader import load_model


def _context(model, tables: SlotTables, slots_starts):
    for slot, start in slots_starts:
        if start:
            tables(model, torch.arange(1, start + 1)[None] % 200, [slot], [0])


def _rect(tables: SlotTables, tokens, slots, starts, logit_rows=None) -> RowRectangle:
    return RowRectangle(tokens=tokens, start_pos=torch.tensor(starts, dtype=torch.int32),
                        tables=tables.tables[torch.tensor(slots)], logit_rows=logit_rows)


def test_rectangles_in_one_forward_equal_their_own_forwards(tiny_model_dir):
    for variant in ("qwen2", "llama-tied-llama3-rope"):
        model = load_model(tiny_model_dir(variant), progress=False).model
        gen = torch.Generator().manual_seed(3)
        verify = torch.randint(0, 256, (3, 4), generator=gen)  # 3 sequences x 4 rows
        chunk = torch.randint(0, 256, (1, 13), generator=gen)  # a prompt chunk after 8 cached tokens
        prompts = torch.randint(0, 256, (2, 6), generator=gen)  # two fresh prompts (pad rows at the end)
        capture = (0, 1)
        alone, together = SlotTables(model, 8, 64), SlotTables(model, 8, 64)
        for t in (alone, together):
            _context(model, t, [(0, 5), (1, 9), (2, 1), (3, 8)])
        want = [
            alone(model, verify, [0, 1, 2], [5, 9, 1], capture_layers=capture),
            alone(model, chunk, [3], [8], capture_layers=capture, logit_rows=torch.tensor([[12]])),
            alone(model, prompts, [4, 5], [0, 0], capture_layers=capture, logit_rows=torch.tensor([[5], [3]])),
        ]
        got = forward_groups(model, together.cache, [
            _rect(together, verify, [0, 1, 2], [5, 9, 1]),
            _rect(together, chunk, [3], [8], [[12]]),
            _rect(together, prompts, [4, 5], [0, 0], [[5], [3]]),
        ], capture)
        for w, g in zip(want, got):
            assert g.logits.shape == w.logits.shape
            torch.testing.assert_close(g.logits, w.logits, rtol=1e-5, atol=1e-5)
            for layer in capture:
                torch.testing.assert_close(g.hidden[layer], w.hidden[layer], rtol=1e-5, atol=1e-5)
        for a, b in zip(alone.cache.k + alone.cache.v, together.cache.k + together.cache.v):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_rectangle_may_ask_for_no_logits(tiny_model_dir):
    model = load_model(tiny_model_dir("qwen2"), progress=False).model
    tables = SlotTables(model, 4, 32)
    tokens = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(4))
    verify = torch.randint(0, 256, (2, 2), generator=torch.Generator().manual_seed(5))
    kv_only, rows = forward_groups(model, tables.cache, [_rect(tables, tokens, [0], [0], [[]]),
                                                         _rect(tables, verify, [1, 2], [0, 0])])
    assert kv_only.logits.shape[:2] == (1, 0) and rows.logits.shape[:2] == (2, 2)
