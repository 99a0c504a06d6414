"""Temperature > 0 with penalties and a logit bias: the accept rule keeps the processed
target distribution, for the drafted token and for the one after it, which is penalised
for the first (whether that came from an accepted draft or from a pick)."""
from __future__ import annotations

import numpy as np
import torch

from tandem.sampling.rank_rule import pick_rows
from tandem.shard.commands import LogitRules, SamplingSpec
from tandem.verify.accept import accepted_sampled

VOCAB = 4
# the history before the verify, and its row 0: token 0 is in the prompt, 1 twice in the output
PROMPT, OUTPUT, LAST = [0], [1], 1
RULES = LogitRules(prompt_len=len(PROMPT), presence_penalty=0.5, frequency_penalty=0.8, repetition_penalty=1.5,
                   logit_bias=((3, 1.0),))


def processed(base: torch.Tensor, context: list[int]) -> np.ndarray:
    """softmax of the rules applied by hand, one token at a time (vLLM's definitions)."""
    out = context[len(PROMPT):]
    x = base.tolist()
    for t in range(VOCAB):
        x[t] += dict(RULES.logit_bias).get(t, 0.0)
        if t in context:
            x[t] = x[t] / RULES.repetition_penalty if x[t] > 0 else x[t] * RULES.repetition_penalty
        x[t] -= RULES.frequency_penalty * out.count(t) + RULES.presence_penalty * (t in out)
    return torch.softmax(torch.tensor(x), -1).numpy()


def test_the_first_two_tokens_keep_the_processed_target_distribution():
    base = torch.tensor([1.0, 1.5, 0.2, -0.5])
    q = torch.tensor([0.1, 0.4, 0.3, 0.2])
    history = PROMPT + OUTPUT
    draws, counts = 2500, np.zeros((VOCAB, VOCAB))
    # every draw is one sequence of a single pick_rows call (sequences are independent)
    specs = [SamplingSpec(temperature=1.0, seed=seed, rules=RULES) for seed in range(draws)]
    drafts = [torch.multinomial(q, 2, replacement=True, generator=torch.Generator().manual_seed(10_000 + seed)).tolist()
              for seed in range(draws)]
    logits = base.expand(draws, 3, VOCAB)  # rows: last token, two drafts
    picks, accept = pick_rows(logits, torch.tensor([[LAST, *d] for d in drafts]), [5] * draws, specs,
                              [q.expand(2, VOCAB)] * draws, [history] * draws)
    emitted = []
    for seed, d in enumerate(drafts):
        mine = slice(3 * seed, 3 * seed + 3)
        a = accepted_sampled(d, picks[mine], accept[mine], seed=seed, start_pos=5)
        emitted.append([*d[:a], picks[3 * seed + a]])
    # one token out: the next verify decides the second token, after the first
    short = [i for i, e in enumerate(emitted) if len(e) == 1]
    more, _ = pick_rows(base.expand(len(short), 1, VOCAB), torch.tensor([emitted[i] for i in short]), [6] * len(short),
                        [specs[i] for i in short], [None] * len(short), [history + [LAST]] * len(short))
    for i, token in zip(short, more):
        emitted[i].append(token)
    for e in emitted:
        counts[e[0], e[1]] += 1
    context = history + [LAST]
    p0 = processed(base, context)
    want = np.stack([p0[t] * processed(base, context + [t]) for t in range(VOCAB)])  # [first, second]
    # chi-square over the 16 pairs: 15 degrees of freedom, critical value at p=0.001 is 37.7
    chi2 = draws * float(((counts / draws - want) ** 2 / want).sum())
    assert chi2 < 37.7, (counts / draws, want)
    # and the check has teeth: the distribution without the rules is far from it
    plain = np.outer(*[torch.softmax(base, -1).numpy()] * 2)
    assert draws * float(((counts / draws - plain) ** 2 / plain).sum()) > 10 * 37.7
