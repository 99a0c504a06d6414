"""DFlash with the prefix cache: its context lies in blocks of the target's layout, so a
block the cache shares holds the drafter's context of its positions too. A prefill over
cached blocks drafts what a full prefill drafts, and greedy output stays exact."""
from __future__ import annotations

import pytest

from dflash_tiny import SLOTS, random_dflash, random_prompts, tiny_shard
from slot_blocks import BLOCK, blocks, prefill_item
from tandem.sampling_params import SamplingParams
from tandem.shard.commands import GREEDY, PrefillItem, ProposeBatch
from test_dflash_lossless import MAX_TOKENS, tiny_engine

SHARED = random_prompts(1, seed=61, low=40, high=41)[0]  # 40 tokens: 2 full blocks of 16


def _drafts(shard, slot: int, tokens: list[int], last: int) -> list[int]:
    cmd = ProposeBatch(slots=[slot], last_tokens=[last], positions=[len(tokens)], num_drafts=[5], sampling=[GREEDY])
    return shard.propose(cmd).drafts[0]


@pytest.mark.parametrize("released", [False, True], ids=["donor running", "donor released"])
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "padded graph shapes"])
def test_a_prefill_over_cached_blocks_drafts_what_a_full_prefill_drafts(target, draft, released, graphs):
    first, second = SHARED + [5, 6, 7], SHARED + [9, 10, 11, 12, 13]
    cached = (len(SHARED) // BLOCK) * BLOCK
    shared = tiny_shard(target, draft, cuda_graphs=graphs)
    shared.prefill([prefill_item(0, first)])  # its rows stay pending in the drafter
    if released:
        shared.release([0])  # ... or are written out as the slot goes
    table = blocks(0, cached) + blocks(1, len(second))[cached // BLOCK :]
    got = shared.prefill([PrefillItem(slot=1, tokens=second, blocks=table, cached_len=cached)]).next_tokens[0]
    fresh = tiny_shard(target, draft, cuda_graphs=graphs)
    want = fresh.prefill([prefill_item(1, second)]).next_tokens[0]
    assert got == want
    assert _drafts(shared, 1, second, got) == _drafts(fresh, 1, second, want)


def test_greedy_output_stays_exact_with_the_prefix_cache_and_blocks_are_hit(target):
    prompts = [SHARED + p for p in random_prompts(6, seed=62, low=3, high=20)]
    plain = tiny_engine(tiny_shard(target, None), "none", SLOTS)
    want = [o.token_ids for o in plain.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))]
    engine = tiny_engine(tiny_shard(target, random_dflash(seed=3)), "dflash", 4, num_speculative_tokens=5, adaptive=False)
    outs = engine.generate(prompts[:1], SamplingParams(max_tokens=MAX_TOKENS))
    outs += engine.generate(prompts[1:], SamplingParams(max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outs] == want
    assert engine.metrics.prefix_cache_hits._value.get() >= 5 * 32
    assert sum(o.num_draft_tokens for o in outs) > 0


def test_greedy_output_stays_exact_when_prompts_are_prefilled_in_chunks(target):
    # a chunk after the first is a prefill over blocks the sequence itself wrote
    prompts = random_prompts(4, seed=63, low=40, high=70)
    plain = tiny_engine(tiny_shard(target, None), "none", SLOTS)
    want = [o.token_ids for o in plain.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))]
    engine = tiny_engine(tiny_shard(target, random_dflash(seed=3)), "dflash", 4, num_speculative_tokens=5,
                         adaptive=False, max_prefill_tokens=16)
    outs = engine.generate(prompts[:1], SamplingParams(max_tokens=MAX_TOKENS))  # alone, then a burst
    outs += engine.generate(prompts[1:], SamplingParams(max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outs] == want
    assert sum(o.num_draft_tokens for o in outs) > 0
