"""verify_logprobs: each sequence that asks gets its own rows' logprobs and exactly the
top N it asked for, equal to a log_softmax of the raw logits (to float32 rounding); the others get nothing."""
from __future__ import annotations

import pytest
import torch

from tandem.sampling.logprobs import last_logprobs, verify_logprobs
from tandem.shard.commands import NO_LOGPROBS, SamplingSpec


def test_each_sequence_gets_its_rows_and_its_own_top_n():
    torch.manual_seed(0)
    n, k, vocab = 3, 4, 50
    logits = torch.randn(n, k, vocab)
    rows = torch.randint(vocab, (n, k))
    picks = logits.argmax(-1).flatten().tolist()
    specs = [SamplingSpec(logprobs=3), SamplingSpec(), SamplingSpec(temperature=1.0, logprobs=0)]
    out = verify_logprobs(logits, rows, picks, specs)
    assert out[1] is NO_LOGPROBS
    lp = torch.log_softmax(logits, -1)
    for i, top_n in ((0, 3), (2, 0)):
        got = out[i]
        assert got.chosen == pytest.approx([lp[i, r, picks[i * k + r]].item() for r in range(k)], abs=1e-5)
        assert got.drafts == pytest.approx([lp[i, r, rows[i, r + 1]].item() for r in range(k - 1)], abs=1e-5)
        assert len(got.top_ids) == len(got.top_logprobs) == k * top_n
        for r in range(k):
            want = lp[i, r].topk(top_n) if top_n else None
            assert [t for t, _ in got.top(r)] == (want.indices.tolist() if top_n else [])
            assert [v for _, v in got.top(r)] == pytest.approx(want.values.tolist() if top_n else [], abs=1e-5)
    assert verify_logprobs(logits, rows, picks, [SamplingSpec()] * n) == []
    (one,) = last_logprobs(logits[:1, 0], [picks[0]], [SamplingSpec(logprobs=2)])
    assert one.chosen == pytest.approx([lp[0, 0, picks[0]].item()], abs=1e-5) and one.drafts == [] and len(one.top(0)) == 2
