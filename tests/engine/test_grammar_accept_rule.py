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
    trials, counts = 1200, np.zeros(V)
    gen = np.random.default_rng(1)
    for seed in range(trials):
        d = int(gen.choice(V, p=q_row.numpy() / q_row.numpy().sum()))
        spec = SamplingSpec(temperature=1.0, seed=seed)
        picks, accept = pick_rows(logits, torch.tensor([[0, d]]), [10], [spec], [q_row[None, :]], [mask_bytes()])
        n = accepted_sampled([d], picks, accept, seed, 10)
        counts[d if n == 1 else picks[0]] += 1
    freq = counts / trials
    assert freq[[t for t in range(V) if t not in ALLOWED]].sum() == 0, "a refused token was emitted"
    # 1200 draws: a frequency's standard error is at most 0.0145; 0.06 is four of them
    assert np.abs(freq - want.numpy()).max() < 0.06, (freq, want)
