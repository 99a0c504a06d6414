"""Greedy speculative output equals the target's own greedy output, token for token,
for every drafter and batch size, with requests joining mid-flight."""
from __future__ import annotations

import pytest

from tandem.sampling_params import SamplingParams

from .prompts import prompts

MAX_TOKENS = 24


def run_joining_midway(engine, texts, params):
    """Half the requests start, the engine ticks a few times, then the rest join."""
    half = max(1, len(texts) // 2)
    ids = [engine.add_request(t, params) for t in texts[:half]]
    final = {}
    for _ in range(3):
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    ids += [engine.add_request(t, params) for t in texts[half:]]
    while len(final) < len(ids):
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return [final[i] for i in ids]


@pytest.fixture(scope="module")
def reference(make_engine):
    """Target-only greedy outputs, one request at a time."""
    engine = make_engine("none")
    params = SamplingParams(max_tokens=MAX_TOKENS)
    return {t: engine.generate([t], params)[0].token_ids for t in prompts(16)}


def check_lossless(engine, batch, reference, label):
    texts = prompts(batch)
    outs = run_joining_midway(engine, texts, SamplingParams(max_tokens=MAX_TOKENS))
    for text, out in zip(texts, outs):
        assert out.finish_reason in ("stop", "length"), out.error
        assert out.token_ids == reference[text], f"{label} b{batch} diverged on {text[:40]!r}"
    assert sum(o.num_draft_tokens for o in outs) > 0, "no drafts were verified"
    return outs


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_ngram_greedy_output_equals_target_greedy(batch, make_engine, reference):
    outs = check_lossless(make_engine("ngram", adaptive=False), batch, reference, "ngram")
    assert sum(o.num_accepted_tokens for o in outs) > 0


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_draft_model_greedy_output_equals_target_greedy(batch, make_engine, self_draft_group, weak_draft_group, truncated_draft_dir, reference):
    # a draft that is always right (every draft accepted, the drafter's KV runs ahead) ...
    engine = make_engine("draft-model", group=self_draft_group, draft_model="smollm2", adaptive=False)
    outs = check_lossless(engine, batch, reference, "draft-model(self)")
    assert sum(o.num_accepted_tokens for o in outs) == sum(o.num_draft_tokens for o in outs)
    # ... and one that is mostly wrong (rejections, the drafter's KV trimmed back)
    engine = make_engine("draft-model", group=weak_draft_group, draft_model=truncated_draft_dir, adaptive=False)
    outs = check_lossless(engine, batch, reference, "draft-model(weak)")
    assert sum(o.num_accepted_tokens for o in outs) < sum(o.num_draft_tokens for o in outs)


def test_adaptive_speculation_keeps_greedy_output(make_engine, reference):
    engine = make_engine("ngram", adaptive=True)
    texts = prompts(8)
    outs = run_joining_midway(engine, texts, SamplingParams(max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outs] == [reference[t] for t in texts]
