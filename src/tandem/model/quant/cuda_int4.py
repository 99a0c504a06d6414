"""int4 weights (groups of 64, a scale and a zero each) x bfloat16 activations on a GPU,
through torch's tinygemm kernel (_weight_int4pack_mm): a quarter of bf16's bytes for a
small-batch decode, at the cost of dequantizing in the GEMM."""
from __future__ import annotations

import torch

from tandem.model.quant.cpu_int4 import quantize_groups

GROUP = 64


def available(device: torch.device) -> bool:
    return device.type == "cuda" and hasattr(torch.ops.aten, "_weight_int4pack_mm")


def _inner_k_tiles(k: int) -> int:
    for tiles in (8, 4, 2):
        if k % (tiles * 16) == 0:
            return tiles
    raise ValueError(f"int4 on a GPU needs in_features divisible by 32, got {k}")


class Int4CudaKernel:
    name = "int4"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, keep_weight: bool = False):
        self.out_features, self.in_features = weight.shape
        if self.in_features % GROUP:
            raise ValueError(f"int4 needs in_features divisible by {GROUP}, got {self.in_features}")
        q, scale, low = quantize_groups(weight.detach(), GROUP)
        pairs = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)  # two 4-bit values a byte, high nibble first
        self.packed = torch.ops.aten._convert_weight_to_int4pack(pairs.contiguous(), _inner_k_tiles(self.in_features))
        # the kernel computes (q - 8) * scale + zero
        self.scales_and_zeros = torch.stack([scale, low + 8 * scale], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)
        self.nbytes = self.packed.numel() * self.packed.element_size() + self.scales_and_zeros.numel() * 2
        self.q = q.to(torch.uint8) if keep_weight else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        if rows.shape[0] == 0:
            return x.new_zeros(*lead, self.out_features)
        out = torch.ops.aten._weight_int4pack_mm(rows, self.packed, GROUP, self.scales_and_zeros)
        if self.bias is not None:
            out = out + self.bias
        return out.view(*lead, self.out_features).to(x.dtype)

    def dequantize(self) -> torch.Tensor:
        if self.q is None:
            raise RuntimeError("this int4 layer keeps only its packed weight")
        sz = self.scales_and_zeros.float().transpose(0, 1)
        q = self.q.float().view(self.out_features, -1, GROUP)
        return ((q - 8) * sz[..., :1] + sz[..., 1:]).view(self.out_features, self.in_features)
