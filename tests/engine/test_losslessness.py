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
    """Target-only greedy outputs, all 16 requests in one batch: a row's output does not
    depend on the rows beside it (test_model_forward's bitwise test), so this is each
    request's greedy output alone."""
    engine = make_engine("none")
    texts = prompts(16)
    return {t: o.token_ids for t, o in zip(texts, engine.generate(texts, SamplingParams(max_tokens=MAX_TOKENS)))}


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


@pytest.mark.parametrize("batch", [4, 16])
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


@pytest.mark.parametrize("batch,budget", [(2, 256), (12, 40)])
def test_draft_model_turned_on_late_catches_up_and_keeps_greedy_output(batch, budget, make_engine, weak_draft_group,
                                                                       truncated_draft_dir, reference):
    """The drafter's KV is filled lazily: a sequence that starts drafting only after some
    tokens (here: half of them, 6 tokens in) catches up its prompt and those tokens first;
    with a small catch-up budget, a few rows a propose (no drafts until all are in step)."""
    engine = make_engine("draft-model", group=weak_draft_group, draft_model=truncated_draft_dir, adaptive=False)
    drafter = weak_draft_group.shard.drafter
    texts = prompts(batch)
    params = SamplingParams(max_tokens=MAX_TOKENS)
    ids = [engine.add_request(t, params) for t in texts]
    for rid in ids[::2]:
        engine.requests[rid].spec.off_until = 6
    final, kept = {}, drafter.catch_up_budget
    drafter.catch_up_budget = budget
    try:
        while len(final) < len(ids):
            final.update((o.request_id, o) for o in engine.step() if o.finished)
    finally:
        drafter.catch_up_budget = kept
    outs = [final[i] for i in ids]
    assert [o.token_ids for o in outs] == [reference[t] for t in texts]
    assert all(o.num_draft_tokens > 0 for o in outs[::2]), "a late sequence never drafted"


def test_a_draft_model_that_copies_first_keeps_greedy_output(make_engine, weak_draft_group, truncated_draft_dir,
                                                              reference):
    """copy_min_ngram with a draft model: rounds the lookup drafts leave gaps in the draft
    model's KV, which it catches up before its next drafts."""
    engine = make_engine("draft-model", group=weak_draft_group, draft_model=truncated_draft_dir, adaptive=False,
                         copy_min_ngram=2)
    check_lossless(engine, 4, reference, "draft-model(copy first)")
    assert engine.metrics.copied_drafts._value.get() > 0, "the lookup never drafted: the prompts repeat their paragraphs"
