"""DFlash drafting under a grammar: a constrained sequence's block logits are masked position
by position with the grammar's state after the drafts before it, so the verify cuts none
of its drafts; greedy output stays the target's own, free requests beside it unchanged,
and seeded sampling repeats."""
from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import torch

from tandem.config import EngineConfig
from tandem.drafters.dflash.masked_picks import masked_picks
from tandem.engine import Engine
from tandem.grammar.constraint import GrammarConstraint as G
from tandem.sampling_params import SamplingParams
from tandem.shard.commands import SamplingSpec
from tandem.shard.local_group import LocalShardGroup

SLOTS, CONTEXT, MAX_TOKENS = 16, 384, 24
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}}}
CONSTRAINTS = [G.json_schema(PERSON), G("regex", r"[0-9]{1,3}(, [0-9]{1,3}){2,6}"), G.choice(["red", "green", "blue"])]
CHATS = ["Describe a person as JSON.", "Give me some numbers.", "What is your favourite colour?",
         "Explain how rainbows form.", "Who wrote a famous novel? Answer as JSON.", "List a few prime numbers.",
         "Pick a colour for a kitchen wall.", "Write a haiku about the sea.", "Your best friend, as JSON.",
         "Count some sheep.", "Which colour is the sky at noon?", "Tell me about volcanoes.",
         "A scientist, as JSON.", "How many legs do insects have?", "The colour of grass?",
         "Give one tip for writing clean code."]


# ---- the picks, on made-up logits ------------------------------------------------------------

class _Walk:
    """A walk whose grammar allows `allowed` at every step and is complete after `complete` drafts."""

    def __init__(self, allowed: list[int], complete: int | None = None):
        self.allowed, self.complete = allowed, complete
        self.taken, self.limit = [], None

    def row(self):
        bits = np.zeros(64, dtype=bool)
        bits[self.allowed] = True
        return np.packbits(bits.reshape(-1, 32)[:, ::-1], axis=1).view(">u4")[:, 0].astype(np.uint32).view(np.int32)

    def take(self, token: int):
        assert token in self.allowed, f"draft {token} is refused by the grammar"
        self.taken.append(token)
        if len(self.taken) == self.complete:
            self.limit = len(self.taken)


def test_greedy_picks_are_the_masked_argmax_mapped_through_the_draft_vocabulary():
    draft_vocab = torch.tensor([0, 3, 5, 7, 9, 11])  # the drafter scores these 6 of 16 tokens
    logits = torch.tensor([[9.0, 1, 2, 3, 0, 0], [0, 0, 0, 1, 5, 2], [4, 4, 4, 4, 4, 9]])
    walk = _Walk([3, 5, 11, 12])  # 12 lies outside the draft vocabulary
    drafts, q = masked_picks(logits, walk, 3, SamplingSpec(), 10, draft_vocab, 16)
    assert drafts == [5, 11, 11] == walk.taken and q is None  # unmasked: 0, 9, 11
    # a grammar whose only next token lies outside the draft vocabulary: no drafts
    assert masked_picks(logits, _Walk([12]), 3, SamplingSpec(), 10, draft_vocab, 16) == ([], None)


def test_a_complete_grammar_ends_the_drafts():
    logits = torch.randn(5, 8)
    drafts, _ = masked_picks(logits, _Walk([1, 2, 6], complete=2), 5, SamplingSpec(), 3, None, 8)
    assert len(drafts) == 2 and set(drafts) <= {1, 2, 6}


def test_sampled_picks_come_with_the_masked_filtered_q_they_were_drawn_from():
    torch.manual_seed(0)
    draft_vocab = torch.arange(0, 40, 2)  # 20 even tokens of 40
    logits = torch.randn(4, 20)
    allowed = [2, 4, 8, 10, 31, 33]  # the odd ones are not in the draft vocabulary
    spec = SamplingSpec(temperature=0.8, top_k=3, seed=11)
    drafts, q = masked_picks(logits, _Walk(allowed), 4, spec, 20, draft_vocab, 40)
    assert len(drafts) == 4 and q.shape == (4, 40)
    assert torch.allclose(q.sum(dim=-1), torch.ones(4))
    refused = [t for t in range(40) if t not in allowed]
    assert q[:, refused].sum() == 0, "q puts mass on a token the grammar refuses"
    assert ((q > 0).sum(dim=-1) <= 3).all(), "top_k was not applied after the mask"
    assert all(q[j, d] > 0 for j, d in enumerate(drafts))
    assert masked_picks(logits, _Walk(allowed), 4, spec, 20, draft_vocab, 40)[0] == drafts, "not keyed"


# ---- the engine, with the shipped drafter on the default model -------------------------------

@pytest.fixture(scope="module")
def dflash_group(default_model):
    from tandem.shard.factory import ShardSpec, build_model_shard

    spec = ShardSpec(num_slots=SLOTS, max_model_len=CONTEXT, row_budget=128, device="cpu", dtype="float32",
                     drafter="dflash")
    shard, _ = build_model_shard(spec, loaded=default_model, progress=False)
    assert shard.drafter.matchers is not None
    return LocalShardGroup(shard)


def make_engine(default_model, group, drafter: str, batch: int = SLOTS) -> Engine:
    config = EngineConfig(drafter=drafter, max_num_seqs=batch, max_model_len=CONTEXT, row_budget=128, adaptive=False)
    return Engine(group, default_model.tokenizer, default_model.eos_token_ids, config)


def cut_tokens(engine) -> float:
    return engine.metrics.grammar_cut_tokens._value.get()


def mixed(engine, count: int = len(CHATS)) -> tuple[list[str], list[SamplingParams]]:
    """Even requests constrained (the constraints in turn), odd ones free."""
    texts = [engine.chat_prompt([{"role": "user", "content": c}]) for c in CHATS[:count]]
    params = [SamplingParams(max_tokens=MAX_TOKENS, structured=CONSTRAINTS[(i // 2) % len(CONSTRAINTS)] if i % 2 == 0 else None)
              for i in range(len(texts))]
    return texts, params


@pytest.fixture(scope="module")
def reference(default_model, dflash_group):
    engine = make_engine(default_model, dflash_group, "none")
    texts, params = mixed(engine)
    return [o.token_ids for o in engine.generate(texts, params)]


def test_masked_drafts_are_never_cut_where_unmasked_ones_are(default_model, dflash_group):
    drafter = dflash_group.shard.drafter
    texts = ["The capital of France is"] * len(CONSTRAINTS)
    params = [SamplingParams(max_tokens=MAX_TOKENS, structured=c) for c in CONSTRAINTS]
    runs = {}
    for name, matchers in (("unmasked", None), ("masked", drafter.matchers)):
        saved, drafter.matchers = drafter.matchers, matchers
        try:
            engine = make_engine(default_model, dflash_group, "dflash")
            runs[name] = (engine.generate(texts, params), cut_tokens(engine))
        finally:
            drafter.matchers = saved
    (unmasked, unmasked_cut), (masked, masked_cut) = runs["unmasked"], runs["masked"]
    assert [o.token_ids for o in unmasked] == [o.token_ids for o in masked]
    assert unmasked_cut > 0, "unmasked DFlash drafts were never cut: the test shows nothing"
    assert masked_cut == 0, "a draft proposed under the mask was cut"
    assert sum(o.num_draft_tokens for o in masked) > 0, "no drafts were proposed"
    assert sum(o.num_accepted_tokens for o in masked) > sum(o.num_accepted_tokens for o in unmasked)


@pytest.mark.parametrize("batch, graphs, count", [(1, False, 4), (4, False, 4), (4, True, 4), (16, False, 16)])
def test_constrained_greedy_with_dflash_equals_no_speculation(batch, graphs, count, default_model, dflash_group,
                                                              reference, monkeypatch):
    drafter = dflash_group.shard.drafter
    ready = []
    if graphs:  # the padded graph shapes (run eagerly on a CPU): the block forward is queued at commit
        monkeypatch.setattr(drafter, "graphs", {})
        take_ready = drafter._take_ready
        monkeypatch.setattr(drafter, "_take_ready", lambda *a: ready.append(take_ready(*a)) or ready[-1])
    engine = make_engine(default_model, dflash_group, "dflash", batch)
    texts, params = mixed(engine, count)
    outs = engine.generate(texts, params)
    assert not graphs or any(r is not None for r in ready), "no propose read a block queued at commit"
    for t, p, o, want in zip(texts, params, outs, reference):
        assert o.finish_reason in ("stop", "length"), o.error
        assert o.token_ids == want, f"b{batch} diverged on {t[-40:]!r} ({p.structured})"
    constrained = [o for o, p in zip(outs, params) if p.structured is not None]
    assert sum(o.num_draft_tokens for o in constrained) > 0
    assert cut_tokens(engine) == 0, "a draft proposed under the mask was cut"


def test_seeded_sampling_under_a_grammar_with_dflash_repeats(default_model, dflash_group):
    engine = make_engine(default_model, dflash_group, "dflash")
    prompt = engine.chat_prompt([{"role": "user", "content": "A person as JSON."}])
    params = SamplingParams(max_tokens=32, temperature=0.9, seed=7, structured=G.json_schema(PERSON))
    free = SamplingParams(max_tokens=32, temperature=0.9, seed=7)
    a, b, c = engine.generate([prompt, prompt, prompt], [params, params, free])
    (alone,) = engine.generate([prompt], params)
    assert a.token_ids == b.token_ids == alone.token_ids
    assert a.num_draft_tokens > 0 and cut_tokens(engine) == 0
    if a.finish_reason == "stop":
        jsonschema.validate(json.loads(a.text), PERSON)
    (free_alone,) = engine.generate([prompt], free)
    assert c.token_ids == free_alone.token_ids
