"""int8 weights x int8 activations on the CPU, through oneDNN (VNNI or AMX where the CPU has them).

Weights: symmetric, one scale per output channel, 8 bits. On a CPU without VNNI (AVX2
only), oneDNN multiplies u8 x s8 pairs into int16 (vpmaddubsw), which saturates for
8-bit weights: there (found by a probe, not by CPU name) the weights take 7 bits.
Activations: symmetric, one scale per row (absmax / 127), computed at every call, after
SmoothQuant's per-channel division (calibrate.py) where the layer was calibrated.
The GEMM accumulates in int32, exactly, and each row's scales are its own: a row's output
does not depend on the other rows of the batch, so a verify of k rows and k one-row
decodes give the same picks (greedy speculation stays exact on this target).
"""
from __future__ import annotations

import torch

from tandem.model.quant.calibrate import smoothing

ACTIVATION_MAX = 127
_weight_max: list[int] = []


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")


def weight_max() -> int:
    """127 where oneDNN's int8 GEMM is exact for 8-bit weights on this CPU, else 63."""
    if not _weight_max:
        w = torch.full((16, 256), 127, dtype=torch.int8)
        x = torch.full((2, 256), 127, dtype=torch.int8)
        out = torch.ops.onednn.qlinear_pointwise(x, 1.0, 0, torch.ops.onednn.qlinear_prepack(w, None),
                                                 torch.ones(16), torch.zeros(16, dtype=torch.int64), None, 1.0, 0,
                                                 torch.float32, "none", [], "")
        _weight_max.append(127 if torch.all(out == 127 * 127 * 256) else 63)
    return _weight_max[0]


def quantize_rows(x: torch.Tensor, most: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: (q [M, K] int8, scale [M, 1] float32) with x ~ q * scale."""
    scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-30) / most
    return torch.round(x / scale).clamp_(-most, most).to(torch.int8), scale


class Int8CpuKernel:
    """y = x @ W.T + b with W held as 7-bit int8 (per channel) in oneDNN's packed layout."""

    name = "int8"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, keep_weight: bool = False,
                 input_absmax: torch.Tensor | None = None):
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        self.inv_smooth = None
        if input_absmax is not None:
            smooth = smoothing(input_absmax, w)
            w = w * smooth
            self.inv_smooth = (1 / smooth).contiguous()
        q, scale = quantize_rows(w, weight_max())
        self._set(q, scale.view(-1).contiguous(), None if bias is None else bias.detach().float().contiguous(),
                  keep_weight)

    def _set(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, keep_weight: bool) -> None:
        self.scale = scale  # [N]
        self.packed = torch.ops.onednn.qlinear_prepack(q, None)
        self.zero_points = torch.zeros(self.out_features, dtype=torch.int64)
        self.bias = bias
        self.q = q if keep_weight else None  # for dequantize(): the tied embedding's rows, DFlash's head
        self.nbytes = q.numel() + self.scale.numel() * 4

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features).float()
        if rows.shape[0] == 0:
            return x.new_zeros(*lead, self.out_features)
        if self.inv_smooth is not None:
            rows = rows * self.inv_smooth
        xq, xs = quantize_rows(rows, ACTIVATION_MAX)
        out = torch.ops.onednn.qlinear_pointwise(xq, 1.0, 0, self.packed, self.scale, self.zero_points, None, 1.0, 0,
                                                 torch.float32, "none", [], "")
        out.mul_(xs)
        if self.bias is not None:
            out.add_(self.bias)
        return out.view(*lead, self.out_features).to(x.dtype)

    def dequantize(self) -> torch.Tensor:
        if self.q is None:
            raise RuntimeError("this int8 layer keeps only its packed weight")
        w = self.q.float() * self.scale[:, None]
        return w * self.inv_smooth if self.inv_smooth is not None else w

    def state(self) -> dict[str, torch.Tensor]:
        """The tensors from_state rebuilds this kernel from, bit for bit (quant.packed_cache).
        The pack is an opaque oneDNN tensor: its int8 weight is read back from it ([K, N])."""
        q = self.q if self.q is not None else self.packed.to_dense().t().contiguous()
        if q.shape != (self.out_features, self.in_features):
            raise ValueError(f"the packed int8 weight reads back as {tuple(q.shape)}, not "
                             f"{(self.out_features, self.in_features)}")
        state = {"q": q, "scale": self.scale, "keep_weight": torch.tensor(self.q is not None)}
        state.update((name, t) for name, t in (("bias", self.bias), ("inv_smooth", self.inv_smooth)) if t is not None)
        return state

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> "Int8CpuKernel":
        kernel = cls.__new__(cls)
        q = state["q"]
        kernel.out_features, kernel.in_features = q.shape
        kernel.inv_smooth = state.get("inv_smooth")
        kernel._set(q, state["scale"], state.get("bias"), bool(state["keep_weight"]))
        return kernel
