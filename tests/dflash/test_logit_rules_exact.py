"""Greedy with penalties, logit_bias and min_tokens: speculation equals no speculation,
token for token, for the n-gram, draft-model and DFlash drafters at batch 1 and 8; and
no speculation equals a plain decode that applies vLLM's definitions by hand.

The tiny random target runs on the CPU in milliseconds, so every drafter is cheap here.
"""
from __future__ import annotations

import pytest
import torch

from dflash_tiny import CONTEXT, ROW_BUDGET, SLOTS, TARGET, VOCAB, DigitsTokenizer, random_dflash, tiny_shard
from slot_blocks import BLOCK, pool_blocks
from tandem.config import EngineConfig
from tandem.drafters.draft_model import DraftModelDrafter
from tandem.engine import Engine
from tandem.model.kv_cache import PagedKVCache
from tandem.sampling_params import SamplingParams
from tandem.shard.local_group import LocalShardGroup
from tandem.shard.model_shard import ModelShard

STOP, BANNED, FAVOURED = 11, 7, 5
RULES = SamplingParams(max_tokens=20, presence_penalty=0.7, frequency_penalty=0.4, repetition_penalty=1.3,
                       logit_bias={FAVOURED: 2.5, BANNED: -100.0}, min_tokens=8, stop_token_ids=(STOP,))


def repetitive_prompts(count: int) -> list[list[int]]:
    """Prompts that repeat a short pattern, so the n-gram drafter finds matches."""
    g = torch.Generator().manual_seed(5)
    out = []
    for _ in range(count):
        pattern = torch.randint(0, VOCAB - 1, (int(torch.randint(3, 6, (1,), generator=g)),), generator=g).tolist()
        out.append(pattern * 4)
    return out


def engine_on(shard: ModelShard, drafter: str, batch: int) -> Engine:
    config = EngineConfig(drafter=drafter, max_num_seqs=batch, max_model_len=CONTEXT, row_budget=ROW_BUDGET,
                          num_speculative_tokens=4, adaptive=False,
                          draft_model="tiny" if drafter == "draft-model" else None)
    return Engine(LocalShardGroup(shard), DigitsTokenizer(), eos_token_ids=(), config=config)


def self_draft_shard(target) -> ModelShard:
    """The target drafting for itself: with the rules applied to q as to p, every draft passes."""
    cache = PagedKVCache(TARGET.num_layers, pool_blocks(SLOTS), BLOCK, TARGET.num_kv_heads, TARGET.head_dim,
                         torch.float32, "cpu", scratch_blocks=1)
    dcache = PagedKVCache(TARGET.num_layers, pool_blocks(SLOTS) + 2 * SLOTS, BLOCK, TARGET.num_kv_heads, TARGET.head_dim,
                          torch.float32, "cpu", scratch_blocks=1)
    drafter = DraftModelDrafter(target, dcache, target_vocab=VOCAB, max_model_len=CONTEXT)
    return ModelShard(target, cache, num_slots=SLOTS, max_model_len=CONTEXT, row_budget=ROW_BUDGET, vocab_size=VOCAB,
                      drafter=drafter)


def by_hand(target, prompt: list[int], params: SamplingParams) -> list[int]:
    """Greedy decode with a whole-context forward a token, the rules applied one token at a time."""
    cache = PagedKVCache(TARGET.num_layers, 8, BLOCK, TARGET.num_kv_heads, TARGET.head_dim, torch.float32, "cpu",
                         scratch_blocks=1)
    table = torch.arange(8, dtype=torch.int32)[None]
    bias = dict(params.logit_bias)
    out: list[int] = []
    while len(out) < params.max_tokens:
        ctx = prompt + out
        logits = target(torch.tensor([ctx]), torch.tensor([0]), cache, table).logits[0, -1].float().tolist()
        for t in range(VOCAB):
            x = logits[t]
            if len(out) < params.min_tokens and t in params.stop_token_ids:
                x = float("-inf")
            x += bias.get(t, 0.0)
            if t in ctx:
                x = x / params.repetition_penalty if x > 0 else x * params.repetition_penalty
            x -= params.frequency_penalty * out.count(t) + params.presence_penalty * (t in out)
            logits[t] = x
        tok = max(range(VOCAB), key=logits.__getitem__)
        out.append(tok)
        if tok in params.stop_token_ids:
            break
    return out


@pytest.fixture(scope="module")
def reference(target):
    prompts = repetitive_prompts(8)
    engine = engine_on(tiny_shard(target, None), "none", 8)
    return prompts, [o.token_ids for o in engine.generate(prompts, RULES)]


def test_the_rules_follow_vllms_definitions(target, reference):
    prompts, want = reference
    for prompt, got in list(zip(prompts, want))[:2]:
        assert got == by_hand(target, prompt, RULES)
    plain = engine_on(tiny_shard(target, None), "none", 8).generate(prompts, SamplingParams(max_tokens=20))
    assert [o.token_ids for o in plain] != want, "the rules changed nothing"
    assert all(BANNED not in w and STOP not in w[: RULES.min_tokens] for w in want)


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("drafter", ["ngram", "draft-model", "dflash"])
def test_greedy_speculation_with_rules_equals_no_speculation(drafter, batch, target, reference):
    prompts, want = reference
    shard = {"ngram": lambda: tiny_shard(target, None), "dflash": lambda: tiny_shard(target, random_dflash(seed=3)),
             "draft-model": lambda: self_draft_shard(target)}[drafter]()
    outs = engine_on(shard, drafter, batch).generate(prompts[:batch] if batch == 1 else prompts, RULES)
    assert [o.token_ids for o in outs] == want[: len(outs)]
    assert sum(o.num_draft_tokens for o in outs) > 0, "no drafts were verified"
    if drafter == "draft-model":  # the draft's q saw the same rules as the target's p
        assert sum(o.num_accepted_tokens for o in outs) == sum(o.num_draft_tokens for o in outs)
