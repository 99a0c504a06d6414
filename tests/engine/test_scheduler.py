"""The scheduler alone: who is admitted in which order, what a requeue gives back, what
reap takes away."""
from __future__ import annotations

from tandem.sampling_params import SamplingParams
from tandem.scheduler import Scheduler
from tandem.sequence import FinishReason, Sequence, Status


def seq(rid: str) -> Sequence:
    return Sequence(request_id=rid, prompt=None, prompt_ids=[1, 2], params=SamplingParams(), seed=0,
                    eos_ids=frozenset(), max_seq_len=64, arrival=0.0)


def test_admission_is_in_arrival_order_while_slots_last_and_skips_the_aborted():
    s = Scheduler(num_slots=2, row_budget=16)
    a, b, c, d = (seq(x) for x in "abcd")
    for q in (a, b, c, d):
        s.add(q)
    b.finish(FinishReason.ABORT)
    assert s.admit() == [a, c]
    assert [q.slot for q in (a, c)] == [0, 1] and all(q.status is Status.RUNNING for q in (a, c))
    assert list(s.waiting) == [d] and s.admit() == []


def test_max_batch_bounds_the_running_set_below_the_slots():
    s = Scheduler(num_slots=4, row_budget=16, max_batch=1)
    for q in (seq("a"), seq("b")):
        s.add(q)
    assert [q.request_id for q in s.admit()] == ["a"]


def test_requeue_puts_the_sequences_first_in_their_order_and_frees_their_slots():
    s = Scheduler(num_slots=3, row_budget=16)
    a, b, c, d = (seq(x) for x in "abcd")
    for q in (a, b, c, d):
        s.add(q)
    admitted = s.admit()
    assert admitted == [a, b, c]
    s.requeue([b, c])
    assert s.running == [a] and list(s.waiting) == [b, c, d]
    assert (b.slot, b.status, c.slot, c.status) == (None, Status.WAITING, None, Status.WAITING)
    assert s.admit() == [b, c]  # the same two slots, in the same order
    assert {b.slot, c.slot} == {1, 2}


def test_reap_takes_the_finished_and_their_slots_go_back():
    s = Scheduler(num_slots=2, row_budget=16)
    a, b, c = (seq(x) for x in "abc")
    for q in (a, b, c):
        s.add(q)
    s.admit()
    a.finish(FinishReason.LENGTH)
    assert s.reap() == [a] and s.running == [b]
    assert s.admit() == [c] and c.slot == a.slot
    assert s.reap() == [] and s.has_work
    b.finish(FinishReason.STOP)
    c.finish(FinishReason.ERROR, error="lost")
    assert s.reap() == [b, c] and not s.has_work and sorted(s.free_slots) == [0, 1]
