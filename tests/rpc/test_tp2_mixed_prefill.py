"""Prompt chunks riding on verifies (VerifyBatch.prefill) over gRPC: two tensor-parallel
shard processes on the CPU, and one on a GPU (eager forward beside the CUDA graphs), give
the greedy output one in-process rank gives with no riders, token for token, while a
burst of long prompts arrives mid-stream and really rides."""
from __future__ import annotations

import pytest
import torch

from bursts import burst_midstream
from test_gpu_grpc_greedy import IdsTokenizer
from tandem.config import EngineConfig
from tandem.engine import Engine
from tandem.rpc.grpc_group import GrpcShardGroup
from tandem.rpc.launcher import ProcessLauncher
from tandem.sampling_params import SamplingParams
from tandem.shard.factory import build_model_shard
from tandem.shard.local_group import LocalShardGroup

PARAMS = SamplingParams(max_tokens=24)


def prompts(count: int, length: int, seed: int) -> list[list[int]]:
    """Repeating motifs (n-gram lookup drafts), `length` tokens each."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        motif = torch.randint(0, 127, (3 + i % 4,), generator=g).tolist()
        out.append((motif * length)[:length])
    return out


FIRST, BURST = prompts(2, 12, seed=1), prompts(4, 56, seed=2)


def config(model: str, device: str, drafter: str, mixed: bool) -> EngineConfig:
    return EngineConfig(model=model, device=device, drafter=drafter, max_num_seqs=8, max_model_len=96, row_budget=64,
                        max_prefill_tokens=16, num_speculative_tokens=4, adaptive=False, mixed_prefill=mixed,
                        dtype="float32")


CASES = [pytest.param("cpu", 2, id="cpu-tp2", marks=pytest.mark.slow),
         pytest.param("cuda", 1, id="gpu", marks=[pytest.mark.gpu, pytest.mark.skipif(
             not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("device, ranks", CASES)
def test_chunks_riding_on_grpc_verifies_keep_greedy_output_exact(tiny_model_dir, device, ranks, monkeypatch):
    plain = config(tiny_model_dir, device, "none", mixed=False)
    shard, _ = build_model_shard(plain.shard_spec(), progress=False)
    want = burst_midstream(Engine(LocalShardGroup(shard), IdsTokenizer(), (), plain), FIRST, BURST, PARAMS, ("length",))
    mixed = config(tiny_model_dir, device, "ngram", mixed=True)
    group = GrpcShardGroup(mixed.shard_spec(), ProcessLauncher(ranks, threads_per_rank=1), deadline_s=60)
    rode = []
    real = group.verify
    monkeypatch.setattr(group, "verify", lambda cmd: (rode.append(len(cmd.prefill)), real(cmd))[1])
    try:
        assert group.limits.world_size == ranks
        got = burst_midstream(Engine(group, IdsTokenizer(), (), mixed), FIRST, BURST, PARAMS, ("length",))
    finally:
        group.close()
    assert got == want
    assert sum(rode) >= len(BURST) * 2, "the burst's chunks did not ride on the verifies"
