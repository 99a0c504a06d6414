"""The DFlash drafter's LM head: the target's head rows its drafts may come from (all, or
the checkpoint's draft vocabulary), computed as the target computes them.

The head is most of a CPU propose: the shipped drafter's 20736 rows x 576 in bf16 are 24 MB
read per block, ~2 ms of a ~6.5 ms propose on 2 cores (the target's forward has just
pushed them out of cache). Where the target's head runs as int8 (a quantized target on a
CPU with int8 dot products, tandem.model.quant.cpu_int8), the drafter's takes the same
codes and scales of its rows: half the bytes again, and the logits the target's own head
would give those rows. Elsewhere it is the target's dequantized weight in the drafter's
dtype, packed for oneDNN on a CPU (or the target's module itself where nothing differs).
"""
from __future__ import annotations

import torch
from torch import nn

from tandem.model.cpu_linear import PackedDraftLinear, onednn_available
from tandem.model.quant import linear_weight
from tandem.model.quant.cpu_int8 import Int8CpuKernel
from tandem.model.quant.linear import QuantizedLinear


class Int8Rows:
    """Rows of an int8 head: float32 logits of float or bf16 hidden rows."""

    def __init__(self, kernel: Int8CpuKernel, rows: torch.Tensor | None):
        state = kernel.state()
        if rows is not None:
            state = {**state, "q": state["q"][rows].contiguous(), "scale": state["scale"][rows].contiguous(),
                     "keep_weight": torch.tensor(False)}
            if "bias" in state:
                state["bias"] = state["bias"][rows].contiguous()
        self.kernel = Int8CpuKernel.from_state(state)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.kernel(hidden.float())


def draft_head(target_head: nn.Module, draft_vocab: torch.Tensor | None, dtype: torch.dtype):
    """What DFlashDraftModel.logits multiplies the drafter's rows by: a callable (a module or
    Int8Rows) or a 2-D weight."""
    kernel = target_head.kernel if isinstance(target_head, QuantizedLinear) else None
    if isinstance(kernel, Int8CpuKernel):
        return Int8Rows(kernel, None if draft_vocab is None else draft_vocab.cpu())
    head = linear_weight(target_head)
    if draft_vocab is not None:
        return _rows(head[draft_vocab].to(dtype))
    if head.dtype != dtype:  # e.g. a bf16 drafter beside a float32 target on a CPU
        return _rows(head.to(dtype))
    return target_head


def _rows(weight: torch.Tensor):
    """The head rows as a packed linear layer on a CPU (oneDNN, see PackedDraftLinear), else
    the 2-D weight."""
    if weight.device.type != "cpu" or not onednn_available():
        return weight
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    layer.weight = nn.Parameter(weight, requires_grad=False)
    layer.__class__ = PackedDraftLinear
    return layer
