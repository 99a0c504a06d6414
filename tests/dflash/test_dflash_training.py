"""scripts/train_dflash.py trains what the engine runs: a block in the packed training
forward drafts exactly what a propose at that anchor drafts, and a training step runs."""
from __future__ import annotations

import os
import sys

import pytest
import torch

from dflash_tiny import random_dflash, random_prompts, tiny_shard
from tandem.shard.commands import GREEDY, PrefillItem, ProposeBatch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import train_dflash  # noqa: E402


def features(target, layers, seqs):
    T = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), T, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(s)
    out = target(tokens, torch.arange(len(seqs)), torch.zeros(len(seqs), dtype=torch.long),
                 target.new_cache(len(seqs), T), capture_layers=layers)
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
            shard.prefill([PrefillItem(slot=0, tokens=s[:p])])
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
