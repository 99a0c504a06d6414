"""logprobs through the official openai client (real Ray, real HTTP, n-gram drafting): on
completions (with echo: the prompt's too) and chat, streamed and not; the values are the
target's, a log_softmax of the same (quantized) model's plain forward over prompt + output."""
from __future__ import annotations

import openai
import pytest
import torch

PROMPT = "1, 2, 3, 4, 5, 6,"  # repetitive: drafts are accepted
TOL = 1e-3  # the served rank's batch differs from the reference's single row


@pytest.fixture(scope="module")
def reference(default_model):
    """The served target's own log-probabilities: the default model as the app's rank builds
    it (quantized as `quantization: auto` resolves on the CPU), one forward over the text."""
    import copy

    from tandem.model import quant

    model = copy.deepcopy(default_model.model)
    quant.quantize(model, quant.resolve("auto", torch.device("cpu"), "auto", default_model.source_quantized),
                   default_model.tokenizer)
    tok = default_model.tokenizer

    def of(text: str) -> tuple[list[int], torch.Tensor]:
        ids = tok(text).input_ids
        blocks = len(ids) // 16 + 1
        cache = model.new_cache(blocks + 1, 16)
        tables = torch.arange(1, blocks + 1, dtype=torch.int32)[None]
        logits = model.forward(torch.tensor([ids]), torch.zeros(1, dtype=torch.int32), cache, tables).logits[0]
        return ids, torch.log_softmax(logits.float(), dim=-1)

    return of


def test_completion_logprobs_with_echo_are_the_targets_and_the_stream_agrees(openai_client, server, reference):
    kw = dict(model=server.model, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3, echo=True)
    out = openai_client.completions.create(**kw).choices[0]
    lp = out.logprobs
    assert out.text.startswith(PROMPT)
    ids, ref = reference(out.text)
    n_prompt = len(reference(PROMPT)[0])
    assert len(lp.tokens) == len(ids) and "".join(lp.tokens) == out.text
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for p in range(1, len(ids)):
        assert abs(lp.token_logprobs[p] - ref[p - 1, ids[p]].item()) < TOL, p
        assert len(lp.top_logprobs[p]) in (3, 4) and lp.tokens[p] in lp.top_logprobs[p]
    for p in range(n_prompt, len(ids)):  # greedy output: each token is its row's most likely
        assert max(lp.top_logprobs[p].values()) == pytest.approx(lp.token_logprobs[p], abs=1e-6)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(ids))]

    chunks = [c.choices[0] for c in openai_client.completions.create(stream=True, **kw) if c.choices]
    assert "".join(c.text for c in chunks) == out.text
    streamed = [t for c in chunks if c.logprobs for t in c.logprobs.tokens]
    assert streamed == lp.tokens
    assert [v for c in chunks if c.logprobs for v in c.logprobs.text_offset] == lp.text_offset


def test_chat_logprobs_and_top_logprobs_stream_and_not(openai_client, server):
    kw = dict(model=server.model, messages=[{"role": "user", "content": "Count: 1, 2, 3,"}], max_tokens=8,
              temperature=0, logprobs=True, top_logprobs=2)
    whole = openai_client.chat.completions.create(**kw)
    out = whole.choices[0]
    content = out.logprobs.content
    assert len(content) == whole.usage.completion_tokens > 0
    assert "".join(c.token for c in content) == out.message.content
    for c in content:
        assert len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob
        assert c.top_logprobs[0].token == c.token and c.logprob <= 0
        assert bytes(c.bytes).decode("utf-8", "replace") == c.token
    chunks = [c.choices[0] for c in openai_client.chat.completions.create(stream=True, **kw) if c.choices]
    streamed = [t for c in chunks if c.logprobs for t in c.logprobs.content]
    assert [(t.token, t.top_logprobs[0].token) for t in streamed] == [(t.token, t.top_logprobs[0].token) for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=TOL)
    plain = openai_client.chat.completions.create(**dict(kw, logprobs=False, top_logprobs=None)).choices[0]
    assert plain.logprobs is None and plain.message.content == out.message.content


@pytest.mark.parametrize("path, body, field", [
    ("/v1/completions", {"prompt": PROMPT, "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": PROMPT, "logprobs": -1}, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
])
def test_logprobs_out_of_range_are_a_400_naming_the_field(server, path, body, field):
    import httpx

    r = httpx.post(server.base_url + path, json={"model": server.model, "max_tokens": 2, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


def test_best_of_returns_the_choice_of_highest_cumulative_logprob(openai_client, server):
    kw = dict(model=server.model, prompt="Once upon a time", max_tokens=6, temperature=1.0, seed=5)
    every = openai_client.completions.create(n=3, logprobs=0, **kw)  # the same three choices (seeds 5, 6, 7)
    scores = [sum(c.logprobs.token_logprobs) for c in every.choices]
    best = openai_client.completions.create(n=1, best_of=3, **kw)
    (choice,) = best.choices
    assert choice.text == every.choices[scores.index(max(scores))].text
    assert choice.logprobs is None  # ranked by logprobs the client did not ask for
    assert best.usage.completion_tokens == every.usage.completion_tokens
    two = openai_client.completions.create(n=2, best_of=3, logprobs=1, **kw)
    assert [c.index for c in two.choices] == [0, 1]
    assert [sum(c.logprobs.token_logprobs) for c in two.choices] == pytest.approx(sorted(scores, reverse=True)[:2], abs=TOL)


def test_echo_of_token_ids_starts_with_their_text_streamed_and_not(openai_client, server, default_model):
    ids = default_model.tokenizer("The capital of France is").input_ids
    kw = dict(model=server.model, prompt=ids, max_tokens=3, temperature=0, echo=True)
    text = openai_client.completions.create(**kw).choices[0].text
    assert text.startswith("The capital of France is") and len(text) > len("The capital of France is")
    assert "".join(c.choices[0].text for c in openai_client.completions.create(stream=True, **kw) if c.choices) == text
