"""int8 weights x int8 activations on the CPU, through oneDNN (VNNI or AMX where the CPU has them).

Weights: symmetric, one scale per output channel, 8 bits. On a CPU without VNNI, oneDNN
multiplies u8 x s8 pairs into int16 (vpmaddubsw), which saturates for 8-bit weights; it
picks its kernel by the GEMM's shape, so on some CPUs one shape saturates and another does
not. A probe (not the CPU's name) multiplies known integers at many shapes: where 8-bit
weights are not exact at all of them the weights take 7 bits, and where 7 bits are not
exact either the int8 kernel is not offered (available() is False, unusable() says why).
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
_fast: list[bool] = []


def _has_op() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")


def available() -> bool:
    """oneDNN's int8 GEMM is in this torch and exact on this CPU (weight_max() > 0)."""
    return _has_op() and weight_max() > 0


def fast() -> bool:
    """Whether this CPU has int8 dot-product instructions (x86: VNNI or AMX; other CPUs are
    taken to). Without them oneDNN's int8 GEMM is slower than float32: the default model's
    LM head at one row took 27 ms against 7.7 on an AMD EPYC with AVX2 only. From the CPU's
    flags, not a timing: a choice that changes the text must not change with the load."""
    if not _fast:  # read once a process
        from tandem.model.paged_attention_cpu import cpu_flags

        flags = cpu_flags().split()
        x86 = bool(flags) and flags[0] in ("x86_64", "AMD64", "i686")
        _fast.append(not x86 or bool({"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags)))
    return _fast[0]


def unusable() -> str | None:
    """Why the int8 kernel is not offered here, or None where it is."""
    if not _has_op():
        return "this torch build lacks oneDNN's int8 GEMM"
    if weight_max() == 0:
        return ("oneDNN's int8 GEMM is not exact on this CPU even for 7-bit weights, so a row's "
                "output would depend on the rows beside it")
    return None


# The shapes the probe multiplies at: row counts of a decode, a verify and a prefill chunk,
# (in, out) sizes small and model-sized; oneDNN chooses its kernel by them.
PROBE_ROWS = (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 40, 64)
PROBE_SIZES = ((64, 16), (256, 16), (128, 96), (576, 96), (576, 960), (1536, 64))


def _gemm(x: torch.Tensor, packed, scale: torch.Tensor) -> torch.Tensor:
    zero_points = torch.zeros(scale.numel(), dtype=torch.int64)
    return torch.ops.onednn.qlinear_pointwise(x, 1.0, 0, packed, scale, zero_points, None, 1.0, 0,
                                             torch.float32, "none", [], "")


def exact_for(most: int) -> bool:
    """Whether the GEMM gives float32(float32(x @ w.T) * scale) exactly for weights in
    [-most, most], at every probed shape. The values include the ones that saturate an int16
    pair sum: rows of the largest codes, and small positive activations (a u8 just above 128)
    against adjacent large weights of one sign, as SmoothQuant's scaled weights have."""
    gen = torch.Generator().manual_seed(0)
    for k, n in PROBE_SIZES:
        w = torch.randint(-most, most + 1, (n, k), generator=gen, dtype=torch.int8)
        w[0], w[1] = most, -most
        w[2, 0::2], w[2, 1::2] = most, -most
        scale = torch.rand(n, generator=gen) + 0.5
        packed = torch.ops.onednn.qlinear_prepack(w, None)
        for m in PROBE_ROWS:
            x = torch.randint(-127, 128, (m, k), generator=gen, dtype=torch.int8)
            x[0] = 127
            x[m // 2, : k // 2] = 3
            x[-1, k // 2:] = -127
            want = ((x.double() @ w.double().t()).float() * scale)
            if not torch.equal(_gemm(x, packed, scale), want):
                return False
    return True


def weight_max() -> int:
    """127 where oneDNN's int8 GEMM is exact for 8-bit weights on this CPU, 63 where only for
    7-bit ones, 0 where for neither."""
    if not _weight_max:
        _weight_max.append(next((most for most in (127, 63) if exact_for(most)), 0) if _has_op() else 0)
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
