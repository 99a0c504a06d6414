"""Engine.add_requests: a burst handed in together is prefilled together, and a bad
request in it is refused alone."""
from __future__ import annotations

import threading

from tandem.errors import EngineUnavailableError, InvalidRequestError
from tandem.intake import Request
from tandem.sampling_params import SamplingParams

from .prompts import PROMPTS
from .test_admission_during_a_tick import GatedGroup


def test_a_bad_request_in_a_batch_is_refused_alone(make_engine):
    engine = make_engine("ngram")
    params = SamplingParams(max_tokens=5, temperature=0.0)
    admissions = engine.add_requests([
        Request(PROMPTS[0], params, "a"),
        Request("", params, "empty"),
        Request(PROMPTS[1], "not params", "mistyped"),
        Request(PROMPTS[2], params, "a"),  # the id of the first, in the same batch
        Request(PROMPTS[3]),
    ])
    results = [a.request_id if a.taken else a.error for a in admissions]
    assert results[0] == "a"
    assert isinstance(results[1], InvalidRequestError) and results[1].field == "prompt"
    assert isinstance(results[2], InvalidRequestError) and results[2].field == "params"
    assert isinstance(results[3], InvalidRequestError) and results[3].field == "request_id"
    assert isinstance(results[4], str)
    done = {}
    while engine.has_unfinished():
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    assert set(done) == {"a", results[4]}
    alone = engine.generate([PROMPTS[0]], params)[0]
    assert done["a"].token_ids == alone.token_ids


def test_a_batch_sent_during_a_tick_is_admitted_by_one_tick(make_engine, local_group):
    group = GatedGroup(local_group)
    engine = make_engine("none", group=group)
    params = SamplingParams(max_tokens=3, temperature=0.0)
    engine.add_request(PROMPTS[0], params)
    engine.step()  # its prefill; the next tick verifies it, and waits at the gate
    ticker = threading.Thread(target=engine.step)
    ticker.start()
    try:
        assert group.entered.wait(30), "the tick never reached its verify"
        admissions = engine.add_requests([Request(p, params) for p in PROMPTS[1:5]])
        ids = [a.request_id for a in admissions]
        assert all(isinstance(i, str) for i in ids)
    finally:
        group.gate.set()
        ticker.join(30)
    firsts = {o.request_id: o for o in engine.step() if o.request_id in ids}
    assert set(firsts) == set(ids)  # all four had their first token from the same tick
    assert all(len(o.token_ids) == 1 for o in firsts.values())


def test_a_recovering_engine_refuses_every_request_of_a_batch(make_engine):
    engine = make_engine("none")
    engine.intake.recovering = True
    try:
        results = [a.error for a in engine.add_requests([Request(PROMPTS[0]), Request(PROMPTS[1])])]
    finally:
        engine.intake.recovering = False
    assert len(results) == 2 and all(isinstance(r, EngineUnavailableError) for r in results)
    assert not engine.has_unfinished()


def test_a_batch_is_tokenized_as_each_prompt_alone(make_engine):
    engine = make_engine("none")
    mixed = [PROMPTS[0], [1, 2, 3], PROMPTS[2], "", PROMPTS[5]]  # token ids and a bad one in between
    results = [a.request_id if a.taken else a.error for a in engine.add_requests([Request(p) for p in mixed])]
    for prompt, rid in zip(mixed, results):
        if isinstance(prompt, list):
            assert engine.requests[rid].prompt_ids == prompt
        elif prompt:
            assert engine.requests[rid].prompt_ids == engine.tokenizer(prompt).input_ids
        else:
            assert isinstance(rid, InvalidRequestError)
    for rid in results:
        if isinstance(rid, str):
            engine.abort(rid)
