"""Temperature > 0: the accept rule keeps the target's distribution, and seeds repeat."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tandem.sampling.filters import filtered_probs
from tandem.sampling.noise import uniform, uniform_rows
from tandem.sampling.rank_rule import pick_rows
from tandem.shard.commands import SamplingSpec
from tandem.verify.accept import accepted_sampled

VOCAB = 6


def _first_token_distribution(p_logits, q_probs, draws, one_hot_draft=None):
    """Run the full rule (rank picks + scheduler walk) for one draft position `draws`
    times with different seeds; return the frequency of the first emitted token. The
    draws go through one pick_rows call, one sequence each (sequences are independent)."""
    if one_hot_draft is None:
        drafts = [int(torch.multinomial(q_probs, 1, generator=torch.Generator().manual_seed(10_000 + seed)))
                  for seed in range(draws)]
        qs = [q_probs[None]] * draws
    else:
        drafts, qs = [one_hot_draft] * draws, [None] * draws
    logits = torch.stack([p_logits, p_logits])[None].repeat(draws, 1, 1)  # row 0 decides, row 1 is the bonus
    rows = torch.tensor([[0, d] for d in drafts])
    specs = [SamplingSpec(temperature=1.0, seed=seed) for seed in range(draws)]
    picks, accept = pick_rows(logits, rows, [5] * draws, specs, qs)
    counts = np.zeros(VOCAB)
    for seed, d in enumerate(drafts):
        mine = slice(2 * seed, 2 * seed + 2)
        a = accepted_sampled([d], picks[mine], accept[mine], seed=seed, start_pos=5)
        counts[d if a == 1 else picks[2 * seed]] += 1
    return counts / draws


@pytest.mark.parametrize("case", ["draft_distribution", "one_hot_draft"])
def test_speculative_sampling_keeps_the_target_distribution(case):
    torch.manual_seed(0)
    p_logits = torch.randn(VOCAB) * 1.5
    p = torch.softmax(p_logits, -1).numpy()
    q = torch.softmax(torch.randn(VOCAB) * 1.5, -1)
    draws = 6000
    if case == "draft_distribution":
        freq = _first_token_distribution(p_logits, q, draws)
    else:
        freq = _first_token_distribution(p_logits, None, draws, one_hot_draft=int(np.argmin(p)))
    # chi-square against p; 5 degrees of freedom, critical value at p=0.001 is 20.5
    chi2 = draws * float(((freq - p) ** 2 / p).sum())
    assert chi2 < 20.5, (freq, p)


def test_a_wrong_rule_is_caught_by_the_same_check():
    """The check above has teeth: always accepting the draft gives q, not p."""
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(VOCAB) * 1.5, -1).numpy()
    q = torch.softmax(torch.randn(VOCAB) * 1.5, -1)
    draws = 6000
    gen = torch.Generator().manual_seed(1)
    freq = np.bincount(torch.multinomial(q, draws, replacement=True, generator=gen).numpy(), minlength=VOCAB) / draws
    assert draws * float(((freq - p) ** 2 / p).sum()) > 20.5


def test_top_k_and_top_p_filter_the_distribution():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])
    pk = filtered_probs(logits, 1.0, 1.0, 2)
    assert (pk[0, 2:] == 0).all() and abs(float(pk.sum()) - 1) < 1e-6
    pp = filtered_probs(logits, 1.0, 0.5, 0)
    assert pp[0, 0] == 1.0  # the top token alone already holds more than half the mass


def test_keyed_noise_repeats_and_differs_by_key():
    a = uniform_rows([1, 2], 50, "cpu")
    b = uniform_rows([1, 2], 50, "cpu")
    assert torch.equal(a, b)
    assert not torch.equal(a[0], a[1])
    assert 0 < float(a.min()) and float(a.max()) < 1
    assert uniform(3, 4, 1) == uniform(3, 4, 1) != uniform(3, 5, 1)
