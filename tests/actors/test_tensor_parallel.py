"""Two shard actors (tensor parallel 2) through Ray write the embedded engine's text (both
float32: quantized ranks quantize their own shares, so their picks are their own)."""
from __future__ import annotations

import pytest

from tandem.sampling_params import SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]


@pytest.fixture(scope="module")
def embedded():
    from tandem.engine import Engine

    engine = Engine.from_config(progress=False, model="smollm2", dtype="float32", max_num_seqs=4, max_model_len=512)
    yield engine
    engine.close()


def test_two_shard_actors_write_the_embedded_engines_greedy_text(tp2, embedded):
    params = SamplingParams(max_tokens=20, temperature=0.0)
    expected = [o.text for o in embedded.generate(PROMPTS, params)]
    assert [tp2.generate(p, params).text for p in PROMPTS] == expected
    assert len(tp2.shard_actors()) == 2
    assert tp2.info["tensor_parallel_size"] == 2
    assert tp2.health()["shard_sessions"] == ["socket", "socket"], "ranks on the scheduler's node: the session socket"


def test_concurrent_requests_batch_together_and_keep_their_text(tp2, embedded):
    import asyncio

    params = SamplingParams(max_tokens=12, temperature=0.0)
    expected = [o.text for o in embedded.generate(PROMPTS, params)]

    async def all_at_once():
        return await asyncio.gather(*(tp2.agenerate(p, params) for p in PROMPTS))

    assert [o.text for o in asyncio.run(all_at_once())] == expected
