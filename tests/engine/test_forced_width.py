"""The grammar's forced tokens join the drafts only as far as their rows pay: a sequence
whose forced tokens would pad its whole batch keeps fewer of them."""
from __future__ import annotations

from tandem.batching import plan_cost
from tandem.verify.forced import forced_width


def cpu_like(rows: int) -> float:
    """A forward whose rows cost (a CPU at batch 8): 60 ms, and 2.5 ms a row."""
    return 60.0 + 2.5 * rows


def plan(counts):
    return plan_cost(counts, row_budget=256, max_batch=16, cost=cpu_like)


def test_one_long_forced_run_does_not_pad_a_batch_of_eight():
    # seven sequences draft 3, one has 3 drafts and 8 forced tokens: padding all to 11
    # costs 8 * 8 rows for at most 8 sure tokens of one sequence
    drafts, forced = [3] * 8, [0] * 7 + [8]
    width = forced_width(drafts, forced, [0.6] * 8, plan)
    assert width == 3


def test_forced_tokens_that_every_sequence_has_are_kept():
    drafts, forced = [2] * 8, [4] * 8
    assert forced_width(drafts, forced, [0.9] * 8, plan) == 6


def test_alone_every_forced_token_is_kept_and_without_a_cost_model_too():
    assert forced_width([2], [9], [0.5], plan) == 11
    assert forced_width([3] * 8, [0] * 7 + [8], [0.6] * 8, None) is None
    assert forced_width([3, 3], [0, 0], [0.6, 0.6], plan) is None  # nothing forced
