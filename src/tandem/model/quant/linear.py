"""QuantizedLinear, and quantize_model: a finished LlamaForCausalLM's linear layers turned
into quantized ones in place, from outside (as tensor_parallel.shard_model narrows them).

Run after any tensor-parallel sharding: each rank quantizes its own share. Scales are per
output channel (or per group along the input), so a column-parallel shard quantizes to
exactly the rows of the whole; a row-parallel one gets its own channel scales.
Module objects are kept (their class swapped), so forward hooks such as the tensor-parallel
all-reduce stay on them. The float weights are dropped: a model loaded from the cache then
holds only the quantized copy (the embedding's float rows are read a token at a time).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from tandem.model.cpu_linear import FusedLinears

Kernel = Callable[[torch.Tensor], torch.Tensor]


class QuantizedLinear(nn.Module):
    """An nn.Linear whose weight is held by a quantized kernel (in_features / out_features kept).
    A layer fused with its neighbours (q/k/v, gate/up) has no kernel of its own: its
    FusedLinears runs them as one."""

    kernel = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is None:
            raise RuntimeError("this quantized layer runs inside its FusedLinears (q/k/v or gate/up)")
        return self.kernel(x)

    def dequantized_weight(self) -> torch.Tensor:
        """The weight as the kernel computes with it, [out, in] float32 (the DFlash drafter's head)."""
        return self.kernel.dequantize()

    def extra_repr(self) -> str:
        kind = self.kernel.name if self.kernel is not None else "fused"
        return f"in_features={self.in_features}, out_features={self.out_features}, {kind}"


def linear_weight(layer: nn.Module) -> torch.Tensor:
    """A linear layer's weight [out, in]: the parameter, or a quantized layer's dequantized one."""
    return layer.dequantized_weight() if isinstance(layer, QuantizedLinear) else layer.weight


def _to_quantized(layer: nn.Linear, kernel) -> None:
    for name in ("weight", "bias"):
        if name in layer._parameters:
            del layer._parameters[name]
    layer.__class__ = QuantizedLinear
    layer.kernel = kernel


def _bias_of(layers) -> torch.Tensor | None:
    biases = [layer.bias for layer in layers]
    if all(b is None for b in biases):
        return None
    return torch.cat([b.detach() if b is not None else layer.weight.new_zeros(layer.out_features)
                      for b, layer in zip(biases, layers)])


def quantize_model(model, make_kernel, input_absmax: dict[str, torch.Tensor] | None = None) -> int:
    """Swap every linear layer of `model` (decoder layers and the LM head) for a QuantizedLinear
    built by `make_kernel(weight, bias, keep_weight, input_absmax)` (input_absmax: the layer's
    calibrated max |input| per channel, or None); returns the quantized bytes."""
    amax = input_absmax or {}
    total = 0
    for i, layer in enumerate(model.model.layers):
        for key, fused in (("qkv", layer.self_attn.qkv), ("gate_up", layer.mlp.gate_up)):
            total += _quantize_fused(fused, make_kernel, amax.get(f"{i}.{key}"))
        for key, linear in (("o", layer.self_attn.o_proj), ("down", layer.mlp.down_proj)):
            kernel = make_kernel(linear.weight, linear.bias, False, amax.get(f"{i}.{key}"))
            _to_quantized(linear, kernel)
            total += kernel.nbytes
    head = model.lm_head
    kernel = make_kernel(head.weight, head.bias, True, amax.get("head"))  # kept whole: DFlash reads its rows
    _to_quantized(head, kernel)
    return total + kernel.nbytes


def _quantize_fused(fused: FusedLinears, make_kernel, input_absmax) -> int:
    layers = fused.layers
    weight = torch.cat([layer.weight.detach() for layer in layers])
    kernel = make_kernel(weight, _bias_of(layers), False, input_absmax)
    del weight
    fused.quantized = kernel
    fused._sizes = [layer.out_features for layer in layers]
    for layer in layers:
        _to_quantized(layer, None)
    fused._shared = None  # a GPU model's end-to-end weight tensor: no longer read
    return kernel.nbytes
