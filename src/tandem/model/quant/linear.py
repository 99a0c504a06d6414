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

from dataclasses import dataclass
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


@dataclass(frozen=True)
class Site:
    """One quantized kernel's place in the model: a linear layer, or the layers a FusedLinears
    runs as one (q/k/v, gate/up). Keyed as calibrate.input_absmax keys its inputs."""

    key: str
    layers: tuple[nn.Linear, ...]
    fused: FusedLinears | None = None
    keep_weight: bool = False  # the LM head: kept whole, DFlash reads its rows

    @property
    def shape(self) -> tuple[int, int]:
        return sum(layer.out_features for layer in self.layers), self.layers[0].in_features

    @property
    def has_bias(self) -> bool:
        return any(layer.bias is not None for layer in self.layers)

    def weight_and_bias(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.fused is None:
            return self.layers[0].weight, self.layers[0].bias
        return torch.cat([layer.weight.detach() for layer in self.layers]), _bias_of(self.layers)


def linear_sites(model) -> list[Site]:
    """Every kernel site of `model` (decoder layers, then the LM head), in a fixed order."""
    sites = []
    for i, layer in enumerate(model.model.layers):
        for key, fused in (("qkv", layer.self_attn.qkv), ("gate_up", layer.mlp.gate_up)):
            sites.append(Site(f"{i}.{key}", tuple(fused.layers), fused))
        for key, linear in (("o", layer.self_attn.o_proj), ("down", layer.mlp.down_proj)):
            sites.append(Site(f"{i}.{key}", (linear,)))
    sites.append(Site("head", (model.lm_head,), keep_weight=True))
    return sites


def quantize_model(model, make_kernel: Callable[[Site], Kernel], sites: list[Site] | None = None) -> dict[str, Kernel]:
    """Swap every linear layer of `model` for a QuantizedLinear whose kernel is
    `make_kernel(site)`, one site at a time (each float weight is dropped as its kernel takes
    its place); returns {site key: kernel}."""
    kernels = {}
    for site in sites if sites is not None else linear_sites(model):
        kernel = make_kernel(site)
        _install(site, kernel)
        kernels[site.key] = kernel
    return kernels


def _install(site: Site, kernel) -> None:
    if site.fused is None:
        _to_quantized(site.layers[0], kernel)
        return
    fused = site.fused
    fused.quantized = kernel
    fused._sizes = [layer.out_features for layer in site.layers]
    for layer in site.layers:
        _to_quantized(layer, None)
    fused._shared = None  # a GPU model's end-to-end weight tensor: no longer read
