"""Greedy output with DFlash drafts equals the target's own greedy output, token for token.

Any drafter weights must keep it exact: a randomly initialised drafter on a tiny random
target (most drafts rejected), and the trained drafter shipped for the default model on
the default model (most drafts accepted), at batch 1, 4 and 16, requests joining midway.
"""
from __future__ import annotations

import re

import pytest
import torch

from dflash_tiny import SLOTS, VOCAB, DigitsTokenizer, random_dflash, random_prompts, tiny_shard
from tandem.config import EngineConfig
from tandem.engine import Engine
from tandem.sampling_params import SamplingParams
from tandem.shard.local_group import LocalShardGroup

MAX_TOKENS = 24


def run_joining_midway(engine, prompts, params):
    """Half the requests start, the engine ticks a few times, then the rest join."""
    half = max(1, len(prompts) // 2)
    ids = [engine.add_request(p, params) for p in prompts[:half]]
    final = {}
    for _ in range(3):
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    ids += [engine.add_request(p, params) for p in prompts[half:]]
    while len(final) < len(ids):
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return [final[i] for i in ids]


def tiny_engine(shard, drafter: str, batch: int, **cfg) -> Engine:
    config = EngineConfig(drafter=drafter, max_num_seqs=batch, max_model_len=shard.limits.max_model_len,
                          row_budget=shard.rules.row_budget, **cfg)
    return Engine(LocalShardGroup(shard), DigitsTokenizer(), eos_token_ids=(), config=config)


@pytest.fixture(scope="module")
def tiny_reference(target):
    engine = tiny_engine(tiny_shard(target, None), "none", SLOTS)
    prompts = random_prompts(16, seed=21)
    outs = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))
    return prompts, [o.token_ids for o in outs]


@pytest.mark.parametrize("batch, adaptive", [(1, False), (4, False), (16, False), (4, True)])
def test_a_random_drafter_keeps_greedy_output_exact(batch, adaptive, target, tiny_reference):
    prompts, want = tiny_reference
    shard = tiny_shard(target, random_dflash(seed=batch))
    engine = tiny_engine(shard, "dflash", batch, num_speculative_tokens=5, adaptive=adaptive)
    outs = run_joining_midway(engine, prompts[:batch], SamplingParams(max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outs] == want[:batch]
    assert sum(o.num_draft_tokens for o in outs) > 0, "no drafts were verified"


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_the_padded_graph_shapes_keep_greedy_output_exact(batch, target, tiny_reference):
    prompts, want = tiny_reference
    shard = tiny_shard(target, random_dflash(seed=batch + 7), cuda_graphs=True, target_graphs=True)
    engine = tiny_engine(shard, "dflash", batch, num_speculative_tokens=5, adaptive=False)
    outs = run_joining_midway(engine, prompts[:batch], SamplingParams(max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outs] == want[:batch]
    assert sum(o.num_draft_tokens for o in outs) > 0, "no drafts were verified"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("batch", [1, 4, 16])
def test_on_a_gpu_cuda_graph_drafts_keep_greedy_output_exact(batch, target):
    import copy

    gpu_target = copy.deepcopy(target).to("cuda")
    prompts = random_prompts(16, seed=23)
    params = SamplingParams(max_tokens=MAX_TOKENS)
    want = [o.token_ids for o in tiny_engine(tiny_shard(gpu_target, None), "none", SLOTS).generate(prompts[:batch], params)]
    draft = copy.deepcopy(random_dflash(seed=batch)).to("cuda")
    shard = tiny_shard(gpu_target, draft, cuda_graphs=True, target_graphs=True)
    engine = tiny_engine(shard, "dflash", batch, num_speculative_tokens=5, adaptive=False)
    outs = run_joining_midway(engine, prompts[:batch], params)
    assert [o.token_ids for o in outs] == want
    assert sum(o.num_draft_tokens for o in outs) > 0
    assert any(g.graph is not None for g in shard.drafter.graphs.values()), "nothing was captured"
    assert any(g.graph is not None for g in shard.graphs.graphs.values()), "no verify forward was captured"


@pytest.mark.parametrize("batch", [1, 4])
def test_a_bf16_drafter_beside_a_float32_target_keeps_greedy_output_exact(batch, target, tiny_reference):
    # what the engine builds on a CPU with native bf16 matmuls (drafters.dflash.dflash_dtype)
    prompts, want = tiny_reference
    shard = tiny_shard(target, random_dflash(seed=batch + 3).to(torch.bfloat16))
    head = shard.drafter.head  # its rows, packed for oneDNN where it has it
    assert shard.drafter.dtype == torch.bfloat16 and getattr(head, "weight", head).dtype == torch.bfloat16
    engine = tiny_engine(shard, "dflash", batch, num_speculative_tokens=5, adaptive=False)
    outs = run_joining_midway(engine, prompts[:batch], SamplingParams(max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outs] == want[:batch]
    assert sum(o.num_draft_tokens for o in outs) > 0, "no drafts were verified"


def test_the_drafter_dtype_follows_the_target_unless_told(monkeypatch):
    from tandem.drafters.dflash import dflash_dtype
    from tandem.shard.spec import ShardSpec

    monkeypatch.delenv("TANDEM_DFLASH_DTYPE", raising=False)
    assert dflash_dtype("cuda", torch.bfloat16, ShardSpec().dflash_dtype) == torch.bfloat16
    assert dflash_dtype("cpu", torch.bfloat16, ShardSpec().dflash_dtype) == torch.bfloat16
    assert dflash_dtype("cpu", torch.float32, ShardSpec().dflash_dtype) in (torch.float32, torch.bfloat16)
    monkeypatch.setenv("TANDEM_DFLASH_DTYPE", "float32")
    assert dflash_dtype("cpu", torch.float32, ShardSpec().dflash_dtype) == torch.float32
    monkeypatch.setenv("TANDEM_DFLASH_DTYPE", "bfloat16")
    assert dflash_dtype("cuda", torch.float32, ShardSpec().dflash_dtype) == torch.bfloat16


def test_sampling_with_a_random_drafter_runs_and_is_seeded(target):
    shard = tiny_shard(target, random_dflash(seed=2))
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, top_k=20, seed=5)
    prompts = random_prompts(4, seed=22)
    first = tiny_engine(shard, "dflash", 4, num_speculative_tokens=5, adaptive=False).generate(prompts, params)
    again = tiny_engine(shard, "dflash", 4, num_speculative_tokens=5, adaptive=False).generate(prompts, params)
    assert all(len(o.token_ids) == MAX_TOKENS for o in first)
    assert [o.token_ids for o in first] == [o.token_ids for o in again]


# ---- the default model with the shipped, trained drafter ---------------------------------

CHATS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how rainbows form.",
    "List three tips for staying focused while studying.",
    "What is the capital of France?",
    "Write a Python function that returns the squares of a list of numbers.",
    "Describe a sunny afternoon in a park.",
    "Why do leaves change color in autumn?",
    "Give me a recipe for a simple salad.",
    "What are the benefits of drinking water?",
    "Write a haiku about the sea.",
    "Explain what a noun is.",
    "How do airplanes fly?",
    "Tell me a fun fact about octopuses.",
    "Write a thank-you note to a teacher.",
    "What is 12 times 11?",
    "Summarize the story of Cinderella in two sentences.",
]


@pytest.fixture(scope="module")
def default_group(default_model):
    from tandem.shard.factory import ShardSpec, build_model_shard

    spec = ShardSpec(num_slots=16, max_model_len=256, row_budget=128, device="cpu", dtype="float32", drafter="dflash")
    shard, _ = build_model_shard(spec, loaded=default_model, progress=False)
    return LocalShardGroup(shard)


@pytest.fixture(scope="module")
def default_reference(default_model, default_group):
    engine = Engine(default_group, default_model.tokenizer, default_model.eos_token_ids,
                    EngineConfig(drafter="none", max_num_seqs=16, max_model_len=256, row_budget=128))
    texts = [engine.chat_prompt([{"role": "user", "content": c}]) for c in CHATS]
    return texts, [o.token_ids for o in engine.generate(texts, SamplingParams(max_tokens=MAX_TOKENS))]


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 4, 16])
def test_the_trained_drafter_keeps_greedy_output_exact_and_is_accepted(batch, default_model, default_group, default_reference):
    texts, want = default_reference
    engine = Engine(default_group, default_model.tokenizer, default_model.eos_token_ids,
                    EngineConfig(drafter="dflash", max_num_seqs=batch, max_model_len=256, row_budget=128,
                                 num_speculative_tokens=7, adaptive=False))
    outs = run_joining_midway(engine, texts[:batch], SamplingParams(max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outs] == want[:batch]
    rounds = sum(o.num_drafts for o in outs)
    acceptance_length = 1 + sum(o.num_accepted_tokens for o in outs) / rounds
    print(f"batch {batch}: acceptance length {acceptance_length:.3f} over {rounds} rounds")
    assert acceptance_length > 1.3, f"the shipped drafter accepts little: {acceptance_length:.2f}"


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_sequences_that_do_not_draft_for_a_while_then_do_keep_greedy_output_exact(cuda_graphs, target):
    # Speculation off for 40 tokens: the drafter folds its pending commits into the context
    # on its own (every PENDING_MAX commits, from inside commit), then drafts from it.
    from tandem.drafters.dflash.drafter import PENDING_MAX

    max_tokens, quiet = 48, 40
    assert quiet > PENDING_MAX
    prompts = random_prompts(4, seed=41)
    params = SamplingParams(max_tokens=max_tokens)
    want = [o.token_ids for o in tiny_engine(tiny_shard(target, None), "none", SLOTS).generate(prompts, params)]
    shard = tiny_shard(target, random_dflash(seed=5), cuda_graphs=cuda_graphs, target_graphs=cuda_graphs)
    engine = tiny_engine(shard, "dflash", 4, num_speculative_tokens=5, adaptive=False)
    ids = [engine.add_request(p, params) for p in prompts]
    for rid in ids[::2]:
        engine.requests[rid].spec.off_until = quiet
    final = {}
    while len(final) < len(ids):
        final.update((o.request_id, o) for o in engine.step() if o.finished)
    outs = [final[i] for i in ids]
    assert [o.token_ids for o in outs] == want
    assert all(o.num_draft_tokens > 0 for o in outs), "a sequence never drafted"


def test_a_round_cut_short_by_max_tokens_keeps_the_block_shape(target, tiny_reference):
    # The last rounds of a request draft fewer than the block (no more can be emitted); their
    # forward is padded to the block's rows, so a GPU needs no extra CUDA graph for them.
    prompts, want = tiny_reference
    shard = tiny_shard(target, random_dflash(seed=3))
    engine = tiny_engine(shard, "dflash", 4, num_speculative_tokens=5, adaptive=False)
    widths = []
    verify = shard.verify
    shard.verify = lambda cmd: widths.append(cmd.k) or verify(cmd)
    outs = engine.generate(prompts[:4], SamplingParams(max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outs] == want[:4]
    short = sum(o.num_drafts * 5 - o.num_draft_tokens for o in outs)
    assert short > 0, "no round was cut short: the test checks nothing"
    assert set(widths) <= {1, 6}, widths  # decode rows (k=1: the prefill's first pick) or a whole block


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_dflash_constrained_greedy_equals_constrained_greedy_without_drafts(batch, target):
    """Under a grammar (even requests; the odd ones free), DFlash drafts cut at the first
    refused token keep the output exactly what the target picks under the mask alone."""
    from tandem.grammar.constraint import GrammarConstraint

    prompts = random_prompts(batch, seed=33)
    regex = "(1[0-9]|2[0-9]|7)+"  # over the tokens' decoded texts ("7", "12", "1" then "9", ...)
    grammar = GrammarConstraint("regex", regex)
    params = [SamplingParams(max_tokens=MAX_TOKENS, structured=grammar if i % 2 == 0 else None) for i in range(batch)]
    want = tiny_engine(tiny_shard(target, None), "none", SLOTS).generate(prompts, params)
    engine = tiny_engine(tiny_shard(target, random_dflash(seed=batch)), "dflash", batch, num_speculative_tokens=5, adaptive=False)
    outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    for o in outs[::2]:  # a cut output may end inside a two-digit piece ("1" or "2" pending)
        text = "".join(str(t) for t in o.token_ids if t != VOCAB - 1)  # VOCAB - 1 stands for EOS here
        assert re.fullmatch(regex if o.finish_reason == "stop" else f"({regex})?[12]?", text), text
    assert sum(o.num_draft_tokens for o in outs) > 0, "no drafts were verified"
