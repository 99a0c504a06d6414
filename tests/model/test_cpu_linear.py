"""The oneDNN packed linears of the CPU path: same maths as F.linear, repacked when a
weight changes, and the fused q/k/v and gate/up GEMMs equal the separate layers."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tandem.model.cpu_linear import FusedLinears, PackedLinear, onednn_available, pack_linear_layers

pytestmark = pytest.mark.skipif(not onednn_available(), reason="oneDNN is not in this torch build")


def packed(in_f: int, out_f: int, bias: bool) -> nn.Linear:
    layer = nn.Linear(in_f, out_f, bias=bias).requires_grad_(False)
    assert pack_linear_layers(layer) == 1 and type(layer) is PackedLinear
    return layer


def test_packed_linear_matches_f_linear_and_repacks_after_a_weight_change():
    torch.manual_seed(0)
    layer = packed(64, 96, bias=True)
    x = torch.randn(3, 5, 64)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    layer.weight = nn.Parameter(torch.randn(96, 64), requires_grad=False)  # what tensor-parallel sharding does
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [(True, True, True), (False, False, False), (True, False, True)])
def test_fused_linears_equal_the_separate_layers(bias):
    torch.manual_seed(1)
    layers = [packed(64, out, b) for out, b in zip((96, 32, 32), bias)]
    fused = FusedLinears(*layers)
    x = torch.randn(4, 6, 64)
    outs = fused(x)
    assert [o.shape[-1] for o in outs] == [96, 32, 32]
    for o, layer in zip(outs, layers):
        torch.testing.assert_close(o, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_fused_linears_repack_when_one_weight_is_replaced_or_changed_in_place():
    torch.manual_seed(2)
    a, b = packed(32, 48, False), packed(32, 16, False)
    fused = FusedLinears(a, b)
    x = torch.randn(2, 32)
    fused(x)
    b.weight = nn.Parameter(b.weight[:8].clone(), requires_grad=False)  # narrowed, as a TP shard
    outs = fused(x)
    assert outs[1].shape[-1] == 8
    torch.testing.assert_close(outs[1], F.linear(x, b.weight), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        a.weight.mul_(2.0)  # in place: the version counter tells
    torch.testing.assert_close(fused(x)[0], F.linear(x, a.weight), rtol=1e-5, atol=1e-5)


def test_fused_linears_fall_back_to_each_layer_off_the_packed_path():
    torch.manual_seed(3)
    a, b = nn.Linear(16, 8), nn.Linear(16, 4)  # not packed: each runs on its own
    x = torch.randn(3, 16)
    outs = FusedLinears(a, b)(x)
    torch.testing.assert_close(outs[0], a(x))
    torch.testing.assert_close(outs[1], b(x))
    y = x.to(torch.bfloat16)
    a2, b2 = packed(16, 8, True).to(torch.bfloat16), packed(16, 4, True).to(torch.bfloat16)
    outs = FusedLinears(a2, b2)(y)  # bf16: F.linear per layer
    assert outs[0].dtype == torch.bfloat16 and outs[1].shape[-1] == 4


def test_a_model_that_ran_deep_copies_without_its_opaque_packs(tiny_model_dir):
    """A rank quantizes a copy of a model it is given (shard.factory): one that already ran
    holds oneDNN packs, which have no storage to copy; the copy packs its own."""
    import copy

    import torch

    from tandem.model.loader import load_model

    model = load_model(tiny_model_dir("llama"), progress=False).model
    tokens, start = torch.tensor([[1, 2, 3]]), torch.zeros(1, dtype=torch.int32)
    tables = torch.arange(1, 3, dtype=torch.int32)[None]
    before = model.forward(tokens, start, model.new_cache(4, 16), tables).logits
    twin = copy.deepcopy(model)
    assert torch.equal(twin.forward(tokens, start, twin.new_cache(4, 16), tables).logits, before)
