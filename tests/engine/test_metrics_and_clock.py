"""Telemetry under vLLM's names, timed by a clock the test drives."""
from __future__ import annotations

import logging

from prometheus_client import generate_latest

from tandem.clock import ManualClock
from tandem.sampling_params import SamplingParams

from .prompts import PROMPTS


class SlowGroup:
    """A real group whose verify 'takes' exactly 25 ms of the manual clock."""

    def __init__(self, inner, clock):
        self.inner, self.clock, self.limits = inner, clock, inner.limits

    def verify(self, cmd):
        self.clock.advance(0.025)
        return self.inner.verify(cmd)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _sample(engine, name, labels=None):
    return engine.metrics.registry.get_sample_value(name, labels or {})


def test_spec_decode_counters_match_the_outputs_and_time_comes_from_the_clock(make_engine, local_group, default_model, caplog):
    from tandem.config import EngineConfig
    from tandem.engine import Engine

    clock = ManualClock(100.0)
    engine = Engine(
        SlowGroup(local_group, clock), default_model.tokenizer, default_model.eos_token_ids,
        EngineConfig(drafter="ngram", max_num_seqs=20, max_model_len=512, row_budget=128, adaptive=False), clock=clock,
    )
    with caplog.at_level(logging.INFO, logger="tandem.verify"):
        outs = engine.generate([PROMPTS[0], PROMPTS[6]], SamplingParams(max_tokens=24))
    drafts = sum(o.num_drafts for o in outs)
    draft_tokens = sum(o.num_draft_tokens for o in outs)
    accepted = sum(o.num_accepted_tokens for o in outs)
    assert drafts > 0 and accepted > 0
    assert _sample(engine, "tandem:spec_decode_num_drafts_total") == drafts
    assert _sample(engine, "tandem:spec_decode_num_draft_tokens_total") == draft_tokens
    assert _sample(engine, "tandem:spec_decode_num_accepted_tokens_total") == accepted
    per_pos = sum(
        _sample(engine, "tandem:spec_decode_num_accepted_tokens_per_pos_total", {"position": str(p)}) or 0 for p in range(16)
    )
    assert per_pos == accepted
    # every verify forward took 25 ms on the driven clock
    n_verify = _sample(engine, "tandem:verify_ms_count")
    assert n_verify > 0 and abs(_sample(engine, "tandem:verify_ms_sum") - 25.0 * n_verify) < 1e-6
    assert b"tandem:spec_decode_num_drafts_total" in generate_latest(engine.metrics.registry)
    # the seed's per-batch log line
    lines = [r.getMessage() for r in caplog.records if "BATCHED verify" in r.getMessage()]
    assert lines and "verify=25.0ms" in lines[0] and "n=" in lines[0] and "accepted=" in lines[0]


def test_request_latencies_are_histograms_on_the_engine_clock(make_engine, local_group, default_model):
    from tandem.config import EngineConfig
    from tandem.engine import Engine

    clock = ManualClock(100.0)
    engine = Engine(
        SlowGroup(local_group, clock), default_model.tokenizer, default_model.eos_token_ids,
        EngineConfig(drafter="none", max_num_seqs=20, max_model_len=512, row_budget=128), clock=clock,
    )
    first = engine.add_request(PROMPTS[1], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    clock.advance(0.5)  # the second waits half a second longer before anything runs
    engine.add_request(PROMPTS[2], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    aborted = engine.add_request(PROMPTS[3], SamplingParams(max_tokens=5, temperature=0.0))
    engine.abort(aborted)
    while engine.has_unfinished():
        engine.step()
    assert first not in engine.requests
    # prefills take no time on this clock: both wait (0.5 s and 0) only until their prefill
    assert _sample(engine, "tandem:request_queue_time_seconds_count") == 2
    assert abs(_sample(engine, "tandem:request_queue_time_seconds_sum") - 0.5) < 1e-9
    assert _sample(engine, "tandem:time_to_first_token_seconds_sum") == _sample(engine, "tandem:request_queue_time_seconds_sum")
    # 4 tokens after the first, one 25 ms verify each (no drafter): 25 ms a token
    assert _sample(engine, "tandem:request_time_per_output_token_seconds_count") == 2
    assert abs(_sample(engine, "tandem:request_time_per_output_token_seconds_sum") - 2 * 0.025) < 1e-9
    # the aborted request counts in no latency
    assert _sample(engine, "tandem:e2e_request_latency_seconds_count") == 2
    assert abs(_sample(engine, "tandem:e2e_request_latency_seconds_sum") - (0.5 + 2 * 4 * 0.025)) < 1e-9
