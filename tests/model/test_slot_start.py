"""The forward's slot_start: consecutive slots read the KV cache in place, with the
same result as gathering each slot's rows."""
from __future__ import annotations

import torch

from tandem.model.cpu_malloc import keep_freed_memory
from tandem.model.loader import load_model
from tandem.sampling_params import SamplingParams
from tandem.scheduler import Scheduler
from tandem.sequence import FinishReason, Sequence


def _run(model, tokens, slots, starts, **kw):
    cache = model.new_cache(num_slots=6, max_seq_len=64)
    for slot, start in zip(slots, starts):  # a different context in every slot
        model(torch.arange(slot + 1, slot + start + 1)[None], torch.tensor([slot]), torch.tensor([0]), cache)
    return model(tokens, torch.tensor(slots), torch.tensor(starts), cache, **kw), cache


def test_in_place_reads_equal_the_gather(tiny_model_dir):
    for variant in ("qwen2", "llama-tied-llama3-rope"):
        model = load_model(tiny_model_dir(variant), progress=False).model
        tokens = torch.randint(0, 256, (3, 4), generator=torch.Generator().manual_seed(0))
        slots, starts = [2, 3, 4], [5, 9, 1]
        gathered, cache_g = _run(model, tokens, slots, starts)
        in_place, cache_v = _run(model, tokens, slots, starts, slot_start=2)
        torch.testing.assert_close(in_place.logits, gathered.logits, rtol=1e-5, atol=1e-5)
        for a, b in zip(cache_g.k + cache_g.v, cache_v.k + cache_v.v):
            assert torch.equal(a, b)


def test_verify_batches_come_in_slot_order():
    sched = Scheduler(num_slots=8, row_budget=64)
    seqs = [Sequence(request_id=str(i), prompt=None, prompt_ids=[1, 2], params=SamplingParams(max_tokens=4), seed=0,
                     eos_ids=frozenset(), max_seq_len=64, arrival=0.0) for i in range(5)]
    for s in seqs:
        sched.add(s)
    sched.admit()
    seqs[1].finish(FinishReason.ABORT)
    sched.reap()  # slot 1 goes back to the pool, and the next arrival takes it
    late = Sequence(request_id="late", prompt=None, prompt_ids=[1], params=SamplingParams(max_tokens=4), seed=0,
                    eos_ids=frozenset(), max_seq_len=64, arrival=1.0)
    sched.add(late)
    sched.admit()
    [batch] = sched.verify_batches()
    assert [s.slot for s in batch] == sorted(s.slot for s in batch) == [0, 1, 2, 3, 4]
    assert batch[1] is late


def test_malloc_settings_apply_on_glibc(monkeypatch):
    import platform

    import tandem.model.cpu_malloc as cm

    monkeypatch.setattr(cm, "_done", False)
    monkeypatch.setenv("TANDEM_KEEP_FREED_MEMORY", "0")
    assert not keep_freed_memory()  # left alone when asked
    monkeypatch.delenv("TANDEM_KEEP_FREED_MEMORY")
    applied = keep_freed_memory()
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert applied


def test_consecutive_start():
    from tandem.model.kv_cache import consecutive_start

    assert consecutive_start([3, 4, 5]) == 3 and consecutive_start([0]) == 0
    assert consecutive_start([3, 5]) is None and consecutive_start([4, 3]) is None and consecutive_start([]) is None
