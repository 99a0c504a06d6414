"""DraftModelDrafter's lazy KV: prefill feeds nothing, a propose catches up what the
drafter has not seen, and the drafts equal those of a drafter that saw everything at once.
A long catch-up never asks the model for more than one row of logits a sequence."""
from __future__ import annotations

import torch

from paged_slots import SlotTables
from tandem.drafters.draft_model import DraftModelDrafter
from tandem.model.loader import load_model
from tandem.shard.commands import SamplingSpec

GREEDY = SamplingSpec()


class Recording(torch.nn.Module):
    """The model, recording each forward's token shape and returned logits shape."""

    def __init__(self, model):
        super().__init__()
        self.inner = model
        self.calls: list[tuple[tuple, tuple]] = []

    def forward(self, tokens, *args, **kw):
        out = self.inner(tokens, *args, **kw)
        self.calls.append((tuple(tokens.shape), tuple(out.logits.shape)))
        return out


def _drafter(tiny_model_dir, slots=4, max_seq_len=256):  # the tiny models know 256 positions
    """A drafter whose extra last slot already runs a sequence, so prefills are lazy."""
    model = load_model(tiny_model_dir("qwen2"), progress=False).model
    rec = Recording(model)
    cache = model.new_cache(num_blocks=(slots + 1) * max_seq_len // 16, block_size=16)
    drafter = DraftModelDrafter(rec, cache, target_vocab=256, max_model_len=max_seq_len)
    drafter.prefill(slots, [1, 2, 3])  # alone: fed at once
    rec.calls.clear()  # its warm-up forward and that prefill
    drafter.catch_up_budget = 10_000  # every sequence catches up at once (one test below caps it)
    return drafter, rec


def _reference(model, tokens: list[int], g: int) -> list[int]:
    """Greedy drafts from one forward over every token, then single-row steps."""
    cache = SlotTables(model, 1, 256)
    logits = cache(model, torch.tensor([tokens]), [0], [0]).logits[0, -1]
    out = []
    for i in range(g):
        out.append(int(logits.argmax()))
        logits = cache(model, torch.tensor([[out[-1]]]), [0], [len(tokens) + i]).logits[0, -1]
    return out


def _history(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_a_long_prompt_catches_up_in_chunks_without_full_vocab_logits(tiny_model_dir):
    drafter, rec = _drafter(tiny_model_dir)
    drafter.chunk = 64
    hist = _history(200, 0)
    drafter.prefill(1, hist[:-1])
    assert drafter.lengths.get(1, 0) == 0 and rec.calls == []  # prefill feeds nothing
    drafts, _ = drafter.propose([1], [hist[:-1]], [hist[-1]], [3], [GREEDY])
    assert drafts == [_reference(rec.inner, hist, 3)]
    assert all(tokens[1] <= 64 for tokens, _ in rec.calls)  # chunks of at most `chunk` rows
    assert all(logits[1] <= 1 for _, logits in rec.calls)  # never [rows, vocab] for every row
    assert sum(tokens[0] * tokens[1] for tokens, _ in rec.calls) == 200 + 2  # the prompt, then 2 steps


def test_mixed_catch_ups_in_one_batch_equal_a_drafter_that_saw_everything(tiny_model_dir):
    drafter, rec = _drafter(tiny_model_dir)
    drafter.chunk = 32
    hists = {0: _history(90, 1), 1: _history(7, 2), 2: _history(40, 3), 3: _history(150, 4)}
    for slot, h in hists.items():
        drafter.prefill(slot, h)
    # slot 2 drafted before and had 3 of 4 drafts accepted; slot 3 drafted long ago
    drafter.propose([2, 3], [hists[2], hists[3][:100]], [5, 6], [4, 2], [GREEDY] * 2)
    drafter.commit(2, len(hists[2]), 4, None)
    drafter.commit(3, 100, 1, None)
    hists[2] = hists[2] + [5] + _reference(rec.inner, hists[2] + [5], 3)
    hists[3] = hists[3][:100] + [6] + hists[3][101:]
    slots = [0, 1, 2, 3]
    last = [11, 12, 13, 14]
    drafts, q = drafter.propose(slots, [hists[s] for s in slots], last, [3, 1, 2, 3], [GREEDY] * 4)
    for s, lt, d, g in zip(slots, last, drafts, [3, 1, 2, 3]):
        assert d == _reference(rec.inner, hists[s] + [lt], g), f"slot {s}"
    assert q == [None] * 4
    assert all(logits[1] <= 1 for _, logits in rec.calls)


def test_padding_never_runs_past_the_context(tiny_model_dir):
    drafter, rec = _drafter(tiny_model_dir, max_seq_len=128)
    drafter.chunk = 64
    near_end, short = _history(120, 5), _history(70, 6)
    drafter.prefill(0, near_end)
    drafter.prefill(1, short)
    drafts, _ = drafter.propose([0, 1], [near_end, short], [1, 2], [2, 2], [GREEDY] * 2)
    assert drafts == [_reference(rec.inner, near_end + [1], 2), _reference(rec.inner, short + [2], 2)]


def test_a_wave_over_the_budget_catches_up_a_budget_a_propose_and_drafts_once_it_fits(tiny_model_dir):
    drafter, rec = _drafter(tiny_model_dir)
    drafter.catch_up_budget = 100
    hists = [_history(90, 7), _history(60, 8), _history(120, 9), _history(30, 10)]
    for slot, h in enumerate(hists):
        drafter.prefill(slot, h)
    slots, last, g, greedy = [0, 1, 2, 3], [1, 2, 3, 4], [2] * 4, [GREEDY] * 4
    drafts, _ = drafter.propose(slots, hists, last, g, greedy)
    # 300 rows > 100: no drafts; the 30, the 60 and 10 rows of the 90 fill the budget, KV only
    assert drafts == [[]] * 4
    assert [drafter.lengths.get(s, 0) for s in range(4)] == [10, 60, 0, 30]
    assert sum(t[0] * t[1] for t, _ in rec.calls) <= 2 * 100 and all(lg[1] == 0 for _, lg in rec.calls)
    # next: still no drafts (not even for the two in step); the rest of the 90 and 20 rows
    # of the 120 fill the budget
    drafts, _ = drafter.propose(slots, hists, last, g, greedy)
    assert drafts == [[]] * 4
    assert [drafter.lengths.get(s, 0) for s in range(4)] == [90, 60, 20, 30]
    # what is left (99 rows of the 120) fits: every sequence drafts, as if it had seen it all
    drafts, _ = drafter.propose(slots, hists, last, g, greedy)
    assert drafts == [_reference(rec.inner, h + [t], 2) for h, t in zip(hists, last)]


def test_a_sequence_prefilled_alone_is_fed_at_once_and_one_beside_others_lazily(tiny_model_dir):
    drafter, rec = _drafter(tiny_model_dir)
    drafter.release([4])  # the running one ends
    hist = _history(100, 12)
    drafter.prefill(0, hist)  # alone: fed now, KV only
    assert drafter.lengths[0] == 100 and all(lg[1] == 0 for _, lg in rec.calls)
    drafter.prefill(1, hist)  # beside slot 0: lazy
    assert drafter.lengths.get(1, 0) == 0
    drafts, _ = drafter.propose([0, 1], [hist, hist], [7, 7], [2, 2], [GREEDY] * 2)
    assert drafts == [_reference(rec.inner, hist + [7], 2)] * 2


def test_a_sequence_alone_catches_up_whatever_its_length(tiny_model_dir):
    drafter, rec = _drafter(tiny_model_dir)
    drafter.catch_up_budget = 10
    hist = _history(200, 11)
    drafter.prefill(0, hist)
    drafts, _ = drafter.propose([0], [hist], [7], [3], [GREEDY])
    assert drafts == [_reference(rec.inner, hist + [7], 3)]
