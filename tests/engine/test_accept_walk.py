"""The accept walk and the emit that follows it (the seed's table and its edges)."""
from __future__ import annotations

import pytest

from tandem.adaptive import AdaptiveSpec, BatchCostModel
from tandem.clock import ManualClock
from tandem.metrics import EngineMetrics
from tandem.sampling_params import SamplingParams
from tandem.sequence import Sequence
from tandem.verify.accept import accepted_prefix, accepted_sampled
from tandem.verify.step import StepContext, emit


@pytest.mark.parametrize(
    "drafts, picks, expected",
    [
        ([5, 6, 7], [5, 6, 7, 8], 3),  # all accepted, bonus 8
        ([5, 9, 7], [5, 6, 7, 8], 1),  # first mismatch at 1
        ([9, 6, 7], [5, 6, 7, 8], 0),  # all rejected
        ([5, 6, 7], [5, 6, 7], 2),  # the last draft needs a bonus row
        ([], [5], 0),  # no drafts: plain decode
        ([1, 2], [3, 4, 5], 0),
    ],
)
def test_the_prefix_stops_at_the_first_mismatch_and_needs_a_bonus_row(drafts, picks, expected):
    assert accepted_prefix(drafts, picks) == expected


def test_sampled_walk_accepts_certain_drafts_and_rejects_impossible_ones():
    picks = [1, 2, 3, 4]
    assert accepted_sampled([1, 2, 3], picks, [1.0, 1.0, 1.0, 0.0], seed=7, start_pos=10) == 3
    assert accepted_sampled([1, 2, 3], picks, [1.0, 0.0, 1.0, 0.0], seed=7, start_pos=10) == 1
    assert accepted_sampled([1, 2, 3], picks, [0.0, 1.0, 1.0, 0.0], seed=7, start_pos=10) == 0


class _Detok:
    def text(self, ids):
        return "".join(chr(97 + (i % 26)) for i in ids)


def _ctx():
    return StepContext(
        group=None, drafter=None, adaptive=AdaptiveSpec(4), cost=BatchCostModel(),
        metrics=EngineMetrics(), clock=ManualClock(), detok=_Detok(),
    )


def _seq(params: SamplingParams, eos=(99,)):
    return Sequence(request_id="r", prompt=None, prompt_ids=[1, 2, 3], params=params, seed=0,
                    eos_ids=frozenset(eos), max_model_len=100, arrival=0.0)


def test_emit_gives_accepted_drafts_then_the_bonus():
    s = _seq(SamplingParams(max_tokens=10))
    emit(s, [5, 6, 7], [5, 6, 8, 9], 2, _ctx())
    assert s.output_ids == [5, 6, 8]
    assert (s.stats.num_drafts, s.stats.num_draft_tokens, s.stats.num_accepted_tokens) == (1, 3, 2)


def test_emit_stops_mid_run_at_eos_and_emits_nothing_past_it():
    s = _seq(SamplingParams(max_tokens=10))
    emit(s, [5, 99, 7], [5, 99, 7, 8], 3, _ctx())
    assert s.output_ids == [5, 99]
    assert s.finish_reason.value == "stop"


def test_emit_stops_at_max_tokens_inside_the_accepted_run():
    s = _seq(SamplingParams(max_tokens=2))
    emit(s, [5, 6, 7], [5, 6, 7, 8], 3, _ctx())
    assert s.output_ids == [5, 6]
    assert s.finish_reason.value == "length"


def test_emit_stops_at_a_stop_string_and_cuts_the_text():
    s = _seq(SamplingParams(max_tokens=10, stop=("c",)))  # token 2 decodes as "c"
    emit(s, [0, 2, 3], [0, 2, 3, 4], 3, _ctx())
    assert s.output_ids == [0, 2]
    assert s.output_text(_Detok()) == "a"


def test_emit_ignores_eos_when_asked():
    s = _seq(SamplingParams(max_tokens=10, ignore_eos=True))
    emit(s, [99, 5], [99, 5, 6], 2, _ctx())
    assert s.output_ids == [99, 5, 6] and not s.finished


def test_a_stream_holds_back_text_that_may_begin_a_stop_string():
    from tandem.due_outputs import stop_prefix_len as _stop_prefix_len

    assert _stop_prefix_len("hello wor", ("world!",)) == 3
    assert _stop_prefix_len("hello", ("world!",)) == 0
    assert _stop_prefix_len("a\n\n", ("\n\nEND", "x")) == 2
