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


def test_nothing_measured_means_full_speculation():
    assert BatchCostModel().best_cap([4], [0.5], (0, 1, 2, 4)) == 4
