"""The quantized linear kernels (model/quant): each computes what its definition says,
a row's output does not depend on the rows beside it, and bad choices are refused by name."""
from __future__ import annotations

import pytest
import torch

from tandem.model import quant
from tandem.model.quant import QuantizedLinear, cpu_int4, cpu_int8

torch.manual_seed(0)


def _int8_reference(kernel: cpu_int8.Int8CpuKernel, x: torch.Tensor) -> torch.Tensor:
    """The int8 definition in float64: per-row int8 activations times the int8 weights."""
    rows = x.double()
    if kernel.inv_smooth is not None:
        rows = rows * kernel.inv_smooth.double()
    xq, xs = cpu_int8.quantize_rows(rows.float(), cpu_int8.ACTIVATION_MAX)
    w = kernel.q.double()
    out = (xq.double() @ w.t()) * kernel.scale.double() * xs.double()
    return out + kernel.bias.double() if kernel.bias is not None else out


@pytest.mark.skipif(not cpu_int8.available(), reason="no exact int8 GEMM here")
@pytest.mark.parametrize("smooth", [False, True])
@pytest.mark.parametrize("rows, k", [(7, 128), (1, 576), (40, 576)])
def test_int8_kernel_is_its_integer_definition(smooth, rows, k):
    w, b = torch.randn(96, k), torch.randn(96)
    x = torch.randn(rows, k) * (1 + 9 * torch.rand(k))  # channels of unlike sizes, as SmoothQuant expects
    amax = x.abs().amax(0) if smooth else None
    kernel = cpu_int8.Int8CpuKernel(w, b, keep_weight=True, input_absmax=amax)
    out = kernel(x)
    assert out.shape == (rows, 96) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), _int8_reference(kernel, x), rtol=1e-5, atol=1e-4)
    # and close to the float product (8-bit-ish error, far below the outputs' size)
    rel = (out - (x @ w.t() + b)).norm() / (x @ w.t()).norm()
    assert rel < 0.05


@pytest.mark.skipif(not cpu_int8.available(), reason="no exact int8 GEMM here")
def test_int8_weights_fit_the_cpus_exact_range():
    most = cpu_int8.weight_max()
    assert most in (63, 127)
    kernel = cpu_int8.Int8CpuKernel(torch.randn(32, 64), None, keep_weight=True)
    assert int(kernel.q.abs().max()) == most  # every channel's largest weight takes the top code


@pytest.mark.parametrize("make", [
    pytest.param(lambda w, b: cpu_int8.Int8CpuKernel(w, b), id="int8",
                 marks=pytest.mark.skipif(not cpu_int8.available(), reason="no oneDNN")),
    pytest.param(lambda w, b: cpu_int4.Int4CpuKernel(w, b), id="int4",
                 marks=pytest.mark.skipif(not cpu_int4.available(), reason="no int4 CPU kernel")),
])
def test_a_rows_output_is_the_same_alone_or_in_a_batch(make):
    kernel = make(torch.randn(208, 576), torch.randn(208))
    x = torch.randn(40, 576)
    together = kernel(x)
    alone = torch.cat([kernel(x[i:i + 1]) for i in range(40)])
    assert torch.equal(together, alone)
    assert torch.equal(kernel(x.view(8, 5, 576)).view(40, 208), together)


@pytest.mark.skipif(not cpu_int4.available(), reason="no int4 CPU kernel")
def test_int4_kernel_matches_its_dequantized_weight():
    w = torch.randn(64, 128)
    kernel = cpu_int4.Int4CpuKernel(w, None, keep_weight=True)
    deq = kernel.dequantize()
    assert (deq - w).abs().max() < (w.abs().max() / 15)  # within a 4-bit step of the weights
    x = torch.randn(3, 128)
    ref = x.to(torch.bfloat16).float() @ deq.t()
    torch.testing.assert_close(kernel(x), ref, rtol=2e-2, atol=5e-2)


def test_resolve_names_what_each_device_offers():
    cpu = torch.device("cpu")
    assert quant.resolve("auto", cpu, "auto", source_quantized=True) == "int4"
    assert quant.resolve("auto", cpu, "float32", source_quantized=True) == "none"  # float32 asked: exact path
    assert quant.resolve("auto", cpu, "auto", source_quantized=False) == "none"
    assert quant.resolve("auto", torch.device("cuda"), "auto", source_quantized=True) == "none"
    assert quant.resolve("int4", cpu, "auto", False) == "int4"
    with pytest.raises(ValueError, match="'fp8' does not run on cpu; cpu offers: int8, int4"):
        quant.resolve("fp8", cpu, "auto", False)
    with pytest.raises(ValueError, match="'int3' is not one of auto, none, int8, int4, fp8"):
        quant.resolve("int3", cpu, "auto", False)


def test_an_unsupported_gguf_type_is_refused_by_name(tmp_path):
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter

    from tandem.model import gguf_types

    path = str(tmp_path / "iq.gguf")
    writer = GGUFWriter(path, "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    # IQ2_XXS: blocks of 256 values in 66 bytes
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((2, 66), dtype=np.uint8),
                      raw_dtype=GGMLQuantizationType.IQ2_XXS)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(gguf_types.UnsupportedGGUFType) as err:
        gguf_types.check_types(path)
    message = str(err.value)
    assert "IQ2_XXS (e.g. blk.0.attn_q.weight)" in message and "supported: F32, F16, BF16, Q8_0" in message
    from tandem.model.loader import load_model

    with pytest.raises(gguf_types.UnsupportedGGUFType, match="IQ2_XXS"):
        load_model(path, progress=False)


def _tiny_llama():
    from tandem.model.config import ModelConfig
    from tandem.model.llama import LlamaForCausalLM

    config = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=16, rope_theta=10000.0, max_position_embeddings=128)
    return LlamaForCausalLM(config).eval().requires_grad_(False)


def test_where_the_int8_gemm_is_not_exact_int8_is_refused_and_int4_keeps_a_float_head(monkeypatch):
    from torch import nn

    monkeypatch.setattr(cpu_int8, "_weight_max", [0])  # as the probe finds where 7 bits saturate too
    assert not cpu_int8.available() and "not exact on this CPU" in cpu_int8.unusable()
    model = _tiny_llama()
    with pytest.raises(ValueError, match="quantization 'int8': oneDNN's int8 GEMM is not exact on this CPU"):
        quant.quantize(model, "int8")
    if not cpu_int4.available():
        return
    assert quant.quantize(model, "int4") > 0
    assert type(model.lm_head) is nn.Linear and isinstance(model.model.layers[0].mlp.down_proj, QuantizedLinear)


@pytest.mark.parametrize("dot_products", [True, False])
def test_int4s_lm_head_is_int8_only_where_the_cpu_has_int8_dot_products(monkeypatch, dot_products):
    from torch import nn

    if not (cpu_int4.available() and cpu_int8.available()):
        pytest.skip("this torch build lacks the int4 or the int8 CPU kernel")
    monkeypatch.setattr(cpu_int8, "fast", lambda: dot_products)
    model = _tiny_llama()
    assert quant.quantize(model, "int4") > 0
    assert isinstance(model.model.layers[0].mlp.down_proj, QuantizedLinear)
    if dot_products:
        assert isinstance(model.lm_head, QuantizedLinear) and model.lm_head.kernel.name == "int8"
    else:
        assert type(model.lm_head) is nn.Linear


def test_int8_on_a_cpu_without_int8_dot_products_warns_that_it_is_slow(monkeypatch, caplog):
    if not cpu_int8.available():
        pytest.skip(cpu_int8.unusable())
    monkeypatch.setattr(cpu_int8, "fast", lambda: False)
    with caplog.at_level("WARNING", logger="tandem.model"):
        quant._kernel_class("int8", torch.device("cpu"))
    assert "slower than float32" in caplog.text
