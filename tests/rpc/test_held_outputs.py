"""An engine with a sink (as the scheduler actor runs it) over real gRPC: a tick's
outputs are held until the ranks acknowledge its verdicts, and leave through the sink from
inside the next tick's first command, while that command runs on the rank (a prefill's
first tokens leave as soon as it is done). What that
must keep: every token in order, the text the embedded engine makes (stop strings and
aborts included, the held outputs being built only then), and no token of a tick whose
verdict a rank never took handed out as a success."""
from __future__ import annotations

import pytest

from tandem.config import EngineConfig
from tandem.engine import Engine
from tandem.rpc.grpc_group import GrpcShardGroup
from tandem.sampling_params import SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at"]


def grpc_engine(default_model, launcher, config: EngineConfig, sink=None) -> Engine:
    group = GrpcShardGroup(config.shard_spec(), launcher, deadline_s=10)
    return Engine(group, default_model.tokenizer, default_model.eos_token_ids, config, sink=sink)


def run(make_engine, inside: list[bool]) -> tuple[Engine, list]:
    """An engine from make_engine(sink), stepped to the end; every output in the order it
    left, whether by the sink or by step()."""
    timeline = []

    def emit(outs):  # a prefill's first tokens leave at once, held outputs inside a command
        inside.append(busy[0] or all(o.delta_token_ids == o.token_ids for o in outs))
        timeline.extend(outs)

    busy = [False]
    engine = make_engine(emit)
    for name in ("verify", "prefill"):  # note when a command is waiting for its reply
        call = getattr(engine.group, name)

        def waiting(*args, _call=call):
            busy[0] = True
            try:
                return _call(*args)
            finally:
                busy[0] = False

        setattr(engine.group, name, waiting)
    while engine.has_unfinished():
        timeline.extend(engine.step())
    return engine, timeline


def by_request(timeline: list) -> dict[str, list]:
    outs: dict[str, list] = {}
    for o in timeline:
        outs.setdefault(o.request_id, []).append(o)
    return outs


@pytest.mark.timeout(300)
def test_held_outputs_leave_inside_the_next_tick_in_order_with_the_embedded_text(default_model, in_process_launcher):
    config = EngineConfig(drafter="ngram", max_num_seqs=4, max_model_len=128)
    params = [SamplingParams(max_tokens=n) for n in (24, 9, 16)]
    reference = Engine.from_config(config, progress=False).generate(PROMPTS, params)
    engines, ids = [], []

    def make_engine(sink):
        engine = grpc_engine(default_model, in_process_launcher, config, sink)
        engines.append(engine)
        ids.extend(engine.add_request(p, sp) for p, sp in zip(PROMPTS, params))
        return engine

    try:
        inside: list[bool] = []
        outs = by_request(run(make_engine, inside)[1])
    finally:
        engines[0].group.close()
    # all but the very last emit came while a later command waited on the rank
    assert len(inside) > 3 and all(inside[:-1])
    for rid, ref in zip(ids, reference):
        got = outs[rid]
        assert [o.finished for o in got] == [False] * (len(got) - 1) + [True]
        assert [t for o in got for t in o.delta_token_ids] == got[-1].token_ids == ref.token_ids
        assert "".join(o.delta_text for o in got) == got[-1].text == ref.text


@pytest.mark.timeout(300)
def test_the_held_tokens_of_a_verdict_a_lost_rank_never_took_never_leave(default_model, in_process_launcher):
    # one row a batch: each sequence is its own batch, verified in admission order
    config = EngineConfig(drafter="none", num_speculative_tokens=0, row_budget=1, max_num_seqs=4, max_model_len=128)
    params = SamplingParams(max_tokens=12)
    reference = Engine.from_config(config, progress=False).generate([PROMPTS[0]], params)[0]
    timeline = []
    engine = grpc_engine(default_model, in_process_launcher, config, sink=timeline.extend)
    group = engine.group
    survivor = engine.add_request(PROMPTS[0], params)
    victim = engine.add_request(PROMPTS[1], params)
    slots_of, armed = {}, [False]
    verify, commit = group.verify, group.commit

    def noting_slots(cmd):
        slots_of[cmd.batch_id] = cmd.slots
        return verify(cmd)

    def losing_the_rank(verdict):
        # the victim's batch is the tick's last: its outputs are held when the rank goes
        if armed[0] and engine.requests[victim].slot in slots_of[verdict.batch_id]:
            armed[0] = False
            group.launcher.servers[0].stop(grace=None)
        commit(verdict)

    group.verify, group.commit = noting_slots, losing_the_rank
    try:
        for _ in range(3):
            timeline.extend(engine.step())
        armed[0] = True
        while engine.has_unfinished():
            timeline.extend(engine.step())
    finally:
        group.close()
    outs = by_request(timeline)
    final = outs[victim][-1]
    assert final.finish_reason == "error" and "not acknowledged by every rank" in final.error
    handed_out = [t for o in outs[victim] for t in o.delta_token_ids]
    assert handed_out == final.token_ids[: len(handed_out)] and len(handed_out) < len(final.token_ids)
    assert outs[survivor][-1].finish_reason == "length" and outs[survivor][-1].token_ids == reference.token_ids


@pytest.mark.timeout(300)
def test_an_emit_that_raises_does_not_put_the_streams_out_of_step(default_model, in_process_launcher):
    config = EngineConfig(drafter="ngram", max_num_seqs=4, max_model_len=128)
    params = SamplingParams(max_tokens=10)
    reference = Engine.from_config(config, progress=False).generate([PROMPTS[0]], params)[0]
    seen = []

    def broken_emit(outs):  # gets the outputs, then fails (a consumer that went away)
        seen.extend(outs)
        raise RuntimeError("the consumer is gone")

    engine = grpc_engine(default_model, in_process_launcher, config, sink=broken_emit)
    engine.add_request(PROMPTS[0], params)
    try:
        while engine.has_unfinished():
            seen.extend(engine.step())
        # every command still read its own reply: the group stayed healthy, and the
        # tokens are the reference's, which a verify reading another's reply would break
        assert engine.group.healthy()
    finally:
        engine.group.close()
    assert len(seen) > 2 and seen[-1].finished and seen[-1].token_ids == reference.token_ids


@pytest.mark.timeout(300)
def test_held_outputs_are_built_while_the_next_command_runs_and_keep_stop_strings_and_aborts(
        default_model, in_process_launcher, monkeypatch):
    import tandem.output_tracker as tracker_module

    config = EngineConfig(drafter="ngram", max_num_seqs=4, max_model_len=128)
    plain = [SamplingParams(max_tokens=n) for n in (24, 20, 16)]
    reference = Engine.from_config(config, progress=False).generate(PROMPTS, plain)
    stop = reference[0].text[len(reference[0].text) // 2:][:6]  # cut the first request half way
    assert stop.strip(), reference[0].text
    params = [SamplingParams(max_tokens=24, stop=[stop]), plain[1], plain[2]]
    expected = Engine.from_config(config, progress=False).generate(PROMPTS, params)
    assert expected[0].finish_reason == "stop" and len(expected[0].text) < len(reference[0].text)

    timeline = []
    engine = grpc_engine(default_model, in_process_launcher, config, sink=timeline.extend)
    built_while_waiting = []
    build = tracker_module.build_output
    busy = [False]

    def noting_build(due, detok):
        built_while_waiting.append(busy[0])
        return build(due, detok)

    monkeypatch.setattr(tracker_module, "build_output", noting_build)
    verify = engine.group.verify

    def waiting(cmd):
        busy[0] = True
        try:
            return verify(cmd)
        finally:
            busy[0] = False

    engine.group.verify = waiting
    try:
        ids = [engine.add_request(p, sp) for p, sp in zip(PROMPTS, params)]
        for _ in range(4):
            timeline.extend(engine.step())
        assert engine.release.held, "a tick's outputs are held, not built yet"
        engine.abort(ids[2])  # between ticks, while its last outputs are held
        while engine.has_unfinished():
            timeline.extend(engine.step())
    finally:
        engine.group.close()
    assert sum(built_while_waiting) > len(built_while_waiting) / 2, "most outputs were built while a verify ran"
    outs = by_request(timeline)
    for rid, ref in zip(ids[:2], expected):
        got = outs[rid]
        assert [t for o in got for t in o.delta_token_ids] == got[-1].token_ids == ref.token_ids
        assert "".join(o.delta_text for o in got) == got[-1].text == ref.text
        assert got[-1].finish_reason == ref.finish_reason
    aborted = outs[ids[2]]
    assert aborted[-1].finished and aborted[-1].finish_reason == "abort"
    assert [o.finished for o in aborted].count(True) == 1
    assert [t for o in aborted for t in o.delta_token_ids] == aborted[-1].token_ids
    assert "".join(o.delta_text for o in aborted) == aborted[-1].text
    assert aborted[-1].token_ids == expected[2].token_ids[: len(aborted[-1].token_ids)]
