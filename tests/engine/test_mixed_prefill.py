"""Mixed prefill: while sequences run, the prompt chunks of new requests ride on their
verify forward (VerifyBatch.prefill). A burst arriving mid-stream must change no output
(greedy, every drafter, the prefix cache, preemption), must really ride, and a refused
ride must leave the running batch unharmed."""
from __future__ import annotations

from dataclasses import replace

import pytest

from bursts import burst_midstream
from tandem.errors import ShapeError
from tandem.sampling_params import SamplingParams

from .prompts import PARAGRAPH, prompts
from .test_paged_kv import _engine, _pool_group

GREEDY = SamplingParams(max_tokens=12)
LONG = f"Read this twice. {PARAGRAPH} {PARAGRAPH} Now say it again:"  # several 32-token chunks


class VerifySpy:
    """Counts the verify commands of a real group and the chunks that rode on them."""

    def __init__(self, group, monkeypatch, refuse_riders: bool = False):
        self.verifies = self.riders = self.refused = 0
        real = group.verify

        def verify(cmd):
            self.verifies += 1
            if cmd.prefill and refuse_riders:
                self.refused += 1
                raise ShapeError("injected", "riders refused by the test")
            self.riders += len(cmd.prefill)
            return real(cmd)

        monkeypatch.setattr(group, "verify", verify)


FIRST, BURST = prompts(3)[:2], [LONG, *prompts(6)[2:]]


@pytest.fixture(scope="module")
def want(make_engine):
    """Target-only greedy output of every prompt, all prefilled in the first tick: no riders."""
    engine = make_engine("none", mixed_prefill=False)
    return [o.token_ids for o in engine.generate(FIRST + BURST, GREEDY)]


@pytest.mark.parametrize("drafter", ["ngram", "draft-model"])
def test_a_burst_riding_on_running_verifies_changes_no_output(drafter, make_engine, local_group, weak_draft_group,
                                                             truncated_draft_dir, want, monkeypatch):
    options = {"group": weak_draft_group, "draft_model": truncated_draft_dir} if drafter == "draft-model" else {}
    engine = make_engine(drafter, max_prefill_tokens=32, adaptive=False, **options)
    spy = VerifySpy(engine.group, monkeypatch)
    assert burst_midstream(engine, FIRST, BURST, GREEDY) == want
    # the long prompt alone needs several 32-token chunks, each riding on a verify
    assert spy.riders >= len(BURST) + 2


def test_with_mixed_prefill_off_no_chunk_rides_and_outputs_are_the_same(make_engine, want, monkeypatch):
    engine = make_engine("ngram", max_prefill_tokens=32, mixed_prefill=False)
    spy = VerifySpy(engine.group, monkeypatch)
    assert burst_midstream(engine, FIRST, BURST, GREEDY) == want
    assert spy.verifies > 0 and spy.riders == 0


def test_by_default_chunks_ride_only_where_the_target_runs_eagerly(make_engine, want, monkeypatch):
    engine = make_engine("ngram", max_prefill_tokens=32)
    assert engine.config.mixed_prefill is None and not engine.group.limits.graphed
    # a rank replaying CUDA graphs: a riding forward would run eagerly, so chunks go apart
    monkeypatch.setattr(engine.group, "limits", replace(engine.group.limits, graphed=True))
    spy = VerifySpy(engine.group, monkeypatch)
    assert burst_midstream(engine, FIRST, BURST, GREEDY) == want
    assert spy.verifies > 0 and spy.riders == 0


def test_a_refused_ride_leaves_the_running_batch_unharmed_and_the_chunks_prefill_apart(make_engine, want, monkeypatch):
    engine = make_engine("ngram", max_prefill_tokens=32)
    spy = VerifySpy(engine.group, monkeypatch, refuse_riders=True)
    assert burst_midstream(engine, FIRST, BURST, GREEDY) == want
    assert spy.refused >= 2 and spy.riders == 0  # each refusal: the batch alone, then a prefill of its own


def test_riders_that_hit_the_prefix_cache_change_no_output(make_engine, monkeypatch):
    shared = [f"{LONG} Question {i}: name a colour." for i in range(3)]
    engine = make_engine("none", enable_prefix_caching=False, mixed_prefill=False)
    uncached = [o.token_ids for o in engine.generate(shared, GREEDY)]
    engine = make_engine("ngram", max_prefill_tokens=32)
    spy = VerifySpy(engine.group, monkeypatch)
    hits = engine.metrics.prefix_cache_hits._value.get()
    assert burst_midstream(engine, shared[:1], shared[1:], GREEDY) == uncached
    assert engine.metrics.prefix_cache_hits._value.get() - hits >= 2 * 32  # the later two found LONG's blocks
    assert spy.riders > 0


def test_riders_under_preemption_change_no_output(default_model, want, monkeypatch):
    engine = _engine(default_model, _pool_group(default_model, 12), max_prefill_tokens=32)  # 192 positions
    spy = VerifySpy(engine.group, monkeypatch)
    assert burst_midstream(engine, FIRST, BURST, GREEDY) == want
    assert engine.scheduler.num_preemptions > 0 and spy.riders > 0
