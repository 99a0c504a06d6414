"""Two shard processes (tensor parallel 2 over gloo, driven over gRPC) serving the default
model at int8 and at int4 (the CPU's default), each rank quantizing its own share: greedy
speculation there equals greedy decoding of the same two-rank target, token for token,
with the scheduler's n-gram drafter and the rank-side draft-model drafter, at batch 8."""
from __future__ import annotations

import pytest

from tandem.config import EngineConfig
from tandem.engine import Engine
from tandem.model.quant import cpu_int8
from tandem.rpc.grpc_group import GrpcShardGroup
from tandem.rpc.launcher import ProcessLauncher
from tandem.sampling_params import SamplingParams

from test_tp2_greedy import PROMPTS

pytestmark = pytest.mark.slow

PARAMS = SamplingParams(max_tokens=24, temperature=0.0)


def config(drafter: str, method: str) -> EngineConfig:
    return EngineConfig(drafter=drafter, draft_model="smollm2", max_num_seqs=8, max_model_len=128, row_budget=64,
                        num_speculative_tokens=4, adaptive=False, quantization=method, device="cpu")


@pytest.fixture(scope="module", params=["int8", "int4"])
def tp2_quantized(request):
    if request.param == "int8" and not cpu_int8.available():
        pytest.skip(cpu_int8.unusable())
    spec = config("draft-model", request.param).shard_spec()
    group = GrpcShardGroup(spec, ProcessLauncher(2, threads_per_rank=1), deadline_s=120)
    yield group, request.param
    group.close()


def run(group, model, drafter: str, batch: int, method: str):
    engine = Engine(group, model.tokenizer, model.eos_token_ids, config(drafter, method))
    outs = engine.generate(PROMPTS[:batch], PARAMS)
    assert all(o.finish_reason in ("length", "stop") for o in outs), [o.error for o in outs]
    return [o.token_ids for o in outs], sum(o.num_draft_tokens for o in outs)


@pytest.mark.timeout(600)
def test_speculation_on_two_quantized_ranks_equals_their_greedy_decoding(tp2_quantized, default_model):
    """At batch 8: one sequence's verify rows beside seven others' (batch 1 on two ranks:
    test_tp2_greedy.py, in float32)."""
    group, method = tp2_quantized
    batch = 8
    want, _ = run(group, default_model, "none", batch, method)
    for drafter in ("ngram", "draft-model"):
        ids, drafted = run(group, default_model, drafter, batch, method)
        assert ids == want, drafter
        assert drafted > 0, f"{drafter}: no drafts were verified"
