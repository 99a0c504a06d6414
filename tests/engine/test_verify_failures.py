"""The verify step's failure branches, one row each, against a fake group: what happens
to the batch, what the group is sent, and whether the drafts come back for a retry."""
from __future__ import annotations

import pytest

from tandem.adaptive import AdaptiveSpec, BatchCostModel
from tandem.clock import ManualClock
from tandem.errors import ShapeError, ShardError
from tandem.metrics import EngineMetrics
from tandem.sampling_params import SamplingParams
from tandem.sequence import Sequence
from tandem.shard.commands import VerifyResult
from tandem.verify.step import StepContext, verify_step


class FakeGroup:
    """verify() raises `error`, or returns a result with `rows` picks (default: every row)."""

    def __init__(self, error: Exception | None = None, rows: int | None = None):
        self.error, self.rows, self.commits = error, rows, []

    def verify(self, cmd):
        if self.error is not None:
            raise self.error
        rows = cmd.n * cmd.k if self.rows is None else self.rows
        return VerifyResult(batch_id=cmd.batch_id, picks=[7] * rows, accept_probs=[1.0] * rows)

    def commit(self, verdict):
        self.commits.append(verdict)


class _Detok:
    def text(self, ids):
        return "".join(chr(97 + (i % 26)) for i in ids)


def context(group, max_verify_failures: int = 3) -> StepContext:
    return StepContext(group=group, drafter=None, adaptive=AdaptiveSpec(4), cost=BatchCostModel(),
                       metrics=EngineMetrics(), clock=ManualClock(), detok=_Detok(),
                       max_verify_failures=max_verify_failures)


def batch(n: int = 2) -> list[Sequence]:
    seqs = []
    for i in range(n):
        s = Sequence(request_id=f"r{i}", prompt=None, prompt_ids=[1, 2, 3], params=SamplingParams(max_tokens=20),
                     seed=0, eos_ids=frozenset(), max_model_len=100, arrival=0.0, slot=i)
        s.output_ids = [4]
        s.drafts = [5, 6]
        seqs.append(s)
    return seqs


ROWS = [
    # (name, group, finished with an error whose text has..., drafts kept, failed verdicts sent)
    ("a shape the group refuses", FakeGroup(ShapeError("n<=num_slots", "too many")), "verify batch refused", False, 0),
    ("a rank that advanced and failed", FakeGroup(ShardError("rank 1 lost", state_advanced=True)), "verify failed: rank 1 lost", False, 0),
    ("a forward that advanced nothing", FakeGroup(ShardError("oom", state_advanced=False)), None, True, 0),
    ("a short result", FakeGroup(rows=3), "verify short result: 3 picks for 6 rows", False, 1),
]


@pytest.mark.parametrize("name, group, error, drafts_kept, failed_verdicts", ROWS, ids=[r[0] for r in ROWS])
def test_a_failure_branch(name, group, error, drafts_kept, failed_verdicts):
    seqs = batch()
    committed = []
    ctx = context(group)
    ctx.on_committed = lambda batch_id, b: committed.append(batch_id)
    verify_step(seqs, ctx)
    assert not committed, "no verdict of a failed verify waits for acknowledgements"
    assert [v.failed for v in group.commits] == [True] * failed_verdicts
    for s in seqs:
        assert s.output_ids == [4], "a failed verify emits nothing"
        if error is None:
            assert not s.finished and s.verify_failures == 1
        else:
            assert s.finish_reason.value == "error" and error in s.error
        assert s.drafts == ([5, 6] if drafts_kept else [])


def test_tries_that_reach_max_verify_failures_finish_the_batch():
    seqs = batch()
    ctx = context(FakeGroup(ShardError("oom", state_advanced=False)), max_verify_failures=3)
    for _ in range(2):
        verify_step(seqs, ctx)
        assert not any(s.finished for s in seqs) and seqs[0].drafts == [5, 6]
    verify_step(seqs, ctx)
    assert all(s.finish_reason.value == "error" and "verify failed 3 times in a row: oom" in s.error for s in seqs)


def test_a_verify_that_succeeds_commits_and_reports_its_batch():
    seqs = batch()
    group = FakeGroup()
    committed = []
    ctx = context(group)
    ctx.on_committed = lambda batch_id, b: committed.append((batch_id, b))
    verify_step(seqs, ctx)
    assert [v.failed for v in group.commits] == [False] and committed == [(group.commits[0].batch_id, seqs)]
    assert all(s.output_ids == [4, 7] and s.verify_failures == 0 for s in seqs)
