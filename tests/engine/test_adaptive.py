"""Adaptive speculation: per-sequence gamma and the batch-level cap."""
from __future__ import annotations

from tandem.adaptive import AdaptiveSpec, BatchCostModel, expected_tokens


def test_gamma_grows_after_full_acceptance_and_shrinks_after_rejection():
    a = AdaptiveSpec(8)
    st = a.new_state()
    st.gamma = 4
    a.record_verify(st, 4, 4, 10)
    assert st.gamma == 6
    a.record_verify(st, 6, 0, 20)
    assert st.gamma == 4


def test_speculation_turns_off_after_repeated_misses_and_retries_later():
    a = AdaptiveSpec(4, off_after=3, retry_after=32)
    st = a.new_state()
    for out in (10, 11, 12):
        assert a.allowed(st, out)
        a.record_verify(st, st.gamma, 0, out)
    assert not a.allowed(st, 13)
    assert not a.allowed(st, 43)
    assert a.allowed(st, 44)
    assert st.gamma == 4  # the retry starts fresh


def test_expected_tokens_follows_the_geometric_formula():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert abs(expected_tokens(0.5, 2) - 1.75) < 1e-9


def test_batch_cap_turns_speculation_off_when_rows_cost_as_much_as_tokens():
    cost = BatchCostModel()
    # compute-bound: time grows linearly with rows, so extra rows never pay for themselves
    for rows in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        cost.record_forward(rows, float(rows))
    ladder = (0, 1, 2, 4)
    assert cost.best_cap([4] * 32, [0.3] * 32, ladder) == 0


def test_batch_cap_keeps_speculation_when_rows_are_cheap():
    cost = BatchCostModel()
    for rows in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        cost.record_forward(rows, 10.0)  # memory-bound: a forward costs the same whatever its rows
    assert cost.best_cap([4] * 8, [0.8] * 8, (0, 1, 2, 4)) == 4


def test_nothing_measured_means_plain_decoding_until_a_forward_is_timed():
    # a first wave of 32 sequences must not draft blind (a draft model would catch up
    # every prompt for drafts a compute-bound target cannot use)
    cost = BatchCostModel()
    assert cost.best_cap([4] * 32, [0.7] * 32, (0, 1, 2, 4)) == 0
    cost.record_forward(1, 10.0)  # memory-bound: more rows are priced alike until measured
    assert cost.best_cap([4], [0.5], (0, 1, 2, 4)) == 4


def test_batch_cap_prices_the_forwards_the_scheduler_will_run():
    from tandem.batching import plan_cost

    cost = BatchCostModel()
    for rows in (8, 16, 32, 64, 128, 256):
        cost.record_forward(rows, 20.0 + 0.5 * rows)  # a fixed cost a forward, then compute
    gammas, alphas = [4] * 8 + [0] * 24, [0.9] * 8 + [0.7] * 24  # 24 with speculation off
    plan = lambda gs: plan_cost(gs, 512, 64, cost.estimate)  # noqa: E731
    # two forwards (8 x 5 rows, 24 x 1) or one padded (32 x 5): either costs more than
    # the drafts of 8 sequences bring in, so speculation stays off this tick
    assert cost.best_cap(gammas, alphas, (0, 1, 2, 4), plan=plan) == 0
    # one forward of sum(g + 1) = 64 rows is the optimistic price, which would speculate
    assert cost.best_cap(gammas, alphas, (0, 1, 2, 4)) > 0


def test_a_bucket_never_costs_more_than_a_larger_one():
    cost = BatchCostModel()
    cost.record_forward(32, 560.0)  # a first forward that paid for allocations
    cost.record_forward(160, 140.0)
    assert cost.estimate(32) == 140.0
    assert cost.estimate(160) == 140.0
    # unmeasured and below every bucket: the smallest larger one's cost scaled by rows
    assert cost.estimate(8) == 560.0 * 8 / 32


def test_a_small_cap_gets_tried_when_only_large_forwards_were_measured():
    cost = BatchCostModel()
    cost.record_forward(160, 1000.0)  # 32 sequences x 5 rows, compute-bound
    cost.record_propose(4, 800.0)  # a draft model: 200 ms a step for the whole batch
    assert cost.best_cap([4] * 32, [0.8] * 32, (0, 1, 2, 4)) == 0


def test_plain_rounds_bring_alpha_back_so_a_sequence_capped_to_zero_drafts_again():
    from tandem.adaptive import ALPHA_PRIOR

    a = AdaptiveSpec(4, retry_after=32)
    st = a.new_state()
    for _ in range(4):
        a.record_verify(st, 4, 0, 10)  # drafts that fail: alpha falls
    low = st.alpha
    assert low < 0.2
    cost = BatchCostModel()
    for rows in (1, 2, 4, 8):
        cost.record_forward(rows, 10.0 + 3.0 * rows)
    assert cost.best_cap([4], [low], (0, 1, 2, 4)) == 0  # at this alpha the tick drafts nothing
    for _ in range(32):
        a.record_plain(st, 1)  # ... so only plain rounds follow
    assert st.alpha > low + 0.6 * (ALPHA_PRIOR - low)
    assert cost.best_cap([4], [st.alpha], (0, 1, 2, 4)) > 0  # and it is tried again



def test_a_prefill_floors_the_price_of_rows_above_every_measured_bucket():
    cost = BatchCostModel()
    cost.record_forward(1, 100.0)
    cost.record_forward(3, 120.0)  # buckets 1 and 4: what batch-1 requests measured
    # past them, half the last step's cost a row (20 ms for 3 rows): 160 rows at 640 ms
    assert cost.estimate(160) == 120.0 + 0.5 * (20.0 / 3) * (160 - 4)
    cost.record_prefill(rows=500, ms=5000.0)  # 10 ms a row where compute-bound
    assert cost.estimate(160) == 120.0 + 0.8 * 10.0 * (160 - 4)  # past bucket 4, a compute row each
    assert cost.estimate(4) == 120.0 and cost.estimate(8) == 120.0 + 0.8 * 10.0 * 4
    # 32 sequences: 4 drafts each would cost 5x the rows for < 5x the tokens: off, before any try
    assert cost.best_cap([4] * 32, [0.9] * 32, (0, 1, 2, 4)) == 0
    assert cost.best_cap([4], [0.9], (0, 1, 2, 4)) == 4  # batch 1 still speculates


def test_rows_past_the_largest_measured_forward_cost_at_least_a_compute_row_each():
    # The CPU with Qwen2.5-Coder 1.5B at batch 32 (draft model 0.5B): warm prefill 7.49 ms
    # a row, the 32-row decode 304 ms. The floor alone priced 64 rows at 383 ms, so one
    # draft each looked 1.35x better than plain; the ticks that caught the draft model up
    # then cost 830-860 ms, and a 64-row verify ~600.
    cost = BatchCostModel()
    cost.record_forward(1, 95.8)
    cost.record_prefill(rows=1300, ms=1300 * 7.49)
    cost.record_forward(32, 304.0)
    assert cost.estimate(64) >= 304.0 + 0.8 * 7.49 * 32
    assert cost.best_cap([4] * 32, [0.7] * 32, (0, 1, 2, 3, 4)) == 0


def test_a_prefill_slower_per_row_than_a_whole_forward_is_no_floor():
    # An H200: a graphed 1-row verify 3.5 ms; a short prompt's eager prefill 50 ms a row
    # (launch-bound, the first one cold). As a floor it priced every draft out for good.
    cost = BatchCostModel()
    cost.record_forward(1, 3.5)
    cost.record_prefill(rows=30, ms=1500.0)
    cost.record_prefill(rows=30, ms=210.0)  # the cheapest row counts: 7 ms
    assert cost.prefill_ms_per_row == 7.0
    assert cost.estimate(8) == 3.5  # optimistic, so the 8-row bucket gets tried and measured
    assert cost.best_cap([7], [0.7], (0, 1, 2, 3, 4, 6)) == 6


def test_one_slow_propose_does_not_price_drafting_out():
    # An H200 with DFlash: after the warm-up sample, one propose captured a CUDA graph for
    # a new shape (12.6 ms against 0.8). Priced at once, drafting stopped and, never
    # proposing again, the drafter was never timed again.
    cost = BatchCostModel()
    cost.record_forward(1, 3.5)
    cost.record_forward(8, 4.1)
    cost.record_propose(7, 12.6)
    assert cost.best_cap([7], [0.5], (0, 1, 2, 3, 4, 6)) > 0  # too few proposes timed to count yet
    cost.record_propose(7, 0.8)
    cost.record_propose(7, 0.8)
    assert cost.propose_ms_per_step() == 0.8 / 7  # the capture does not count
    assert cost.best_cap([7], [0.5], (0, 1, 2, 3, 4, 6)) > 0
    for _ in range(5):  # a drafter that really is slow does get priced out
        cost.record_propose(7, 30.0)
    assert cost.best_cap([7], [0.5], (0, 1, 2, 3, 4, 6)) == 0


def test_a_buckets_first_forward_and_the_first_propose_are_taken_as_warm_up():
    # On a GPU a bucket's first forward captures a CUDA graph (10-30x a replay): kept, it
    # would price speculation out for good, since an unused cap is never measured again.
    cost = BatchCostModel(warmup_samples=1)
    cost.record_forward(1, 10.0)
    cost.record_forward(1, 10.0)
    cost.record_forward(5, 300.0)  # the first 5-row forward: a capture
    assert cost.estimate(1) == 10.0 and cost.estimate(5) == 10.0  # unmeasured: priced optimistically
    assert cost.best_cap([4], [0.9], (0, 1, 2, 4)) == 4
    cost.record_forward(5, 12.0)
    assert cost.estimate(5) == 12.0
    cost.record_propose(4, 400.0)
    assert cost.propose_ms_per_step() is None
    for _ in range(3):  # priced once a few are timed
        cost.record_propose(4, 8.0)
    assert cost.propose_ms_per_step() == 2.0


def test_a_block_drafter_keeps_its_whole_block_and_pays_one_propose_step():
    # DFlash drafts 7 tokens in one forward: fewer drafts save nothing, so a rejected
    # round must not shrink gamma (it did: 1.42x fixed against 0.84x adaptive at batch 8
    # on an H200), and a propose is priced once, not per draft.
    a = AdaptiveSpec(7, whole_blocks=True)
    assert a.ladder == (0, 1, 3, 7)  # prefixes of 2 and 4 rows: few verify shapes, each a cost bucket
    assert a.widths == (1, 3, 7) and AdaptiveSpec(4, whole_blocks=True).ladder == (0, 1, 3, 4)
    st = a.new_state()
    a.record_verify(st, drafted=7, accepted=0, num_output=10)
    a.record_verify(st, drafted=7, accepted=2, num_output=13)
    assert st.gamma == 7
    for n in range(3):  # misses in a row do not rest it by count: they lower alpha (see block_break_even)
        a.record_verify(st, drafted=7, accepted=0, num_output=20 + n)
    assert a.allowed(st, 22) and st.alpha < 0.6
    cost = BatchCostModel(whole_blocks=True)
    for rows, ms in ((1, 3.5), (2, 3.7), (4, 3.8), (8, 3.9)):  # a graphed GPU verify
        cost.record_forward(rows, ms)
    for _ in range(3):
        cost.record_propose(7, 0.8)
    assert cost.propose_ms_per_step() == 0.8  # one step per propose
    assert cost.best_cap([7], [0.45], a.ladder) >= 3  # ~1.75 tokens for 4.6 ms beats 1 for 3.5


def test_alpha_is_the_chance_a_draft_passes_once_the_ones_before_it_did():
    # DFlash on an H200: 7 drafts a round, 1.6 accepted on average (acceptance length 2.6).
    # As accepted / drafted that read as alpha 0.23 (1.3 tokens a round), and the batch
    # rule turned drafting off; fixed, it ran 1.36x at batch 8.
    a = AdaptiveSpec(7, whole_blocks=True)
    st = a.new_state()
    for _ in range(40):
        a.record_verify(st, drafted=7, accepted=1, num_output=100)
        a.record_verify(st, drafted=7, accepted=2, num_output=100)
    assert 0.55 < st.alpha < 0.65  # 1.5 passed of 2.5 judged
    assert 2.2 < expected_tokens(st.alpha, 7) < 2.7  # what the rounds really yielded: 2.5
    for _ in range(20):
        a.record_verify(st, drafted=7, accepted=7, num_output=100)  # all passed: none rejected
    assert st.alpha > 0.95


def test_a_block_drafter_rests_a_sequence_only_while_its_block_does_not_pay():
    # CPU-like costs (SmolLM2, 2 cores): a draft row costs ~0.9 ms where a plain token of a
    # batch of 8 costs ~3 ms, so a sequence whose block yields 0.4 extra tokens is not worth
    # its 7 rows; one accepting 2 a round is. On a GPU-like table rows are nearly free, so
    # the weak one pays there, and only a hopeless one does not.
    def pays(cost, alpha):  # what the engine checks for each sequence of a batch of 8
        return expected_tokens(alpha, 7) - 1.0 >= cost.block_break_even(7, 8)

    a = AdaptiveSpec(7, whole_blocks=True)
    cpu = BatchCostModel(whole_blocks=True)
    for rows, ms in ((8, 24.0), (64, 75.0)):
        cpu.record_forward(rows, ms)
    hopeless, weak, good = 0.05, 0.3, 0.7
    assert expected_tokens(hopeless, 7) < 1.06 and 1.4 < expected_tokens(weak, 7) < 1.5 and expected_tokens(good, 7) > 3
    assert not pays(cpu, weak)
    assert pays(cpu, good)
    gpu = BatchCostModel(whole_blocks=True)
    for rows, ms in ((8, 4.3), (64, 5.0)):
        gpu.record_forward(rows, ms)
    assert pays(gpu, weak) and not pays(gpu, hopeless)
    assert pays(BatchCostModel(whole_blocks=True), hopeless)  # nothing measured: try it
    # a rest lasts one token: the next tick weighs the sequence again, its alpha drifting
    # back toward the prior while it decodes plainly
    st = a.new_state()
    a.rest(st, num_output=40)
    assert not a.allowed(st, 40) and a.allowed(st, 41)
    before = st.alpha
    st.passed = 0.1 * st.judged
    a.record_plain(st, 8)
    assert 0.1 < st.alpha < before


def measured(forwards, propose_ms: float | None = None) -> BatchCostModel:
    """A block drafter's cost model with these (rows, ms) forwards recorded and, given
    propose_ms, enough one-sequence proposes of that cost timed to price them."""
    cost = BatchCostModel(whole_blocks=True)
    for rows, ms in forwards:
        cost.record_forward(rows, ms)
    for _ in range(3 if propose_ms is not None else 0):
        cost.record_propose(7, propose_ms)
    return cost


def test_a_block_drafter_verifies_a_prefix_of_its_block_where_rows_cost():
    # SmolLM2 int4, 2 CPU cores, batch 1: 1/2/4/8 rows in 17.0/19.0/20.6/29.6 ms and a
    # propose of 6.7 ms; DFlash accepting ~2.2 a round (alpha ~0.58). Three drafts a round
    # ran 64 tok/s there against the whole block's 53 and plain decoding's 53.
    a = AdaptiveSpec(7, whole_blocks=True)
    cpu = measured(((1, 17.0), (2, 19.0), (4, 20.6), (8, 29.6)), propose_ms=6.7)
    assert cpu.best_cap([7], [0.58], a.ladder) == 3
    # on a GPU's batch 1 rows are nearly free: the whole block
    gpu = measured(((1, 3.5), (2, 3.6), (4, 3.7), (8, 3.8)), propose_ms=0.8)
    assert gpu.best_cap([7], [0.58], a.ladder) == 7


def test_a_block_drafter_rests_a_sequence_only_when_no_prefix_of_its_block_pays():
    # CPU-like costs of a batch of 8: the whole block's 56 extra rows cost 1.6 plain tokens,
    # one draft's 8 rows 0.06: a sequence expected to add 0.3 tokens a round is not worth
    # its block, but is worth a draft of it
    from tandem.draft_cap import DraftCapPolicy

    a = AdaptiveSpec(7, whole_blocks=True)
    cost = measured(((8, 24.0), (16, 25.5), (32, 34.0), (64, 62.0)))
    assert cost.block_break_even(7, 8) > 1.0 and cost.block_break_even(1, 8) < 0.1
    seqs = []
    for alpha in [0.3] * 7 + [0.03]:  # 0.3 more tokens for one draft; 0.03: hopeless
        st = a.new_state()
        st.passed = alpha * st.judged
        seqs.append(type("S", (), {"spec": st, "output_ids": [0] * 10, "finished": False})())
    sched = type("Sched", (), {"running": seqs, "row_budget": 256, "max_batch": 64})()
    DraftCapPolicy(a, cost, sched, enabled=True).cap()
    assert [a.allowed(s.spec, 10) for s in seqs] == [True] * 7 + [False]


def test_a_propose_is_priced_by_the_sequences_its_model_drafted_for():
    # DFlash copying first on 2 CPU cores: a propose the model ran for 8 sequences took
    # 26 ms, one for 1 sequence 6.5 ms, one where every sequence copied 0.2 ms. Priced by
    # the cheapest propose seen, drafting at batch 8 looked free.
    cost = measured(((8, 28.0), (16, 30.0), (32, 45.0), (64, 80.0)))
    for _ in range(3):
        cost.record_propose(7, 26.0, proposing=8)
        cost.record_propose(7, 6.5, proposing=1)
        cost.record_propose(7, 0.2, proposing=8, copied=8)  # no sample: the lookups' cost says nothing of the model's
    assert cost.propose_ms_per_step(8) == 26.0 and cost.propose_ms_per_step(1) == 6.5
    assert cost.propose_ms_per_step(4) == 6.5  # unmeasured: the nearest smaller bucket's, so it gets tried
    assert cost.best_cap([7] * 8, [0.6] * 8, (0, 1, 3, 7)) == 0  # one draft each: 12.8 tokens for ~55 ms against 8 for 28
    for _ in range(20):
        cost.record_propose(7, 0.2, proposing=8, copied=8)  # lately every sequence copies: drafting is cheap
    assert cost.modelled_share < 0.01
    assert cost.best_cap([7] * 8, [0.6] * 8, (0, 1, 3, 7)) > 0


def test_rows_past_the_measured_forwards_cost_half_the_last_steps_rows_at_least():
    # SmolLM2 int4 on 2 CPU cores, measured at batch 1: 4 rows 17 ms, 8 rows 29. Batch 8
    # then priced 16 rows at 29 ms (the largest measured bucket's), tried one draft each and
    # paid 43 ms a tick for what plain decoding did in 27.
    cpu = measured(((1, 15.0), (2, 16.0), (4, 17.0), (8, 29.0)), propose_ms=5.0)  # batch 8's propose not yet timed
    assert cpu.estimate(16) == 29.0 + 0.5 * 3.0 * 8  # 41
    assert cpu.best_cap([7] * 8, [0.6] * 8, (0, 1, 3, 7)) == 0
    # a GPU's flat table stays nearly flat past it: drafting at batch 8 is still tried
    gpu = measured(((1, 3.5), (2, 3.6), (4, 3.7), (8, 3.9)), propose_ms=0.8)
    assert gpu.estimate(64) < 1.5 * gpu.estimate(8)
    assert gpu.best_cap([7] * 8, [0.6] * 8, (0, 1, 3, 7)) > 0
