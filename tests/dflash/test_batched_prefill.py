"""A prefill of several prompts runs them in shared forwards (tandem.shard.prefill_groups):
the picks, the KV each slot holds, the hidden rows a DFlash drafter is given and so its
next drafts must be what one prompt at a time gives."""
from __future__ import annotations

import random

import pytest
import torch

from dflash_tiny import SLOTS, VOCAB, random_dflash, tiny_shard, tiny_target
from slot_blocks import blocks, prefill_item
from tandem.model.cuda_graph import next_pow2
from tandem.shard.commands import GREEDY, ProposeBatch
from tandem.shard.prefill_groups import prefill_groups


def slot_rows(pool: torch.Tensor, slot: int, n: int) -> torch.Tensor:
    """The first n positions of a slot's K (or V) in a layer's pool, [kv_heads, n, head_dim]."""
    held = pool[blocks(slot, n)]  # [blocks, kv_heads, block_size, head_dim]
    return held.transpose(0, 1).reshape(held.shape[1], -1, held.shape[3])[:, :n]


def test_groups_cover_every_prompt_once_within_the_budget_and_half_the_width():
    rng = random.Random(0)
    for _ in range(300):
        budget = rng.choice([8, 32, 256])
        lengths = [rng.randint(1, 2 * budget) for _ in range(rng.randint(1, 40))]
        groups = prefill_groups(lengths, budget)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        for g in groups:
            width = max(lengths[i] for i in g)
            if len(g) > 1:
                assert len(g) * width <= budget
                assert all(2 * lengths[i] >= width for i in g)
    assert prefill_groups([10] * 8, 40) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # shared forwards do happen


@pytest.mark.parametrize("graph_rows", [0, 256, 16], ids=["eager", "prefill-graphs", "graphs-of-16-rows"])
def test_a_batched_prefill_leaves_the_same_state_as_one_prompt_at_a_time(graph_rows):
    """graph_rows: the prefill goes through the prefill CUDA graphs of at most that many
    rows (padded to a power of two; on the CPU the padded body runs without capture).
    With 16, a group is split into runs that fit one graph, and the widest prompts go
    eagerly."""
    graphed = graph_rows > 0
    target = tiny_target()
    draft = random_dflash(block_size=6)
    batched, single = tiny_shard(target, draft, target_graphs=graphed), tiny_shard(target, draft)
    if graphed:
        batched.graphs.max_rows = graph_rows
    rng = random.Random(1)
    lengths = [5, 17, 9, 30, 3, 16, 12, 11]
    items = [prefill_item(s, [rng.randrange(VOCAB - 1) for _ in range(n)]) for s, n in enumerate(lengths)]
    assert len(items) <= SLOTS

    forwards = []
    if graphed:
        real = batched.graphs.forward
        batched.graphs.forward = lambda tokens, n, k, *a, **kw: forwards.append((n, k)) or real(tokens, n, k, *a, **kw)
    else:
        real = batched._forward
        batched._forward = lambda rows, *a, **kw: forwards.append(rows.shape) or real(rows, *a, **kw)
    picks = batched.prefill(items).next_tokens
    assert 0 < len(forwards) < len(items)  # prompts shared forwards
    if graphed:
        assert all(next_pow2(n) * k <= graph_rows for n, k in forwards)

    assert picks == [single.prefill([it]).next_tokens[0] for it in items]
    for it in items:
        n = len(it.tokens)
        assert batched.lengths[it.slot] == single.lengths[it.slot] == n
        for layer in range(len(batched.cache.k)):
            assert slot_rows(batched.cache.k[layer], it.slot, n).abs().sum() > 0, "the slot's blocks hold its rows"
            torch.testing.assert_close(slot_rows(batched.cache.k[layer], it.slot, n),
                                       slot_rows(single.cache.k[layer], it.slot, n), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(slot_rows(batched.cache.v[layer], it.slot, n),
                                       slot_rows(single.cache.v[layer], it.slot, n), rtol=1e-5, atol=1e-5)

    # the drafter's context came from the captured rows: its next drafts agree too
    slots = [it.slot for it in items]

    def drafts(shard):
        cmd = ProposeBatch(slots=slots, last_tokens=picks, positions=[len(it.tokens) for it in items],
                           num_drafts=[5] * len(slots), sampling=[GREEDY] * len(slots))
        return shard.propose(cmd).drafts

    assert drafts(batched) == drafts(single)
