"""Requests sent while a tick runs are taken at once (into the inbox), not after it: a
server thread must never wait a whole tick (or several, the tick lock being unfair) to
hand a request in, and the next tick admits every request that arrived."""
from __future__ import annotations

import threading

from tandem.sampling_params import SamplingParams


class GatedGroup:
    """A real group whose verify waits until the test opens the gate: a tick in progress."""

    def __init__(self, inner):
        self.inner, self.limits = inner, inner.limits
        self.entered, self.gate = threading.Event(), threading.Event()

    def verify(self, cmd):
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        return self.inner.verify(cmd)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_add_request_does_not_wait_for_the_running_tick(make_engine, local_group):
    group = GatedGroup(local_group)
    engine = make_engine("none", group=group)
    params = SamplingParams(max_tokens=3, temperature=0.0)
    first = engine.add_request("The capital of France is", params)
    engine.step()  # its admission tick: the prefill hands out the first token, no verify yet
    ticker = threading.Thread(target=engine.step)
    ticker.start()
    try:
        assert group.entered.wait(30), "the tick never reached its verify"
        added = []
        adder = threading.Thread(target=lambda: added.extend(
            engine.add_request(p, params) for p in ("One, two, three,", "Roses are red,")))
        adder.start()
        adder.join(5)
        assert not adder.is_alive(), "add_request waited for the tick in progress"
        assert len(added) == 2 and engine.has_unfinished()
    finally:
        group.gate.set()
        ticker.join(30)
    outs = {}
    while engine.has_unfinished():
        outs.update((o.request_id, o) for o in engine.step() if o.finished)
    assert set(outs) == {first, *added}
    assert all(o.finish_reason == "length" and len(o.token_ids) == 3 for o in outs.values())


def test_a_new_requests_first_token_comes_out_of_its_prefill_tick(make_engine, local_group):
    engine = make_engine("ngram", group=local_group)
    rid = engine.add_request("The capital of France is", SamplingParams(max_tokens=8, temperature=0.0))
    outs = [o for o in engine.step() if o.request_id == rid]
    assert [len(o.token_ids) for o in outs] == [1]  # before any verify of it ran


def test_arrivals_every_tick_do_not_starve_running_sequences(make_engine, local_group):
    # Every tick admits someone (one-token requests, finished by their prefill); the
    # admission-only ticks alternate with verify ticks, so the long request still advances.
    engine = make_engine("none", group=local_group)
    long_id = engine.add_request("Once upon a time", SamplingParams(max_tokens=6, temperature=0.0))
    done = {}
    for i in range(12):
        engine.add_request(f"Count: {i}", SamplingParams(max_tokens=1, temperature=0.0))
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    assert long_id in done and len(done[long_id].token_ids) == 6


def test_an_arrival_at_an_idle_engine_gets_a_prefill_tick_of_its_own(make_engine, local_group):
    # The last tick only admitted (a one-token request, done at its prefill), and then the
    # engine stood idle: the rule that keeps two admission ticks apart protects running
    # sequences, and none run, so the new request's first token still comes from its prefill.
    engine = make_engine("none", group=local_group)
    engine.add_request("Count: 1", SamplingParams(max_tokens=1, temperature=0.0))
    assert [o.finished for o in engine.step()] == [True]
    rid = engine.add_request("The capital of France is", SamplingParams(max_tokens=8, temperature=0.0))
    outs = [o for o in engine.step() if o.request_id == rid]
    assert [len(o.token_ids) for o in outs] == [1]


def test_with_emit_a_first_token_leaves_before_the_verify_it_shares_a_tick_with(make_engine, local_group):
    # B arrives right after A's admission tick, so B's prefill and the verify of A and B
    # share one tick; with a way out mid-tick (emit, as the scheduler actor runs the
    # engine) B's first token goes before that verify, not after it. (Prefill ticks of their
    # own: with mixed prefill B's prompt rides on that verify, the next test.)
    emitted = []
    engine = make_engine("none", group=local_group, sink=emitted.extend, mixed_prefill=False)
    params = SamplingParams(max_tokens=6, temperature=0.0)
    a = engine.add_request("Once upon a time", params)
    engine.step()  # A's admission tick: it verifies A too (with a sink no tick only admits)
    assert [(o.request_id, len(o.token_ids)) for o in emitted] == [(a, 1)]
    b = engine.add_request("The capital of France is", params)
    returned = engine.step()
    assert [(o.request_id, len(o.token_ids)) for o in emitted] == [(a, 1), (b, 1)]
    assert {o.request_id: len(o.token_ids) for o in returned} == {a: 3, b: 2}  # each one more, from the verify
    outs = emitted + returned
    while engine.has_unfinished():
        outs += engine.step()
    reference = make_engine("none", group=local_group).generate(["The capital of France is"], params)[0]
    assert [t for o in outs if o.request_id == b for t in o.delta_token_ids] == reference.token_ids


def test_with_mixed_prefill_a_first_token_comes_from_the_verify_its_prompt_rode_on(make_engine, local_group):
    # B's prompt rides on A's verify: one forward gives A its next token and B its first,
    # and both leave with that tick's outputs
    emitted = []
    engine = make_engine("none", group=local_group, sink=emitted.extend, mixed_prefill=True)
    params = SamplingParams(max_tokens=6, temperature=0.0)
    a = engine.add_request("Once upon a time", params)
    engine.step()  # A's admission tick, which verifies A too
    assert [(o.request_id, len(o.token_ids)) for o in emitted] == [(a, 1)]
    b = engine.add_request("The capital of France is", params)
    returned = engine.step()
    assert len(emitted) == 1  # B's first token is not sent ahead: it comes from the verify
    assert {o.request_id: len(o.token_ids) for o in returned} == {a: 3, b: 1}
    outs = list(returned)
    while engine.has_unfinished():
        outs += engine.step()
    reference = make_engine("none", group=local_group).generate(["The capital of France is"], params)[0]
    assert [t for o in outs if o.request_id == b for t in o.delta_token_ids] == reference.token_ids
