"""One in-process rank whose forward is queued (a GPU: ModelShard.forward_is_async) and an
engine with a sink, as the scheduler actor runs it: a tick's outputs are held, then built
and sent from inside the next verify, once its forward is queued and before its picks are
read. What that must keep: every token in order and the text the settled engine makes
(stop strings included), and a sink that raises harms no verify.

On a CPU the forward is done when verify_begin returns; the rank says it is queued here so
that the ordering runs where CI does (the ordering is the point, not the overlap's speed)."""
from __future__ import annotations

import pytest

from tandem.sampling_params import SamplingParams
from tandem.shard.model_shard import ModelShard

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at"]


@pytest.fixture
def queued_forward(monkeypatch, local_group):
    """The rank reports a queued forward; `state["queued"]` is True between a verify's
    begin and the read of its picks."""
    monkeypatch.setattr(ModelShard, "forward_is_async", property(lambda self: True))
    state = {"queued": False}
    begin = local_group.shard.verify_begin

    def noting_begin(cmd, checked=False):
        result = begin(cmd, checked)
        state["queued"] = True

        def read():
            state["queued"] = False
            return result()

        return read

    monkeypatch.setattr(local_group.shard, "verify_begin", noting_begin)
    return state


def by_request(outs: list) -> dict[str, list]:
    got: dict[str, list] = {}
    for o in outs:
        got.setdefault(o.request_id, []).append(o)
    return got


def run(engine, params, timeline: list) -> list[str]:
    """Stepped to the end; `timeline` (which the sink extends too) gets step()'s outputs
    as they leave."""
    ids = [engine.add_request(p, sp) for p, sp in zip(PROMPTS, params)]
    while engine.has_unfinished():
        timeline.extend(engine.step())
    return ids


def test_held_outputs_leave_while_the_next_forward_is_queued_with_the_settled_text(make_engine, local_group,
                                                                                   queued_forward):
    plain = [SamplingParams(max_tokens=n) for n in (16, 8, 12)]
    reference = make_engine("ngram").generate(PROMPTS, plain)
    stop = reference[0].text[len(reference[0].text) // 2:][:6]  # cut the first request half way
    assert stop.strip(), reference[0].text
    params = [SamplingParams(max_tokens=16, stop=[stop]), plain[1], plain[2]]
    expected = make_engine("ngram").generate(PROMPTS, params)  # no sink: settled at each tick's end
    assert expected[0].finish_reason == "stop"

    timeline, inside = [], []

    def sink(outs):
        # held outputs leave inside a queued forward; a prefill's first tokens at once
        first_tokens = all(o.delta_token_ids == o.token_ids for o in outs)
        inside.append(queued_forward["queued"] or first_tokens)
        timeline.extend(outs)

    engine = make_engine("ngram", sink=sink)
    ids = run(engine, params, timeline)
    assert len(inside) > 3 and all(inside), "the held outputs left outside a queued forward"
    assert sum(o.num_drafts for o in expected) > 0
    outs = by_request(timeline)
    for rid, want in zip(ids, expected):
        got = outs[rid]
        assert [o.finished for o in got] == [False] * (len(got) - 1) + [True]
        assert [t for o in got for t in o.delta_token_ids] == got[-1].token_ids == want.token_ids
        assert "".join(o.delta_text for o in got) == got[-1].text == want.text
        assert got[-1].finish_reason == want.finish_reason


def test_a_sink_that_raises_harms_no_verify(make_engine, local_group, queued_forward):
    params = [SamplingParams(max_tokens=8)] * len(PROMPTS)
    expected = make_engine("ngram").generate(PROMPTS, params)
    timeline, calls = [], [0]

    def broken_sink(outs):  # gets the outputs, then fails (a consumer that went away)
        calls[0] += 1
        timeline.extend(outs)
        raise RuntimeError("the consumer is gone")

    engine = make_engine("ngram", sink=broken_sink)
    ids = run(engine, params, timeline)
    assert calls[0] > 2, "the sink was never reached from inside a verify"
    final = {o.request_id: o for o in timeline if o.finished}
    assert [final[rid].token_ids for rid in ids] == [o.token_ids for o in expected]
    assert local_group.shard.pending is None, "a verify was left without its verdict"
