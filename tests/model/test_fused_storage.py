"""FusedLinears.share_storage, the GPU's one-GEMM q/k/v and gate/up: the layers' weights
become views of one tensor (no second copy), the fused GEMM equals the separate layers,
and a weight replaced afterwards (tensor-parallel sharding) makes it fall back."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from test_model_forward import check_against_reference, tiny_pair
from tandem.model.cpu_linear import FusedLinears, share_fused_storage
from tandem.model.loader import load_model


def test_shared_storage_is_one_tensor_and_one_gemm_equal_to_the_layers():
    torch.manual_seed(0)
    layers = [nn.Linear(64, out, bias=b).requires_grad_(False) for out, b in ((96, True), (32, False), (32, True))]
    before = [(layer.weight.clone(), None if layer.bias is None else layer.bias.clone()) for layer in layers]
    fused = FusedLinears(*layers)
    fused.share_storage()
    base = layers[0].weight.untyped_storage().data_ptr()
    assert all(layer.weight.untyped_storage().data_ptr() == base for layer in layers)
    x = torch.randn(3, 5, 64)
    with torch.no_grad():
        joint = fused.joint(x)
        assert joint is not None and joint.shape == (3, 5, 160)
        outs = fused(x)
    for out, (w, b) in zip(outs, before):
        torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-5, atol=1e-5)

    layers[1].weight = nn.Parameter(torch.randn(32, 64), requires_grad=False)  # what sharding does
    with torch.no_grad():
        assert fused.joint(x) is None  # unpacked CPU layers: one by one
        torch.testing.assert_close(fused(x)[1], F.linear(x, layers[1].weight), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["llama", "llama-linear-rope-attention-bias"])
def test_a_model_with_shared_storage_still_matches_transformers(variant, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    folder = tiny_model_dir(variant)
    ours = load_model(folder, progress=False).model
    share_fused_storage(ours)  # what a GPU load does; on the CPU it replaces the packed GEMMs
    assert ours.model.layers[0].self_attn.qkv._shared is not None
    hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    check_against_reference(ours, hf_model, *tiny_pair())
