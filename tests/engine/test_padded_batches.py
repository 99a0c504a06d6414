"""Greedy sequences of different draft counts share one verify forward, padded to the
batch's count (tandem.batching): the plan, and that the padded forward keeps greedy
output exact."""
from __future__ import annotations

from tandem import batching
from tandem.sampling_params import SamplingParams
from tandem.sequence import Sequence
from tandem.verify import step

from .prompts import prompts
from .test_losslessness import MAX_TOKENS, run_joining_midway


def seq(name: str, drafts: int, *, temperature: float = 0.0, max_model_len: int = 512) -> Sequence:
    s = Sequence(request_id=name, prompt=None, prompt_ids=[1, 2, 3], params=SamplingParams(temperature=temperature),
                 seed=0, eos_ids=frozenset(), max_model_len=max_model_len, arrival=0.0)
    s.drafts = [7] * drafts
    return s


def plan(seqs, cost=None, row_budget=128):
    return [[s.request_id for s in b] for b in batching.plan_verify_batches(seqs, row_budget, 64, cost)]


def test_without_a_cost_model_all_greedy_counts_share_one_batch():
    seqs = [seq("a", 0), seq("b", 4), seq("c", 2), seq("d", 4)]
    assert plan(seqs) == [["b", "d", "c", "a"]]


def test_sampled_and_context_bound_sequences_keep_their_exact_count():
    seqs = [seq("g0", 0), seq("g4", 4), seq("t2", 2, temperature=0.8), seq("t2b", 2, temperature=0.8),
            seq("full", 1, max_model_len=10)]
    assert plan(seqs) == [["t2", "t2b"], ["full"], ["g4", "g0"]]


def test_the_cost_model_splits_counts_when_padding_costs_more():
    # compute-bound: ms grows with rows, plus a fixed 20 ms a forward
    many_plain = [seq(f"p{i}", 0) for i in range(30)]
    one_long = [seq("long", 8)]
    linear = lambda rows: 20.0 + 1.0 * rows  # noqa: E731
    assert plan(many_plain + one_long, linear) == [["long"], [f"p{i}" for i in range(30)]]
    # weight-bound: a forward costs the same for any rows: one padded batch, while it fits
    flat = lambda rows: 20.0  # noqa: E731
    assert plan(many_plain + one_long, flat, row_budget=512) == [["long", *[f"p{i}" for i in range(30)]]]
    # 31 x 9 rows over a budget of 128 would take three forwards: two (unpadded) are cheaper
    assert plan(many_plain + one_long, flat, row_budget=128) == [["long"], [f"p{i}" for i in range(30)]]


def test_padded_batches_respect_the_row_budget():
    seqs = [seq(f"s{i}", 4 if i % 2 else 0) for i in range(10)]
    batches = batching.plan_verify_batches(seqs, 20, 64, None)
    assert all(len(b) * (batching.batch_width(b) + 1) <= 20 for b in batches)
    assert sorted(s.request_id for b in batches for s in b) == sorted(s.request_id for s in seqs)


def test_a_block_drafters_short_rounds_are_padded_to_the_next_width_within_the_row_budget():
    # six sequences at the end of their max_tokens draft 2 of a block of 7 (widths 1, 3, 7):
    # 3 rows each would fit 6 in a budget of 20, but padded to 3 drafts (4 rows) only 5 fit
    widths = (1, 3, 7)
    seqs = [seq(f"s{i}", 2) for i in range(6)]
    batches = batching.plan_verify_batches(seqs, 20, 64, None, widths)
    assert all(batching.batch_width(b, widths) == 3 and len(b) * 4 <= 20 for b in batches)
    assert sorted(s.request_id for b in batches for s in b) == sorted(s.request_id for s in seqs)
    assert batching.batch_width([seq("copied", 5)], widths) == 7  # a copied draft of 5 takes the block's shape
    assert batching.batch_width([seq("one", 1)], widths) == 1
    assert batching.batch_width([seq("plain", 0)], widths) == 0  # a batch without drafts stays one row
    assert batching.batch_width([seq("end", 2, max_model_len=10)], widths) == 2  # no room to pad
    assert batching.batch_width([seq("forced", 9)], widths) == 9  # grammar-forced tokens past the block


def test_padded_rows_repeat_the_last_row():
    assert step.padded_rows(5, [6, 7], 5) == [5, 6, 7, 7, 7]
    assert step.padded_rows(5, [], 3) == [5, 5, 5]
    assert step.padded_rows(5, [6], 2) == [5, 6]


def test_padded_verify_keeps_greedy_output(make_engine, monkeypatch):
    padded = []
    real = step.padded_rows

    def spy(last, drafts, k):
        if len(drafts) + 1 < k:
            padded.append(k - 1 - len(drafts))
        return real(last, drafts, k)

    monkeypatch.setattr(step, "padded_rows", spy)
    texts = prompts(16)
    params = SamplingParams(max_tokens=MAX_TOKENS)
    reference = make_engine("none").generate(texts, params)
    outs = run_joining_midway(make_engine("ngram", adaptive=False), texts, params)
    assert padded, "no batch mixed draft counts: the padded path was not exercised"
    assert [o.token_ids for o in outs] == [r.token_ids for r in reference]
