"""The paged KV cache in the engine, on the default model: the prefix cache, admission and
preemption by memory, and requests that can never fit. Every output equals the run that
needed neither (greedy, and seeded sampling)."""
from __future__ import annotations

import pytest

from tandem.config import EngineConfig
from tandem.engine import Engine
from tandem.errors import InvalidRequestError
from tandem.model.kv_cache import PagedKVCache
from tandem.sampling_params import SamplingParams
from tandem.shard.factory import ShardSpec, build_model_shard
from tandem.shard.local_group import LocalShardGroup

SYSTEM = "You are a careful assistant who answers in one short sentence. " * 12
GREEDY = SamplingParams(max_tokens=24)
SEEDED = SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, seed=7)


def _pool_group(default_model, blocks: int) -> LocalShardGroup:
    """A rank on the loaded default model whose KV pool holds `blocks` blocks of 16."""
    c = default_model.config
    per_block = PagedKVCache.bytes_per_block(c.num_layers, 16, c.num_kv_heads, c.head_dim, default_model.model.dtype)
    spec = ShardSpec(num_slots=8, max_model_len=blocks * 16, row_budget=128, device="cpu", dtype="float32",
                     kv_cache_memory_gb=(blocks * per_block + per_block // 2) / (1 << 30))
    shard, _ = build_model_shard(spec, loaded=default_model, progress=False)
    assert shard.limits.num_blocks == blocks
    return LocalShardGroup(shard)


def _engine(default_model, group, drafter: str = "ngram", **cfg) -> Engine:
    config = EngineConfig(drafter=drafter, max_num_seqs=8, max_model_len=group.limits.max_model_len, row_budget=128, **cfg)
    return Engine(group, default_model.tokenizer, default_model.eos_token_ids, config)


@pytest.fixture(scope="module")
def large_pool(default_model):
    return _pool_group(default_model, 400)


def _run(engine: Engine, prompts: list[str], params: SamplingParams) -> tuple[list[list[int]], dict[str, list[int]]]:
    """Every request's final token ids, and the tokens its streamed deltas carried."""
    ids = [engine.add_request(p, params) for p in prompts]
    streamed: dict[str, list[int]] = {i: [] for i in ids}
    final = {}
    while len(final) < len(ids):
        for out in engine.step():
            streamed[out.request_id] += out.delta_token_ids
            if out.finished:
                final[out.request_id] = out.token_ids
    return [final[i] for i in ids], streamed


def test_a_cached_prefix_is_not_prefilled_again_and_changes_no_output(default_model, large_pool):
    prompts = [SYSTEM + f"Question {i}: name a colour." for i in range(3)]
    uncached, _ = _run(_engine(default_model, large_pool, enable_prefix_caching=False), prompts, GREEDY)
    engine = _engine(default_model, large_pool)
    first, _ = _run(engine, prompts[:1], GREEDY)
    hits_before = engine.metrics.prefix_cache_hits._value.get()
    rest, _ = _run(engine, prompts[1:], GREEDY)
    assert first + rest == uncached
    shared = len(default_model.tokenizer(SYSTEM).input_ids)
    # each later request found at least the system prompt's whole blocks in the cache
    assert engine.metrics.prefix_cache_hits._value.get() - hits_before >= 2 * (shared // 16 - 1) * 16
    assert engine.metrics.prefix_cache_queries._value.get() > engine.metrics.prefix_cache_hits._value.get()


def test_two_running_requests_with_one_prompt_share_its_blocks(default_model, large_pool):
    engine = _engine(default_model, large_pool, drafter="none")
    a = engine.add_request(SYSTEM, SamplingParams(max_tokens=30))
    engine.step()  # a's prompt is prefilled and committed: its full blocks are cached
    b = engine.add_request(SYSTEM, SamplingParams(max_tokens=30))
    engine.step()
    seq_a, seq_b = engine.requests[a], engine.requests[b]
    assert not seq_a.finished and not seq_b.finished
    full = (len(seq_a.prompt_ids) - 1) // 16
    table_a, table_b = engine.scheduler.table(seq_a), engine.scheduler.table(seq_b)
    assert full >= 5 and table_a[:full] == table_b[:full]
    assert not set(table_a[full:]) & set(table_b[full:])  # what each writes is its own
    while engine.has_unfinished():
        engine.step()
    assert engine.scheduler.kv.usage() == 0.0


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_pool_too_small_for_the_batch_preempts_and_resumes_with_the_same_outputs(default_model, large_pool, params):
    prompts = [f"Story {i}: once upon a time there was a" for i in range(6)]
    # A sampled token depends on whether a draft stood at its position: the draft counts
    # must not follow the batch's size (adaptive caps do), only the sequence's own tokens.
    adaptive = params.greedy
    want, _ = _run(_engine(default_model, large_pool, adaptive=adaptive), prompts, params)
    engine = _engine(default_model, _pool_group(default_model, 10), adaptive=adaptive)  # 160 positions, 6 x ~36
    got, streamed = _run(engine, prompts, params)
    assert engine.scheduler.num_preemptions > 0
    assert engine.metrics.num_preemptions._value.get() == engine.scheduler.num_preemptions
    assert got == want
    for ids, rid in zip(got, streamed):
        assert streamed[rid] == ids  # every token once, in order, across the preemptions


def test_a_request_that_can_never_fit_is_refused_naming_max_tokens(default_model):
    engine = _engine(default_model, _pool_group(default_model, 4))  # max_model_len 64
    with pytest.raises(InvalidRequestError, match="max_tokens") as e:
        engine.add_request("Hello there, how are you?", SamplingParams(max_tokens=60))
    assert e.value.field == "max_tokens" and "max_model_len 64" in str(e.value)
    ok = engine.generate(["Hello"], SamplingParams(max_tokens=8))[0]
    assert len(ok.token_ids) >= 1


def test_the_pool_is_sized_from_a_memory_budget_and_reported(default_model):
    group = _pool_group(default_model, 25)
    engine = _engine(default_model, group)
    summary = engine.scheduler.kv_summary()
    assert summary["num_blocks"] == 25 and summary["num_tokens"] == 400 and summary["free_blocks"] == 25
    assert group.limits.max_model_len == 400
