"""Logprobs are the target's own: each output token's (from an accepted draft or a bonus
pick) and each prompt token's equal a log_softmax of a plain transformers forward over
prompt + output, with and without a drafter, streamed or not, a prompt prefilled in chunks
or found in the prefix cache."""
from __future__ import annotations

import math

import pytest
import torch

from tandem.sampling_params import SamplingParams

from .prompts import PROMPTS

TOL = 1e-4
TEXTS = [PROMPTS[0], PROMPTS[6]]  # repetitive: the n-gram drafter's drafts are accepted


@pytest.fixture(scope="module")
def hf_logprobs(default_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(default_model.path, dtype=torch.float32).eval()

    def of(ids: list[int]) -> torch.Tensor:  # [len, V]: row p scores token p + 1
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)

    return of


def check_output(out, hf_logprobs, top_n: int, greedy: bool = True) -> None:
    ids = out.prompt_token_ids + out.token_ids
    ref = hf_logprobs(ids)
    assert len(out.logprobs) == len(out.token_ids) > 0
    p = len(out.prompt_token_ids)
    for j, (tok, lp) in enumerate(zip(out.token_ids, out.logprobs)):
        row = ref[p + j - 1]
        assert lp.token_id == tok
        assert abs(lp.logprob - row[tok].item()) < TOL, f"token {j}: {lp.logprob} vs {row[tok].item()}"
        assert len(lp.top) == top_n
        values = [v for _, _, v in lp.top]
        assert values == sorted(values, reverse=True)
        want = row.topk(top_n)
        assert [abs(a - b) < TOL for a, b in zip(values, want.values.tolist())] == [True] * top_n
        if greedy and top_n:
            assert lp.top[0][0] == tok, f"token {j}: greedy pick {tok} is not the top {lp.top[0][0]}"
            assert lp.top[0][2] == pytest.approx(lp.logprob, abs=1e-6)


def check_prompt(out, hf_logprobs, top_n: int) -> None:
    ref = hf_logprobs(out.prompt_token_ids)
    assert out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == len(out.prompt_token_ids)
    for p in range(1, len(out.prompt_token_ids)):
        lp, tok = out.prompt_logprobs[p], out.prompt_token_ids[p]
        assert lp.token_id == tok and abs(lp.logprob - ref[p - 1, tok].item()) < TOL, f"prompt token {p}"
        assert [t for t, _, _ in lp.top] == ref[p - 1].topk(top_n).indices.tolist() or top_n == 0


@pytest.mark.parametrize("drafter", ["none", "ngram", "draft-model"])
def test_greedy_logprobs_equal_a_plain_forward_and_the_stream_agrees(drafter, make_engine, hf_logprobs, request):
    if drafter == "draft-model":  # the target drafting for itself: every draft accepted
        engine = make_engine(drafter, group=request.getfixturevalue("self_draft_group"), adaptive=False,
                             draft_model="smollm2")
    else:
        engine = make_engine(drafter, adaptive=False)
    params = SamplingParams(max_tokens=12, logprobs=3, prompt_logprobs=2)
    outs = engine.generate(TEXTS, params)
    for out in outs:
        check_output(out, hf_logprobs, 3)
        check_prompt(out, hf_logprobs, 2)
    assert [o.token_ids for o in outs] == [o.token_ids for o in engine.generate(TEXTS, SamplingParams(max_tokens=12))]
    if drafter != "none":
        assert sum(o.num_accepted_tokens for o in outs) > 0, "no draft was accepted: the draft path is untested"
    streamed, prompt_lps = [], None
    for out in engine.stream(TEXTS[0], params):
        prompt_lps = prompt_lps or out.prompt_logprobs
        streamed += out.delta_logprobs
    # alone in its batch, not beside another: the same tokens, their logprobs to rounding
    def flat(lps):
        return [x.token_id for x in lps] + [t for x in lps for t, _, _ in x.top], \
            [x.logprob for x in lps] + [v for x in lps for _, _, v in x.top]

    assert flat(streamed)[0] == flat(outs[0].logprobs)[0]
    assert flat(streamed)[1] == pytest.approx(flat(outs[0].logprobs)[1], abs=TOL)
    assert flat(prompt_lps[1:])[0] == flat(outs[0].prompt_logprobs[1:])[0]


def test_sampled_logprobs_are_the_targets_with_a_drafter_beside_requests_without(make_engine, hf_logprobs):
    engine = make_engine("ngram", adaptive=False)
    plain = SamplingParams(max_tokens=24, temperature=1.0, seed=3)
    out, other, greedy = engine.generate(TEXTS + [TEXTS[1]], [SamplingParams(max_tokens=24, temperature=1.0, seed=3,
                                                                             logprobs=0), plain,
                                                              SamplingParams(max_tokens=24)])
    check_output(out, hf_logprobs, 0, greedy=False)
    assert out.num_draft_tokens > 0
    assert other.logprobs is None and greedy.logprobs is None and other.finish_reason in ("stop", "length")


def test_a_prompt_prefilled_in_chunks_or_cached_is_scored_whole(make_engine, hf_logprobs):
    engine = make_engine("none", max_prefill_tokens=16)  # a 50-token prompt: chunks of one block
    text = PROMPTS[0]
    params = SamplingParams(max_tokens=4, logprobs=1, prompt_logprobs=1)
    first = engine.generate([text], params)[0]
    assert len(first.prompt_token_ids) > 32
    check_prompt(first, hf_logprobs, 1)
    again = engine.generate([text], params)[0]  # its blocks are cached: the prompt is prefilled again anyway
    check_prompt(again, hf_logprobs, 1)
    plain = engine.generate([text], SamplingParams(max_tokens=4))[0]
    assert plain.logprobs is None and plain.prompt_logprobs is None and plain.token_ids == first.token_ids
    assert engine.metrics.prefix_cache_hits._value.get() > 0  # the plain one did use the cache
    assert all(math.isfinite(x.logprob) for x in first.logprobs)


def test_logprobs_out_of_range_are_refused():
    from tandem.errors import InvalidRequestError

    for bad in (-1, 21, True, 2.0):
        with pytest.raises(InvalidRequestError, match="logprobs"):
            SamplingParams(logprobs=bad)
    with pytest.raises(InvalidRequestError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)
