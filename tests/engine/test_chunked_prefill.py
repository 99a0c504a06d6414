"""Chunked prefill: a tick prefills at most max_prefill_tokens prompt tokens, so a long
prompt is written over several ticks while the running sequences keep decoding, and every
output equals the unchunked run's (greedy), for every drafter."""
from __future__ import annotations

import pytest

from tandem.kv import KVBlockManager
from tandem.sampling_params import SamplingParams
from tandem.scheduler import Scheduler
from tandem.sequence import Sequence

LONG = "The quick brown fox jumps over the lazy dog while the cat sleeps. " * 7  # ~100 tokens
SHORT = ["Name three fruits.", "Count to five."]
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


def _Seq(rid: str, n: int) -> Sequence:
    return Sequence(rid, None, list(range(1, n + 1)), GREEDY, seed=0, eos_ids=frozenset(), max_model_len=1024,
                    arrival=0.0)


def test_chunks_keep_to_the_budget_end_on_block_boundaries_and_go_oldest_first():
    sched = Scheduler(4, 64, KVBlockManager(64, 16), max_prefill_tokens=40)
    a, b, c = _Seq("a", 100), _Seq("b", 6), _Seq("c", 30)
    for s in (a, b, c):
        sched.add(s)
    assert sched.admit() == [a, b, c]
    # a's chunk stops at a block boundary; b fits whole; no whole block of c fits what is left
    assert [(s.request_id, lo, hi) for s, lo, hi in sched.prefill_chunks()] == [("a", 0, 32), ("b", 0, 6)]
    assert not sched.prefilled(a, 32) and sched.prefilled(b, 6)
    assert sched.verify_batches() == [[b]]  # a and c are not verified before their prefill completes
    assert [(s.request_id, lo, hi) for s, lo, hi in sched.prefill_chunks()] == [("a", 32, 64)]
    sched.prefilled(a, 64)
    assert [(s.request_id, lo, hi) for s, lo, hi in sched.prefill_chunks()] == [("a", 64, 100)]
    # a budget smaller than a block still moves a prompt on, by a block
    tiny = Scheduler(2, 64, KVBlockManager(64, 16), max_prefill_tokens=5)
    d = _Seq("d", 50)
    tiny.add(d)
    tiny.admit()
    assert [(lo, hi) for _, lo, hi in tiny.prefill_chunks()] == [(0, 16)]
    tiny.prefilled(d, 16)
    assert [(lo, hi) for _, lo, hi in tiny.prefill_chunks()] == [(16, 32)]


def _run(engine, prompts):
    """Final token ids per prompt, and per tick the output lengths of the sequences running."""
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    final, ticks = {}, []
    while len(final) < len(ids):
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out.token_ids
        ticks.append({s.request_id: len(s.output_ids) for s in engine.scheduler.running})
    return [final[i] for i in ids], ticks


@pytest.fixture(scope="module")
def unchunked(make_engine):
    """No-spec greedy output of each prompt, prefilled whole."""
    prompts = [LONG, *SHORT]
    outs, _ = _run(make_engine("none"), prompts)
    return dict(zip(prompts, outs))


def test_a_burst_prefilled_in_chunks_gives_the_unchunked_output(make_engine, unchunked):
    engine = make_engine("ngram", max_prefill_tokens=32)
    got, ticks = _run(engine, list(unchunked))
    assert got == list(unchunked.values())
    assert sum(1 for t in ticks if not all(t.values())) >= 3  # the long prompt took several ticks


@pytest.mark.parametrize("drafter", ["ngram", "draft-model"])
def test_a_prompt_prefilled_alone_in_chunks_gives_the_unchunked_output(make_engine, weak_draft_group,
                                                                       truncated_draft_dir, unchunked, drafter):
    # alone, the draft model writes its own KV at each chunk (tandem.drafters.draft_model.prefill)
    options = {"group": weak_draft_group, "draft_model": truncated_draft_dir} if drafter == "draft-model" else {}
    engine = make_engine(drafter, max_prefill_tokens=32, adaptive=False, **options)
    got, _ = _run(engine, [LONG])
    assert got == [unchunked[LONG]]


def test_running_streams_decode_while_a_long_prompt_is_prefilled(make_engine):
    engine = make_engine("ngram", max_prefill_tokens=32)
    runner = engine.add_request(SHORT[0], SamplingParams(max_tokens=40, ignore_eos=True))
    while not engine.requests[runner].output_ids:
        engine.step()
    long_id = engine.add_request(LONG, GREEDY)
    grew = 0
    while not engine.requests[long_id].output_ids:
        before = len(engine.requests[runner].output_ids)
        engine.step()
        grew += len(engine.requests[runner].output_ids) > before
    # ~100 prompt tokens at 32 a tick: several ticks of chunks, the runner decoding in them
    assert grew >= 2


def test_while_streams_run_a_stall_bound_prefills_a_long_prompt_a_block_a_tick(make_engine, unchunked):
    # mixed_prefill off: the chunks go in prefills of their own, which prefill_stall bounds
    engine = make_engine("ngram", mixed_prefill=False, prefill_stall=1e-9)
    runner = engine.add_request(SHORT[0], SamplingParams(max_tokens=40, ignore_eos=True))
    while len(engine.requests[runner].output_ids) < 4:
        engine.step()  # alone, its prompt prefilled at full width; then verifies measured
    long_id = engine.add_request(LONG, GREEDY)
    ticks = 0
    while not engine.requests[long_id].output_ids:
        engine.step()
        ticks += 1
    # a budget far under a block still moves the prompt on by one block (16 positions) a tick
    assert ticks >= len(engine.requests[long_id].prompt_ids) // 16
    final = None
    while final is None:
        final = next((o.token_ids for o in engine.step() if o.request_id == long_id and o.finished), None)
    assert final == unchunked[LONG]


def test_with_no_stall_bound_a_long_prompt_prefills_in_one_tick_beside_running_streams(make_engine):
    engine = make_engine("ngram", mixed_prefill=False, prefill_stall=0)
    runner = engine.add_request(SHORT[0], SamplingParams(max_tokens=40, ignore_eos=True))
    while not engine.requests[runner].output_ids:
        engine.step()
    long_id = engine.add_request(LONG, GREEDY)
    engine.step()
    assert engine.requests[long_id].output_ids


def test_prompts_sent_with_the_running_streams_are_prefilled_at_full_width(make_engine):
    # sent together, the batch's later prompts are what its first streams wait for anyway:
    # no stall bound (it would move the long prompt on one block a tick once costs are measured)
    engine = make_engine("ngram", mixed_prefill=False, prefill_stall=1e-9, max_prefill_tokens=40)
    ids = [engine.add_request(p, SamplingParams(max_tokens=200, ignore_eos=True)) for p in SHORT] + \
        [engine.add_request(LONG * 3, GREEDY)]
    ticks = 0
    while not engine.requests[ids[-1]].output_ids:
        engine.step()
        ticks += 1
    assert engine.requests[ids[0]].output_ids  # the short prompts streamed meanwhile
    assert ticks <= -(-len(engine.requests[ids[-1]].prompt_ids) // 32) + 1  # chunks of 32, not 16
