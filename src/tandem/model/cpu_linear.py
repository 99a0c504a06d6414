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

    reduced = False  # bf16 weights too (PackedDraftLinear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if not _packable(w, x, self.reduced):
            return F.linear(x, w, self.bias)
        source, version = self._packed_from
        if source is not w or version != _version(w):
            self._packed = _pack(w)
            self._packed_from = (w, _version(w))  # a tuple, so nn.Module does not register it
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")

    def __getstate__(self):
        # the pack is an opaque oneDNN tensor (no storage to copy): a copy packs its own lazily
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        return {k: v for k, v in state.items() if k not in ("_packed", "_packed_from")}


class FusedLinears:
    """Several linear layers that read the same input (q/k/v, gate/up) as ONE GEMM.

    On the CPU (float32) one packed GEMM: at 40 rows one wide GEMM runs 10-20% faster
    than three narrow ones, and a 192-wide k or v projection alone reaches only half of
    the wide one's GFLOPS. On a GPU, after share_storage(), one GEMM over the layers'
    weights laid end to end in one tensor: a small-batch forward there is launch-bound,
    so a kernel saved is time saved.

    Held by the parent module as a plain attribute; the layers keep their own parameters
    (so loading and tensor-parallel sharding see nothing new), and the fused pack is
    remade whenever one of their weights is replaced or changed. Elsewhere (autograd, a
    layer whose weight was replaced after share_storage) each layer runs on its own."""

    def __init__(self, *layers: nn.Linear):
        self.layers = layers
        self._packed: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None
        self._sizes: list[int] = []
        self._packed_from: tuple = ()
        self._shared: tuple[torch.Tensor, torch.Tensor | None, tuple] | None = None  # (weight, bias, the layers' weights)
        self.quantized = None  # the layers as one quantized kernel (model.quant), which then holds their weights

    def __getstate__(self):
        # as PackedLinear's: the opaque pack is not copied, a copy makes its own
        return {**self.__dict__, "_packed": None, "_packed_from": ()}

    def share_storage(self) -> None:
        """Lay the layers' weights (and biases) end to end in one tensor, each layer keeping a
        view of its rows: no second copy. The fused GEMM then reads that tensor whole."""
        ws = [layer.weight for layer in self.layers]
        weight = torch.cat([w.detach() for w in ws])
        biases = [layer.bias for layer in self.layers]
        bias = None if all(b is None for b in biases) else torch.cat(
            [b.detach() if b is not None else w.new_zeros(w.shape[0]) for b, w in zip(biases, ws)])
        start = 0
        for layer, w in zip(self.layers, ws):
            rows = slice(start, start + w.shape[0])
            layer.weight = nn.Parameter(weight[rows], requires_grad=False)
            if layer.bias is not None:
                layer.bias = nn.Parameter(bias[rows], requires_grad=False)
            start += w.shape[0]
        self._sizes = [w.shape[0] for w in ws]
        self._shared = (weight, bias, tuple(layer.weight for layer in self.layers))

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = self.joint(x)
        return list(out.split(self._sizes, dim=-1)) if out is not None else [layer(x) for layer in self.layers]

    def joined(self, x: torch.Tensor) -> torch.Tensor:
        """The layers' outputs side by side: one GEMM where fused, else each layer's, joined."""
        out = self.joint(x)
        return out if out is not None else torch.cat([layer(x) for layer in self.layers], dim=-1)

    def joint(self, x: torch.Tensor) -> torch.Tensor | None:
        """The layers' outputs side by side ([..., sum of out_features]) from one GEMM, or None
        where they must run one by one."""
        if self.quantized is not None:
            return self.quantized(x)
        ws = [layer.weight for layer in self.layers]
        shared = self._shared
        if shared is not None and all(w is v for w, v in zip(ws, shared[2])) and not torch.is_grad_enabled():
            return F.linear(x, shared[0], shared[1])
        if not all(type(layer) is PackedLinear and _packable(layer.weight, x) for layer in self.layers):
            return None
        key = tuple((w, _version(w)) for w in ws)
        if len(key) != len(self._packed_from) or any(a[0] is not b[0] or a[1] != b[1] for a, b in zip(key, self._packed_from)):
            self._packed = _pack(torch.cat([w.detach() for w in ws]))
            biases = [layer.bias for layer in self.layers]
            self._bias = None if all(b is None for b in biases) else torch.cat(
                [b.detach() if b is not None else w.new_zeros(w.shape[0]) for b, w in zip(biases, ws)])
            self._sizes = [w.shape[0] for w in ws]
            self._packed_from = key
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self._bias, "none", [], "")


class PackedDraftLinear(PackedLinear):
    """A PackedLinear that packs bf16 weights too: a drafter's layers on a CPU (the DFlash
    drafter's 8-row GEMMs ran in ~23 us packed against ~40 unpacked). Not for a target:
    oneDNN's bf16 GEMM picks its kernel by the row count, so a row's output may depend on
    the rows beside it, which a drafter's may (the target verifies every draft)."""

    reduced = True


_PACKED_DTYPES = {False: (torch.float32,), True: (torch.float32, torch.bfloat16)}  # by `reduced`


def _packable(w: torch.Tensor, x: torch.Tensor, reduced: bool = False) -> bool:
    return (w.device.type == "cpu" and w.dtype in _PACKED_DTYPES[reduced] and x.dtype == w.dtype
            and not (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad)))


def _pack(w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS_HINT)


def _version(t: torch.Tensor) -> int:
    try:
        return t._version  # bumped by every in-place change (load_state_dict's copy_, ...)
    except RuntimeError:  # an inference-mode tensor keeps no version counter
        return 0


def share_fused_storage(model: nn.Module) -> None:
    """share_storage() for every FusedLinears of `model` (a GPU model, after loading and any
    tensor-parallel sharding)."""
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, FusedLinears):
                value.share_storage()


def pack_linear_layers(model: nn.Module, packed: type[PackedLinear] = PackedLinear) -> int:
    """Make every plain nn.Linear of `model` a `packed` in place; returns how many.
    A no-op where oneDNN is missing."""
    if not onednn_available():
        return 0
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = packed
            count += 1
    return count
