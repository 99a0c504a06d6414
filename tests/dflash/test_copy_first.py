"""copy_min_ngram: a model drafter whose sequences draft by prompt lookup where their last
tokens recur. Greedy output stays the target's own; the lookup and the model each draft
the sequences they should (a constrained one: the model, under its grammar); the option
is refused beside a drafter with no model."""
from __future__ import annotations

import pytest
import torch

from dflash_tiny import SLOTS, VOCAB, DigitsTokenizer, random_dflash, random_prompts, tiny_shard
from tandem.config import EngineConfig
from tandem.drafters.copy_first import CopyFirstDrafter
from tandem.engine import Engine
from tandem.errors import InvalidRequestError
from tandem.sampling_params import SamplingParams
from tandem.sequence import Sequence
from tandem.shard.local_group import LocalShardGroup

MAX_TOKENS = 32


def copying_prompts(count: int, seed: int) -> list[list[int]]:
    """Half the prompts end by repeating their own start (the lookup finds a match at once),
    half are plain random tokens."""
    out = []
    for i, p in enumerate(random_prompts(count, seed=seed, low=8, high=30)):
        out.append(p + p[: len(p) // 2] if i % 2 == 0 else p)
    return out


def engine_of(shard, drafter: str, batch: int, **cfg) -> Engine:
    config = EngineConfig(drafter=drafter, max_num_seqs=batch, max_model_len=shard.limits.max_model_len,
                          row_budget=shard.rules.row_budget, **cfg)
    return Engine(LocalShardGroup(shard), DigitsTokenizer(), eos_token_ids=(), config=config)


@pytest.mark.parametrize("batch", [1, 4, SLOTS])
def test_copy_first_keeps_greedy_output_exact_and_both_sources_draft(batch, target):
    prompts = copying_prompts(max(batch, 2), seed=40 + batch)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    want = [o.token_ids for o in engine_of(tiny_shard(target, None), "none", SLOTS).generate(prompts, params)]
    shard = tiny_shard(target, random_dflash(seed=7))
    model_rounds = []
    inner = shard.drafter.propose
    shard.drafter.propose = lambda slots, *a, **kw: (model_rounds.append(len(slots)), inner(slots, *a, **kw))[1]
    engine = engine_of(shard, "dflash", batch, num_speculative_tokens=5, adaptive=False, copy_min_ngram=2)
    got = [o.token_ids for o in engine.generate(prompts, params)]
    assert got == want
    drafter = engine.ctx.drafter
    assert isinstance(drafter, CopyFirstDrafter)
    copied = engine.metrics.copied_drafts._value.get()  # tandem:spec_decode_num_copied_drafts
    assert copied > 0 and sum(model_rounds) > 0, (copied, model_rounds)


class RecordingDrafter:
    """Stands in for the rank proxy: records whom it was asked to draft for."""

    name, propose_batch_max, whole_blocks = "dflash", 64, True

    def __init__(self):
        self.asked: list[list[str]] = []

    def propose(self, seqs, num_drafts):
        self.asked.append([s.request_id for s in seqs])
        return [[VOCAB - 2] * g for g in num_drafts]


def seq(request_id: str, tokens: list[int]) -> Sequence:
    return Sequence(request_id=request_id, prompt=None, prompt_ids=tokens, params=SamplingParams(max_tokens=8), seed=0,
                    eos_ids=frozenset(), max_model_len=64, arrival=0.0)


def test_the_lookup_drafts_where_the_last_tokens_recur_and_the_model_the_rest_in_one_call():
    model = RecordingDrafter()
    drafter = CopyFirstDrafter(model, min_match=3, max_match=4)
    copying = seq("copy", [5, 6, 7, 8, 9, 1, 2, 5, 6, 7])  # 5 6 7 recurs: 8 9 1 follow it
    short = seq("short", [5, 6, 7, 8, 3, 6, 7])  # only "6 7" recurs: under min_match
    fresh = seq("fresh", torch.arange(10).tolist())
    drafts = drafter.propose([copying, short, fresh], [3, 3, 2])
    assert drafts == [[8, 9, 1], [VOCAB - 2] * 3, [VOCAB - 2] * 2]
    assert model.asked == [["short", "fresh"]]
    assert drafter.copied == 1
    assert drafter.propose([copying], [2]) == [[8, 9]] and model.asked == [["short", "fresh"]]


def test_a_constrained_sequence_keeps_the_models_drafts_made_under_its_grammar():
    model = RecordingDrafter()
    drafter = CopyFirstDrafter(model, min_match=2, max_match=4)
    constrained = seq("json", [5, 6, 7, 8, 9, 5, 6])  # "5 6" recurs, but a copy could break the grammar
    constrained.grammar = object()
    assert drafter.propose([constrained], [3]) == [[VOCAB - 2] * 3]
    assert model.asked == [["json"]] and drafter.copied == 0


@pytest.mark.parametrize("drafter", ["ngram", "none"])
def test_copy_min_ngram_beside_a_drafter_with_no_model_is_refused_by_name(drafter):
    with pytest.raises(InvalidRequestError) as e:
        EngineConfig(drafter=drafter, copy_min_ngram=3)
    assert e.value.field == "copy_min_ngram" and drafter in str(e.value)


def test_the_rank_gives_drafts_it_did_not_propose_a_one_hot_q_and_forgets_its_own_on_a_failed_verdict(target):
    """Sampling stays lossless when the lookup drafts: the rank's q covers only its own drafts."""
    from slot_blocks import prefill_item, verify_batch
    from tandem.shard.commands import ProposeBatch, SamplingSpec, failed_verdict

    shard = tiny_shard(target, random_dflash(seed=3))
    prompt = random_prompts(1, seed=9)[0]
    (last,) = shard.prefill([prefill_item(0, prompt)]).next_tokens
    spec = SamplingSpec(temperature=0.9, seed=5)
    (own,) = shard.propose(ProposeBatch(slots=[0], last_tokens=[last], positions=[len(prompt)], num_drafts=[4],
                                        sampling=[spec])).drafts
    copy = [(t + 1) % (VOCAB - 1) for t in own]  # what a lookup could have drafted instead
    assert shard._draft_probs(0, own) is not None and shard._draft_probs(0, copy) is None
    shard.verify(verify_batch(1, 1, 5, [0], [len(prompt)], [last, *own]))
    shard.commit(failed_verdict(1, 1))
    assert shard._draft_probs(0, own) is None, "q of drafts from before a failed verdict outlived it"
