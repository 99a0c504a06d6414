"""The scheduler alone: who is admitted in which order, what a requeue gives back, what
reap takes away."""
from __future__ import annotations

from tandem.kv import KVBlockManager
from tandem.sampling_params import SamplingParams
from tandem.scheduler import Scheduler as _Scheduler
from tandem.sequence import FinishReason, Sequence, Status


def seq(rid: str, prompt: list[int] | None = None) -> Sequence:
    return Sequence(request_id=rid, prompt=None, prompt_ids=prompt or [1, 2], params=SamplingParams(), seed=0,
                    eos_ids=frozenset(), max_model_len=64, arrival=0.0)


def Scheduler(num_slots: int, row_budget: int, max_batch: int | None = None, blocks: int = 64, block_size: int = 4):
    return _Scheduler(num_slots, row_budget, KVBlockManager(blocks, block_size), max_batch=max_batch)


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


def test_admission_waits_for_blocks_first_come_first_served():
    s = Scheduler(num_slots=4, row_budget=16, blocks=5, block_size=4)
    a, b, c = seq("a", list(range(10))), seq("b", list(range(20, 32))), seq("c", [7])
    for q in (a, b, c):
        s.add(q)
    assert s.admit() == [a]  # 3 blocks; b needs 3 of the 2 left, and c waits behind it
    assert list(s.waiting) == [b, c] and s.kv.num_free() == 2
    a.finish(FinishReason.STOP)
    s.reap()
    assert s.admit() == [b, c] and s.kv.num_free() == 1


def test_make_room_preempts_the_newest_running_sequence_and_it_resumes_from_its_tokens():
    s = Scheduler(num_slots=4, row_budget=16, blocks=4, block_size=4)
    a, b = seq("a", list(range(7))), seq("b", list(range(10, 17)))
    for q in (a, b):
        s.add(q)
    assert s.admit() == [a, b]  # 2 blocks each: the pool is full
    a.output_ids, b.output_ids = [50], [60]
    s.committed(a), s.committed(b)
    kept = s.make_room([a, b], rows=3)  # a needs positions 7..9: a third block
    assert kept == [a] and b.status is Status.WAITING and list(s.waiting) == [b]
    assert s.num_preemptions == 1 and s.preempted_slots == [1] and b.slot is None
    assert len(s.table(a)) == 3 and s.kv.num_free() == 1
    a.finish(FinishReason.STOP)
    s.reap()
    assert s.admit() == [b] and b.cached_len == 4  # its first block was still cached
    assert len(s.table(b)) == 2  # prompt + output but the last token: 7 positions


def test_committed_gives_back_the_blocks_past_the_kept_rows():
    s = Scheduler(num_slots=1, row_budget=16, blocks=8, block_size=4)
    a = seq("a", list(range(6)))
    s.add(a)
    s.admit()
    a.output_ids = [9]
    assert s.make_room([a], rows=8) == [a] and len(s.table(a)) == 4  # positions up to 13
    a.output_ids = [9, 10]  # one draft kept: kv_len 7
    s.committed(a)
    assert len(s.table(a)) == 2 and s.kv.num_free() == 6


def test_committed_ids_slice_as_the_joined_list_does():
    # what the KV manager reads of a sequence's committed ids each tick, without the copy
    import random

    from tandem.sequence import JoinedIds

    rng = random.Random(3)
    for _ in range(500):
        prompt = [rng.randrange(100) for _ in range(rng.randrange(1, 40))]
        output = [rng.randrange(100) for _ in range(rng.randrange(0, 40))]
        n = rng.randrange(0, len(prompt) + len(output) + 1)
        joined, whole = JoinedIds(prompt, output, n), (prompt + output)[:n]
        a, b = rng.randrange(0, n + 3), rng.randrange(0, n + 3)
        assert len(joined) == n and joined[a:b] == whole[a:b], (len(prompt), len(output), n, a, b)
