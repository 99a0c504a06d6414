"""Drafting under a grammar, rank-side: the rank's matchers follow each slot's committed
tokens and walk its drafts; a masked q keeps the masked accept rule exact."""
from __future__ import annotations

import numpy as np
import torch

from tandem.grammar.draft_matchers import DraftMatchers, mask_draft_logits
from tandem.sampling.filters import filtered_probs
from tandem.sampling.rank_rule import pick_rows
from tandem.shard.commands import DraftGrammar, SamplingSpec
from tandem.verify.accept import accepted_sampled

V = 8
ALLOWED = [1, 2, 5, 6]


class _FixedRow:
    """A walk whose grammar allows ALLOWED at every step."""

    def row(self):
        return np.array([sum(1 << t for t in ALLOWED)], dtype=np.int32)


def test_a_masked_q_keeps_the_masked_target_distribution_and_accepts_more():
    torch.manual_seed(0)
    logits = torch.randn(1, 2, V)
    draft_logits = torch.randn(1, V)
    q_masked = filtered_probs(mask_draft_logits(draft_logits, [_FixedRow()]), 1.0, 1.0, 0, 0.0)[0]
    q_blind = torch.softmax(draft_logits[0], dim=-1)
    assert q_masked[[t for t in range(V) if t not in ALLOWED]].sum() == 0
    assert torch.allclose(q_masked[ALLOWED], q_blind[ALLOWED] / q_blind[ALLOWED].sum())
    p = torch.softmax(logits[0, 0], dim=-1)
    want = torch.zeros(V)
    want[ALLOWED] = p[ALLOWED] / p[ALLOWED].sum()
    mask = np.array([sum(1 << t for t in ALLOWED), -1], dtype="<i4").tobytes()
    trials = 800
    accepted_share = {}
    for name, q in (("masked", q_masked), ("blind", q_blind)):
        drafts = np.random.default_rng(1).choice(V, size=trials, p=q.double().numpy() / q.double().sum().item())
        specs = [SamplingSpec(temperature=1.0, seed=seed) for seed in range(trials)]
        rows = torch.tensor([[0, int(d)] for d in drafts])
        picks, accept = pick_rows(logits.expand(trials, 2, V), rows, [10] * trials, specs, [q[None, :]] * trials,
                                  grammar_masks=[mask] * trials)
        counts, passed = np.zeros(V), 0
        for i, d in enumerate(drafts):
            n = accepted_sampled([int(d)], picks[2 * i : 2 * i + 2], accept[2 * i : 2 * i + 2], i, 10)
            passed += n
            counts[int(d) if n == 1 else picks[2 * i]] += 1
        freq = counts / trials
        assert freq[[t for t in range(V) if t not in ALLOWED]].sum() == 0, f"{name}: a refused token was emitted"
        # 800 draws: a frequency's standard error is at most 0.0177; 0.07 is four of them
        assert np.abs(freq - want.numpy()).max() < 0.07, (name, freq, want)
        accepted_share[name] = passed / trials
    # acceptance is sum(min(p, q)): q's mass on refused tokens (never accepted) moves onto allowed ones
    assert accepted_share["masked"] > accepted_share["blind"], accepted_share


def _digits_only(default_model, row: np.ndarray) -> bool:
    allowed = [t for t in range(default_model.config.vocab_size) if (int(row[t >> 5]) >> (t & 31)) & 1]
    return bool(allowed) and all(default_model.tokenizer.decode([t]).isdigit() for t in allowed)


def test_the_rank_matchers_follow_committed_tokens_and_walk_drafts_back(default_model):
    tok = default_model.tokenizer
    m = DraftMatchers(tok, default_model.config.vocab_size, default_model.eos_token_ids)
    g = DraftGrammar("regex", "[0-9]{6}", start=3)
    prompt = [tok.encode("ab")[0]] * 3
    digits = [t for t in range(default_model.config.vocab_size) if tok.decode([t]) in ("1", "2", "3")]
    one, two = digits[0], digits[1]
    (walk,) = m.walks([0], [prompt], [one], [g])  # the output so far: "1"
    assert _digits_only(default_model, walk.row())
    walk.take(two)
    walk.take(tok.encode("x")[0])  # refused: the walk stops there
    assert not walk.alive and walk.limit == 1
    walk.finish()
    # committed: "1", "2"; last "2" -> the slot's matcher takes only the new tokens
    (walk,) = m.walks([0], [prompt + [one]], [two], [g])
    assert m._slots[0].consumed == [one, two]
    for _ in range(4):
        walk.take(one)
    assert walk.limit == 4, "a complete grammar (six digits) limits the drafts"
    walk.finish()
    # the slot reused by another sequence: its matcher is built anew
    (walk,) = m.walks([0], [prompt], [tok.encode("x")[0]], [g])
    assert walk is None and 0 not in m._slots, "an output the grammar refuses gives no walk"
    assert m.walks([0, 1], [prompt, prompt], [one, one], [None, g])[0] is None
