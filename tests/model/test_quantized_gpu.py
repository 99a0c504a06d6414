"""The GPU's quantized kernels (model/quant): FP8 (E4M3) and int4 compute their definitions,
and a tiny model quantized on the GPU decodes greedily with n-gram speculation (CUDA graphs
on) exactly as without it."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_fp8_kernel_is_its_definition():
    from tandem.model.quant import cuda_fp8

    if not cuda_fp8.available(torch.device("cuda")):
        pytest.skip("no FP8 tensor cores")
    w = (torch.randn(256, 512, device="cuda") * 0.02).to(torch.bfloat16)
    b = torch.randn(256, device="cuda").to(torch.bfloat16)
    kernel = cuda_fp8.Fp8CudaKernel(w, b)
    x = torch.randn(3, 7, 512, device="cuda").to(torch.bfloat16)
    out = kernel(x)
    assert out.shape == (3, 7, 256) and out.dtype == torch.bfloat16
    xq, xs = cuda_fp8.quantize_rows_fp8(x.reshape(-1, 512))
    ref = (xq.float() * xs) @ kernel.dequantize().t() + b.float()
    torch.testing.assert_close(out.float().reshape(-1, 256), ref, rtol=2e-2, atol=2e-2)
    rel = (out.float() - (x.float() @ w.float().t() + b.float())).norm() / (x.float() @ w.float().t()).norm()
    assert rel < 0.08


def test_int4_kernel_is_its_definition():
    from tandem.model.quant import cuda_int4

    w = (torch.randn(128, 256, device="cuda") * 0.02).to(torch.bfloat16)
    kernel = cuda_int4.Int4CudaKernel(w, None, keep_weight=True)
    x = torch.randn(5, 256, device="cuda").to(torch.bfloat16)
    ref = x.float() @ kernel.dequantize().t()
    torch.testing.assert_close(kernel(x).float(), ref, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("method", ["fp8", "int4"])
def test_a_quantized_gpu_target_keeps_greedy_speculation_exact(method, tiny_model_dir):
    from tandem.config import EngineConfig
    from tandem.engine import Engine
    from tandem.model.loader import load_model
    from tandem.model.quant import cuda_fp8
    from tandem.sampling_params import SamplingParams
    from tandem.shard.factory import ShardSpec, build_model_shard
    from tandem.shard.local_group import LocalShardGroup

    if method == "fp8" and not cuda_fp8.available(torch.device("cuda")):
        pytest.skip("no FP8 tensor cores")
    loaded = load_model(tiny_model_dir("llama"), dtype=torch.bfloat16, device="cuda", progress=False)
    spec = ShardSpec(device="cuda", dtype="bfloat16", quantization=method, num_slots=8, max_model_len=128,
                     row_budget=64, cuda_graphs=True)
    shard, _ = build_model_shard(spec, loaded=loaded, progress=False)
    assert shard.model.quantization == method
    group = LocalShardGroup(shard)

    class Ids:
        chat_template = None

        def decode(self, ids, **_):
            return " ".join(map(str, ids))

    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 200, (4,), generator=g).tolist() * 3 for _ in range(6)]
    params = SamplingParams(max_tokens=24, ignore_eos=True)

    def run(drafter):
        config = EngineConfig(drafter=drafter, max_num_seqs=8, max_model_len=128, row_budget=64, adaptive=False)
        outs = Engine(group, Ids(), (), config).generate(prompts, params)
        return [o.token_ids for o in outs], sum(o.num_draft_tokens for o in outs)

    want, _ = run("none")
    got, drafted = run("ngram")
    assert got == want and drafted > 0
