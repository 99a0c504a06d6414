"""Float32 linear layers on the CPU through oneDNN, with each weight packed once.

PyTorch sends a float32 `nn.Linear` on the CPU to MKL's sgemm, which on a non-Intel CPU
(this AMD EPYC) takes a generic code path. oneDNN's inner product, with the weight
reordered once into its blocked layout, does the same float32 maths 2-4x faster; on the
2-core dev machine (SmolLM2-135M, minimum of 8 runs, 2 threads) a 1-row forward went
from ~60 to ~19 ms and a 40-row one from ~170 to ~57 ms. Only the summation order
differs from MKL's, as between any two GEMMs (no reduced-precision mode is used).

Applied to a finished model from outside, as tensor_parallel is: `pack_linear_layers`
turns every nn.Linear into a PackedLinear (same parameters, hooks and names). The pack
is made lazily at the first eligible forward and remade whenever the weight tensor is
replaced (tensor_parallel.shard_model does that), so it may run before or after
sharding. Anything else (a GPU, bf16, autograd) takes the ordinary F.linear path.

Memory: the pack is a second copy of the weight. A model loaded by the loader keeps its
float32 weights as read-only pages of the cached safetensors file, which the kernel can
drop again once the forward only reads the pack.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# oneDNN picks the packed layout for an expected row count; 64 served 1..256 rows well.
PACK_ROWS_HINT = 64


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


class PackedLinear(nn.Linear):
    """nn.Linear whose float32 CPU inference forward runs oneDNN on a packed weight."""

    _packed: torch.Tensor | None = None  # the weight in oneDNN's blocked layout
    _packed_from: tuple = (None, -1)  # (the weight tensor it was made from, that tensor's version)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (w.device.type != "cpu" or w.dtype != torch.float32 or x.dtype != torch.float32
                or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))):
            return F.linear(x, w, self.bias)
        source, version = self._packed_from
        if source is not w or version != _version(w):
            self._packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS_HINT)
            self._packed_from = (w, _version(w))  # a tuple, so nn.Module does not register it
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")


def _version(t: torch.Tensor) -> int:
    try:
        return t._version  # bumped by every in-place change (load_state_dict's copy_, ...)
    except RuntimeError:  # an inference-mode tensor keeps no version counter
        return 0


def pack_linear_layers(model: nn.Module) -> int:
    """Make every plain nn.Linear of `model` a PackedLinear in place; returns how many.
    A no-op where oneDNN is missing."""
    if not onednn_available():
        return 0
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = PackedLinear
            count += 1
    return count
