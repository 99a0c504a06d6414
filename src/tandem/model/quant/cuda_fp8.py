"""FP8 (E4M3) weights x FP8 activations on a GPU with FP8 tensor cores (Hopper and later):
one scale per weight channel and one per activation row, so a row's output does not depend
on the other rows of the batch (what greedy speculation relies on, as for bf16). A 1-row
decode reads one byte a weight, half of bf16's.

The GEMM runs through torch._scaled_mm with unit scales (cuBLASLt), the two scales applied
to its bfloat16 output after (cuda_fp8_triton.py): torch's own row-wise-scaled kernel was
no faster than bf16 at the few rows of a decode.
"""
from __future__ import annotations

import torch

E4M3_MAX = 448.0


def available(device: torch.device) -> bool:
    return (device.type == "cuda" and hasattr(torch, "float8_e4m3fn")
            and torch.cuda.get_device_capability(device) >= (8, 9))


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row E4M3: (q [M, K] float8_e4m3fn, scale [M, 1] float32), x ~ q * scale."""
    scale = x.abs().amax(-1, keepdim=True).float().clamp_min(1e-12) / E4M3_MAX
    return (x.float() / scale).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


class Fp8CudaKernel:
    name = "fp8"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, keep_weight: bool = False):
        self.out_features, self.in_features = weight.shape
        if self.in_features % 16 or self.out_features % 16:
            raise ValueError(f"fp8 needs both sizes of a weight divisible by 16, got {tuple(weight.shape)}")
        q, scale = quantize_rows_fp8(weight.detach())
        self.weight_t = q.t()  # [K, N], column-major: the layout _scaled_mm reads for its second operand
        self.scale = scale.view(1, -1).contiguous()  # [1, N]
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)
        self.unit = torch.ones((), dtype=torch.float32, device=weight.device)
        self.nbytes = q.numel() + self.scale.numel() * 4
        self.keep = keep_weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] == 0:
            return x.new_zeros(*lead, self.out_features)
        from tandem.model.quant import cuda_fp8_triton

        xq, xs = cuda_fp8_triton.quantize_rows(rows.contiguous())
        out = torch._scaled_mm(xq, self.weight_t, scale_a=self.unit, scale_b=self.unit, out_dtype=torch.bfloat16)
        cuda_fp8_triton.scale_out(out, xs, self.scale.view(-1), self.bias)
        return out.view(*lead, self.out_features).to(x.dtype)

    def dequantize(self) -> torch.Tensor:
        return self.weight_t.t().float() * self.scale.view(-1, 1)
