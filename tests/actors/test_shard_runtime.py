"""A shard actor computes as the embedded engine does: the same torch threads for the
cores it may use, the same quantization of the linear layers, the same attention kernel."""
from __future__ import annotations

import pytest

from tandem.actors import shard_actor


@pytest.mark.parametrize("cores, world, threads", [(2.0, 1, 2), (4.0, 2, 2), (1.5, 1, 1), (3.0, 2, 1), (1.0, 4, 1)])
def test_default_torch_threads_are_a_share_of_the_usable_cores_not_the_hosts(monkeypatch, cores, world, threads):
    import tandem.rpc.session_socket as session_socket

    monkeypatch.setattr(session_socket, "usable_cores", lambda: cores)
    assert shard_actor.default_torch_threads(world) == threads


@pytest.mark.slow
def test_a_cpu_shard_actor_runs_what_the_embedded_engine_runs(ray_cluster, embedded):
    import ray
    import torch

    import tandem.actors as ta
    from tandem.model.paged_attention_cpu import load_kernel

    handle = ta.start(model="smollm2", drafter="none", max_num_seqs=2, max_model_len=256, shard_num_gpus=0.0)
    try:
        (actor,) = handle.shard_actors()
        runtime = ray.get(actor.runtime.remote())
    finally:
        handle.shutdown()
    assert runtime["torch_threads"] == shard_actor.default_torch_threads(1)
    assert runtime["quantization"] == embedded.group.shard.model.quantization
    assert runtime["quantization"] != "none" or torch.cuda.is_available()  # the GGUF's int4 on a CPU
    assert runtime["cpu_attention_kernel"] == (load_kernel() is not None)
