"""n choices of a request (tandem.choices): seeded apart, admitted together, and the same
as each choice run alone with its seed, with speculation on; the engine's tokenize."""
from __future__ import annotations

import pytest

from tandem.choices import MAX_CHOICES, choice_requests, choice_seed
from tandem.errors import InvalidRequestError
from tandem.sampling_params import SamplingParams


def test_choices_are_named_and_seeded_prompt_major():
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=(1 << 63) - 2)
    reqs = choice_requests(["a", "b"], params, 3, "r")
    assert [r.request_id for r in reqs] == [f"r-{k}" for k in range(6)]
    assert [r.prompt for r in reqs] == ["a"] * 3 + ["b"] * 3
    # seed + j, wrapped into int64; each prompt's choices from the request's seed
    assert [r.params.seed for r in reqs[:3]] == [(1 << 63) - 2, (1 << 63) - 1, -(1 << 63)]
    assert [r.params.seed for r in reqs[3:]] == [r.params.seed for r in reqs[:3]]
    assert choice_seed(-1, 1) == 0
    unseeded = choice_requests(["a"], SamplingParams(), 2, "u")
    assert all(r.params.seed is None for r in unseeded)  # each draws its own
    with pytest.raises(InvalidRequestError) as e:
        choice_requests(["a"] * 2, params, MAX_CHOICES, "r")
    assert e.value.field == "n"


def test_n_seeded_choices_are_admitted_together_and_equal_each_alone(make_engine):
    engine = make_engine("ngram", num_speculative_tokens=3)
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=99)
    requests = choice_requests(["Once upon a time"], params, 3, "story")
    engine.add_requests(requests)
    engine.step()
    assert sorted(s.request_id for s in engine.scheduler.running) == [r.request_id for r in requests]
    for r in requests:
        engine.abort(r.request_id)
    while engine.has_unfinished():
        engine.step()
    together = engine.generate("Once upon a time", params, n=3)
    alone = engine.generate(["Once upon a time"] * 3,
                            [SamplingParams(max_tokens=4, temperature=1.0, seed=99 + j) for j in range(3)])
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert len({tuple(o.token_ids) for o in together}) == 3


def test_tokenize_gives_the_ids_generation_runs_on_and_detokenize_checks_them(make_engine):
    engine = make_engine()
    ids = engine.tokenize("The capital of France is")
    (out,) = engine.generate("The capital of France is", SamplingParams(max_tokens=1))
    assert out.prompt_token_ids == ids and engine.detokenize(ids) == "The capital of France is"
    chat = engine.tokenize(messages=[{"role": "user", "content": "Hi"}])
    assert engine.detokenize(chat) == engine.chat_prompt([{"role": "user", "content": "Hi"}])
    with pytest.raises(InvalidRequestError) as e:
        engine.detokenize([10 ** 9])
    assert e.value.field == "tokens"
    with pytest.raises(InvalidRequestError) as e:
        engine.tokenize(messages=[{"role": "user", "content": "Hi"}], tools=[{"type": "function", "function": {"name": "f"}}])
    assert e.value.field == "tools"  # SmolLM2's template renders no tools


def test_n_choices_of_a_long_prompt_prefill_its_blocks_once(make_engine):
    engine = make_engine("ngram")
    prompt = "Choices share this prompt's KV blocks: " + " ".join(f"w{i}" for i in range(30))
    ids = engine.tokenize(prompt)
    bs = engine.scheduler.kv.block_size
    cached = (len(ids) - 1) // bs * bs
    assert cached >= 2 * bs
    hits, queries = engine.scheduler.kv.prefix_hits, engine.scheduler.kv.prefix_queries
    greedy = engine.generate(prompt, SamplingParams(max_tokens=3), n=4)
    assert engine.scheduler.kv.prefix_hits - hits == 3 * cached  # the first prefilled them, the others shared
    assert engine.scheduler.kv.prefix_queries - queries == 4 * len(ids)
    assert len({tuple(o.token_ids) for o in greedy}) == 1
    plain = make_engine("ngram", enable_prefix_caching=False)
    assert [o.token_ids for o in greedy] == [o.token_ids for o in plain.generate(prompt, SamplingParams(max_tokens=3), n=4)]
