"""A single rank inside the scheduler actor (in_process_target): no shard actors, the same
greedy text as the embedded engine, streamed and whole."""
from __future__ import annotations

import pytest

from tandem.sampling_params import SamplingParams


@pytest.mark.slow
def test_an_in_process_target_serves_the_embedded_text_without_shard_actors(ray_cluster, tiny_chat_model):
    import tandem.actors as ta
    from tandem.engine import Engine

    # the tiny random-weight model, embedded and in the actor: the same weights, the same picks
    prompt, params = "def fibonacci(n):", SamplingParams(max_tokens=12, temperature=0.0)
    embedded = Engine.from_config(progress=False, model=tiny_chat_model, max_num_seqs=4, max_model_len=512)
    try:
        reference = embedded.generate([prompt], params)[0]
    finally:
        embedded.close()
    handle = ta.start(model=tiny_chat_model, in_process_target=True, max_num_seqs=4, max_model_len=512)
    try:
        assert handle.shard_actors() == []
        assert handle.generate(prompt, params).token_ids == reference.token_ids
        outs = list(handle.stream(prompt, params))
        assert [t for o in outs for t in o.delta_token_ids] == reference.token_ids
        assert outs[-1].text == reference.text
    finally:
        handle.shutdown()
