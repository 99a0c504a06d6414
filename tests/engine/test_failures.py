"""Failure handling of the single in-process rank, as the seed: a forward error advances
nothing, the drafts are verified again next tick; after a few failures in a row the
batch is finished with an error; a short result finishes the batch at once."""
from __future__ import annotations

from dataclasses import replace

from tandem.errors import ShardError
from tandem.sampling_params import SamplingParams

from .prompts import PROMPTS


class FlakyGroup:
    """Wraps a real group; its verify fails (as a single rank would, before any state
    changes) or returns a short result while `mode` says so."""

    def __init__(self, inner):
        self.inner = inner
        self.limits = inner.limits
        self.mode = None  # None | "raise" | "short"
        self.failures_left = 0
        self.calls = 0

    def verify(self, cmd):
        self.calls += 1
        if self.mode and self.failures_left > 0:
            self.failures_left -= 1
            if self.mode == "raise":
                raise ShardError("injected forward error", state_advanced=False)
            res = self.inner.verify(cmd)
            return replace(res, picks=res.picks[:-1])
        return self.inner.verify(cmd)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def finish_all(engine, request_ids, ticks: int = 100) -> dict:
    """Step until these requests have finished (at most `ticks` ticks); their final outputs."""
    final = {}
    for _ in range(ticks):
        final.update({o.request_id: o for o in engine.step() if o.finished and o.request_id in request_ids})
        if len(final) == len(request_ids):
            break
    return final


def _run(engine, prompts, params):
    return engine.generate(prompts, params)


def test_a_failed_forward_is_retried_and_the_output_is_unchanged(make_engine, local_group):
    params = SamplingParams(max_tokens=16)
    reference = make_engine("ngram").generate([PROMPTS[0]], params)[0].token_ids
    flaky = FlakyGroup(local_group)
    engine = make_engine("ngram", group=flaky)
    rid = engine.add_request(PROMPTS[0], params)
    engine.step()  # prefill and the first verify
    flaky.mode, flaky.failures_left = "raise", 2
    final = None
    while final is None:
        final = next((o for o in engine.step() if o.request_id == rid and o.finished), None)
    assert final.finish_reason == "length"
    assert final.token_ids == reference
    assert flaky.failures_left == 0


def test_repeated_failures_finish_the_batch_with_an_error(make_engine, local_group):
    flaky = FlakyGroup(local_group)
    engine = make_engine("ngram", group=flaky, max_verify_failures=3)
    rid = engine.add_request(PROMPTS[1], SamplingParams(max_tokens=16))
    engine.step()
    flaky.mode, flaky.failures_left = "raise", 100
    outs = []
    for _ in range(5):
        outs += [o for o in engine.step() if o.request_id == rid]
        if outs and outs[-1].finished:
            break
    assert outs[-1].finish_reason == "error"
    assert "3 times in a row" in outs[-1].error and "injected forward error" in outs[-1].error
    assert flaky.failures_left == 97  # three tries, then the batch was finished
    assert not engine.has_unfinished()


def _victim_on(group, make_engine):
    """An engine on `group` with one request (the victim) added, and the token ids an
    undisturbed engine makes for the request added after it."""
    params = SamplingParams(max_tokens=12)
    engine = make_engine("ngram", group=group)
    reference = make_engine("ngram").generate([PROMPTS[4]], params)[0].token_ids
    return engine, engine.add_request(PROMPTS[1], params), reference, params


def test_a_short_result_finishes_only_its_batch(make_engine, local_group):
    flaky = FlakyGroup(local_group)
    engine, victim, reference, params = _victim_on(flaky, make_engine)
    engine.step()
    flaky.mode, flaky.failures_left = "short", 1
    final = {o.request_id: o for o in engine.step() if o.finished}  # the victim's batch gets the short result
    other = engine.add_request(PROMPTS[4], params)
    final.update(finish_all(engine, [other]))
    assert final[victim].finish_reason == "error" and "short result" in final[victim].error
    assert final[other].token_ids == reference


class UnacknowledgedGroup:
    """Wraps a real group; settle() reports the verdict of the next verified batch as not
    acknowledged by every rank (what a group whose rank died after the forward says)."""

    def __init__(self, inner):
        self.inner = inner
        self.limits = inner.limits
        self.armed = False
        self.lost: list[int] = []

    def verify(self, cmd):
        if self.armed:
            self.armed = False
            self.lost.append(cmd.batch_id)
        return self.inner.verify(cmd)

    def settle(self):
        lost, self.lost = self.lost, []
        return lost

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_verdict_no_rank_acknowledged_finishes_its_batch_before_any_of_its_outputs_leave(make_engine, local_group):
    group = UnacknowledgedGroup(local_group)
    engine, victim, reference, params = _victim_on(group, make_engine)
    first = [o for o in engine.step() if o.request_id == victim]  # the prefill tick: its first token
    group.armed = True
    outs = [o for o in engine.step() if o.request_id == victim]
    assert len(outs) == 1 and outs[0].finished and outs[0].finish_reason == "error"
    assert "not acknowledged by every rank" in outs[0].error
    # the tick's tokens never went out as a success: the client saw the prefill token, then the error
    assert len(first) == 1 and not first[0].finished
    other = engine.add_request(PROMPTS[4], params)
    final = finish_all(engine, [other])[other]
    assert final.finish_reason == "length" and final.token_ids == reference
