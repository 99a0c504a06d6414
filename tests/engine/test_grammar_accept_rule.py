"""The masked accept rule keeps the masked target distribution: on a vocabulary of 8, the
first token a speculative round emits (the draft if accepted, else the residual pick)
is distributed as p restricted to the allowed tokens, renormalised, whatever q drafted."""
from __future__ import annotations

import numpy as np
import torch

from tandem.sampling.rank_rule import pick_rows
from tandem.shard.commands import SamplingSpec
from tandem.verify.accept import accepted_sampled

V = 8
ALLOWED = [1, 2, 5, 6]  # the grammar's tokens at row 0


def mask_bytes() -> bytes:
    word = sum(1 << t for t in ALLOWED)
    return np.array([word, -1], dtype="<i4").tobytes()  # row 0, then row 1 (the bonus) allows all


def test_masked_accept_rule_keeps_the_masked_target_distribution():
    torch.manual_seed(0)
    logits = torch.randn(1, 2, V)
    q_row = torch.softmax(torch.randn(V), dim=-1)  # a model drafter's q, blind to the grammar
    p = torch.softmax(logits[0, 0], dim=-1)
    want = torch.zeros(V)
    want[ALLOWED] = p[ALLOWED] / p[ALLOWED].sum()
    trials, counts = 800, np.zeros(V)
    drafts = np.random.default_rng(1).choice(V, size=trials, p=q_row.numpy() / q_row.numpy().sum())
    specs = [SamplingSpec(temperature=1.0, seed=seed) for seed in range(trials)]
    rows = torch.tensor([[0, int(d)] for d in drafts])
    # the trials as one batch of sequences, each its own seed
    picks, accept = pick_rows(logits.expand(trials, 2, V), rows, [10] * trials, specs, [q_row[None, :]] * trials,
                              grammar_masks=[mask_bytes()] * trials)
    for i, d in enumerate(drafts):
        n = accepted_sampled([int(d)], picks[2 * i : 2 * i + 2], accept[2 * i : 2 * i + 2], i, 10)
        counts[int(d) if n == 1 else picks[2 * i]] += 1
    freq = counts / trials
    assert freq[[t for t in range(V) if t not in ALLOWED]].sum() == 0, "a refused token was emitted"
    # 800 draws: a frequency's standard error is at most 0.0177; 0.07 is four of them
    assert np.abs(freq - want.numpy()).max() < 0.07, (freq, want)
