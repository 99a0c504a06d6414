"""scripts/train_dflash.py trains what the engine runs: a block in the packed training
forward drafts exactly what a propose at that anchor drafts, and a training step runs."""
from __future__ import annotations

import os
import sys

import pytest
import torch

from dflash_tiny import random_dflash, random_prompts, tiny_shard
from slot_blocks import BLOCK, prefill_item
from tandem.model.kv_cache import fixed_tables
from tandem.shard.commands import GREEDY, ProposeBatch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import train_dflash  # noqa: E402


def features(target, layers, seqs):
    T = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), T, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(s)
    tables = fixed_tables(len(seqs), T, BLOCK)
    out = target(tokens, torch.zeros(len(seqs), dtype=torch.int32), target.new_cache(len(seqs) * tables.shape[1]), tables,
                 capture_layers=layers)
    return tokens, torch.cat([out.hidden[i] for i in layers], dim=-1)


def test_a_packed_training_block_drafts_what_a_propose_at_its_anchor_drafts(target, draft):
    seqs = random_prompts(3, seed=31, low=30, high=50)
    layers = draft.config.target_layer_ids
    with torch.no_grad():
        tokens, feats = features(target, layers, seqs)
        anchors = torch.tensor([[5, 17, 25], [3, 9, 28], [12, 20, 29]])
        hidden = train_dflash.block_hidden(draft, target, tokens, feats, anchors)  # [3, 3, B-1, H]
        trained = draft.logits(hidden, target.lm_head).argmax(-1)
    shard = tiny_shard(target, draft)
    for i, s in enumerate(seqs):
        for j, p in enumerate(anchors[i].tolist()):
            shard.release([0])
            shard.prefill([prefill_item(0, s[:p])])
            cmd = ProposeBatch(slots=[0], last_tokens=[s[p]], positions=[p], num_drafts=[16], sampling=[GREEDY])
            assert shard.propose(cmd).drafts[0] == trained[i, j].tolist(), f"sequence {i}, anchor {p}"


def test_a_training_step_lowers_the_loss_on_its_batch(target):
    model = random_dflash(seed=4, std=0.02).requires_grad_(True).train()
    seqs = random_prompts(4, seed=32, low=30, high=50)
    tokens, feats = features(target, model.config.target_layer_ids, seqs)
    prompt_len = torch.full((4,), 10)
    seq_len = torch.tensor([len(s) for s in seqs])
    anchors = train_dflash.sample_anchors(prompt_len, seq_len, 6, torch.Generator().manual_seed(0))
    assert ((anchors >= 10) & (anchors <= seq_len[:, None] - 2)).all()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        loss, accepted = train_dflash.block_loss(model, target, tokens, feats.detach(), prompt_len, seq_len, anchors, 4.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert accepted.shape == anchors.shape
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("count", [1, 5])
def test_the_chosen_target_layers_are_spread_and_end_at_the_last(count):
    from tandem.drafters.dflash.model import spread_layer_ids

    ids = spread_layer_ids(30, count)
    assert len(ids) == count and ids[-1] == 29 and list(ids) == sorted(set(ids))


def test_held_out_prompts_are_never_training_prompts():
    train, held = train_dflash.make_prompts(2000, 40)
    assert len(train) == 2000 and len(held) == 40 and not set(train) & set(held)


def test_the_walked_offline_acceptance_is_the_engines_acceptance(target):
    # The engine's acceptance length is the per-anchor offline counts walked round by
    # round (not their uniform mean): a check of positions, contexts and the bonus token.
    from dflash_tiny import DigitsTokenizer
    from tandem.config import EngineConfig
    from tandem.engine import Engine
    from tandem.sampling_params import SamplingParams
    from tandem.shard.local_group import LocalShardGroup

    draft = random_dflash(seed=6, std=0.5)
    B, max_new = draft.config.block_size, 40
    prompts = random_prompts(6, seed=33, low=4, high=30)
    data = train_dflash.greedy_with_features(target, prompts, draft.config.target_layer_ids, max_new, 6, set())
    walked = train_dflash.walked_acceptance(draft, target, data, max_new)
    shard = tiny_shard(target, draft)
    engine = Engine(LocalShardGroup(shard), DigitsTokenizer(), eos_token_ids=(),
                    config=EngineConfig(drafter="dflash", max_num_seqs=6, max_model_len=shard.limits.max_model_len,
                                        row_budget=shard.rules.row_budget, num_speculative_tokens=B - 1, adaptive=False,
                                        copy_min_ngram=0))  # the walk is of the model's own drafts
    outs = engine.generate(prompts, SamplingParams(max_tokens=max_new))
    tokens, _, prompt_len, seq_len = data
    assert [o.token_ids for o in outs] == [tokens[i, prompt_len[i]:seq_len[i]].tolist() for i in range(6)]
    accepted, rounds = sum(o.num_accepted_tokens for o in outs), sum(o.num_drafts for o in outs)
    assert accepted > 0, "the random drafter accepted nothing: the check is vacuous"
    assert walked == pytest.approx(1 + accepted / rounds, abs=1e-9)
    uniform = train_dflash.offline_acceptance(draft, target, data)
    assert uniform >= walked - 0.05


def test_a_draft_vocabulary_head_counts_tokens_outside_it_as_misses(target):
    from dataclasses import replace

    from tandem.drafters.dflash import DFlashDraftModel

    base = random_dflash(seed=6, std=0.5)
    prompts = random_prompts(3, seed=33, low=4, high=30)
    tokens, feats, prompt_len, seq_len = train_dflash.greedy_with_features(target, prompts, base.config.target_layer_ids,
                                                                           40, 3, set())
    anchors = train_dflash.sample_anchors(prompt_len, seq_len, 16, torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, full = train_dflash.block_loss(base, target, tokens, feats, prompt_len, seq_len, anchors, 4.0)
        # a vocabulary of every token: the same counts
        every = DFlashDraftModel(replace(base.config, draft_vocab_size=base.config.vocab_size))
        every.load_state_dict(base.state_dict(), strict=False)
        every.eval()
        _, same = train_dflash.block_loss(every, target, tokens, feats, prompt_len, seq_len, anchors, 4.0)
        assert torch.equal(full, same) and full.sum() > 0
        # a vocabulary without the tokens the full head drafts first: nothing is accepted there
        B = base.config.block_size
        first = tokens.gather(1, (anchors + 1).clamp(max=tokens.shape[1] - 1))[full > 0]
        keep = torch.tensor(sorted(set(range(base.config.vocab_size)) - set(first.tolist())))
        some = DFlashDraftModel(replace(base.config, draft_vocab_size=len(keep)))
        some.load_state_dict(base.state_dict(), strict=False)
        some.draft_vocab.copy_(keep)
        some.eval()
        loss, fewer = train_dflash.block_loss(some, target, tokens, feats, prompt_len, seq_len, anchors, 4.0)
        assert torch.isfinite(loss) and B > 1
        assert (fewer[full > 0] == 0).all() and (fewer <= full).all()
