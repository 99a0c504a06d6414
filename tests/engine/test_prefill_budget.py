"""The stall bound on a tick's prefill (tandem.prefill_budget), priced by measured costs."""
from __future__ import annotations

from tandem.adaptive import BatchCostModel
from tandem.prefill_budget import stall_budget


def _measured(verify_ms: float, prefill_ms_per_row: float) -> BatchCostModel:
    cost = BatchCostModel()
    cost.record_forward(32, verify_ms)
    cost.record_prefill(512, 512 * prefill_ms_per_row)
    return cost


def test_the_budget_is_stall_times_the_verify_in_prefill_rows():
    cost = _measured(verify_ms=10.0, prefill_ms_per_row=0.05)
    assert stall_budget(cost, 32, 1.5, row_budget=512) == 300  # 15 ms of prefill at 0.05 ms a row
    assert stall_budget(cost, 32, 3.0, row_budget=512) == 600 - 600 % 512  # whole forwards past one


def test_no_bound_without_a_stall_a_running_batch_or_a_measured_cost():
    cost = _measured(verify_ms=10.0, prefill_ms_per_row=0.05)
    assert stall_budget(cost, 32, 0.0, row_budget=512) is None
    assert stall_budget(cost, 0, 1.5, row_budget=512) is None
    assert stall_budget(BatchCostModel(), 32, 1.5, row_budget=512) is None
    only_verify = BatchCostModel()
    only_verify.record_forward(32, 10.0)
    assert stall_budget(only_verify, 32, 1.5, row_budget=512) is None


def test_a_tiny_budget_is_still_one_token():
    cost = _measured(verify_ms=1.0, prefill_ms_per_row=10.0)
    assert stall_budget(cost, 1, 1.0, row_budget=512) == 1
