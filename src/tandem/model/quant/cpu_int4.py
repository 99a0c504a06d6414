"""int4 weights (groups of 32, a scale and a zero each) x bfloat16 activations on the CPU,
through torch's own kernel (_weight_int4pack_mm_for_cpu).

Half the bytes of int8, so the fastest at one or two rows, but it dequantizes for every
row: at a verify's 40 rows it is 5x slower than the int8 kernel (bench/README). GGUF's
Q4_0 / Q4_1 / Q4_K blocks are groups of 32 with a scale and a minimum, the layout this
kernel reads (the values are rebuilt from the dequantized file, one group at a time).
"""
from __future__ import annotations

import torch

GROUP = 32


def available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def quantize_groups(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit groups along K: (q [N, K] int32 in 0..15, scale [N, K/g], minimum [N, K/g]),
    w ~ q * scale + minimum."""
    n, k = w.shape
    g = w.float().view(n, k // group, group)
    low, high = g.amin(-1), g.amax(-1)
    scale = ((high - low) / 15).clamp_min(1e-30)
    q = torch.round((g - low[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.int32).view(n, k)
    return q, scale, low


class Int4CpuKernel:
    name = "int4"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, keep_weight: bool = False):
        self.out_features, self.in_features = weight.shape
        if self.in_features % GROUP or self.out_features % 16:
            raise ValueError(f"int4 on the CPU needs in_features divisible by {GROUP} and out_features by 16, "
                             f"got {tuple(weight.shape)}")
        q, scale, low = quantize_groups(weight.detach())
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        # the kernel computes (q - 8) * scale + zero
        self.scales_and_zeros = torch.stack([scale, low + 8 * scale], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.q = q.to(torch.uint8) if keep_weight else None
        self.nbytes = self.packed.numel() * self.packed.element_size() + self.scales_and_zeros.numel() * 2

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        if rows.shape[0] == 0:
            return x.new_zeros(*lead, self.out_features)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, GROUP, self.scales_and_zeros).float()
        if self.bias is not None:
            out.add_(self.bias)
        return out.view(*lead, self.out_features).to(x.dtype)

    def dequantize(self) -> torch.Tensor:
        if self.q is None:
            raise RuntimeError("this int4 layer keeps only its packed weight")
        sz = self.scales_and_zeros.float().transpose(0, 1)  # [N, K/g, 2]
        q = self.q.float().view(self.out_features, -1, GROUP)
        return ((q - 8) * sz[..., :1] + sz[..., 1:]).view(self.out_features, self.in_features)

    def state(self) -> dict[str, torch.Tensor]:
        """The tensors from_state rebuilds this kernel from, bit for bit (quant.packed_cache)."""
        state = {"shape": torch.tensor([self.out_features, self.in_features]), "packed": self.packed,
                 "scales_and_zeros": self.scales_and_zeros}
        state.update((name, t) for name, t in (("bias", self.bias), ("q", self.q)) if t is not None)
        return state

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> "Int4CpuKernel":
        kernel = cls.__new__(cls)
        kernel.out_features, kernel.in_features = (int(v) for v in state["shape"])
        kernel.packed, kernel.scales_and_zeros = state["packed"], state["scales_and_zeros"]
        kernel.bias, kernel.q = state.get("bias"), state.get("q")
        kernel.nbytes = kernel.packed.numel() * kernel.packed.element_size() + kernel.scales_and_zeros.numel() * 2
        return kernel
