"""DFlash: a block-diffusion drafter conditioned on the target's hidden states.

model.py       the draft model (config in the z-lab layout, layers, context projection)
checkpoint.py  load / save checkpoint folders; the weights shipped for the default model
drafter.py     the rank-side drafter: context cache per slot, batched block propose
masked_picks.py  a constrained sequence's drafts picked under its grammar from its block's logits
"""
from __future__ import annotations

import logging
import os

import torch

from tandem.drafters.dflash.checkpoint import load_dflash_checkpoint, save_dflash_checkpoint, shipped_checkpoint
from tandem.drafters.dflash.drafter import DFlashDrafter
from tandem.drafters.dflash.model import DFlashConfig, DFlashDraftModel
from tandem.model.cpu_linear import PackedDraftLinear, pack_linear_layers

log = logging.getLogger("tandem.drafters.dflash")

__all__ = [
    "DFlashConfig",
    "DFlashDraftModel",
    "DFlashDrafter",
    "build_dflash_drafter",
    "load_dflash_checkpoint",
    "save_dflash_checkpoint",
    "shipped_checkpoint",
]


def _cpu_has_bf16_matmul() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX), where a bf16 GEMM
    reads half the bytes of a float32 one and runs several times faster."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def dflash_dtype(device, dtype: torch.dtype, forced: str | None = None) -> torch.dtype:
    """The drafter's dtype beside a target of `dtype`: the target's, except a float32 target
    on a CPU with native bf16 matmuls, where the drafter (trained and shipped in bf16) runs
    in bf16: its LM head rows alone are a third of a target step's bytes in float32.
    `forced` (ShardSpec.dflash_dtype: float32, bfloat16) overrides. The drafter's dtype
    changes which drafts come, never the output: the target verifies every draft."""
    if forced:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[forced]
    if torch.device(device).type == "cpu" and dtype == torch.float32 and _cpu_has_bf16_matmul():
        return torch.bfloat16
    return dtype


def build_dflash_drafter(spec, target, *, device, dtype, num_blocks: int) -> DFlashDrafter:
    """The DFlash drafter of a ShardSpec beside the loaded target (a LoadedModel):
    spec.dflash_checkpoint, or the weights shipped for the target when that is None."""
    folder = spec.dflash_checkpoint or shipped_checkpoint(target.name)
    model = load_dflash_checkpoint(folder, dtype=dflash_dtype(device, dtype, spec.dflash_dtype), device=device)
    if torch.device(device).type == "cpu":
        pack_linear_layers(model, PackedDraftLinear)  # its small GEMMs: oneDNN on packed weights
    trained_for = model.config.extra.get("tandem", {}).get("target_model")
    if trained_for and trained_for != target.name:
        log.warning("DFlash checkpoint %s was trained for %r, the target is %r: expect few accepted drafts",
                    folder, trained_for, target.name)
    from tandem.grammar.draft_matchers import DraftMatchers

    # constrained sequences draft under their grammar, with the target's tokenizer (the
    # scheduler's); a target without one takes no grammars
    matchers = (DraftMatchers(target.tokenizer, target.config.vocab_size, target.eos_token_ids)
                if target.tokenizer is not None else None)
    # its context lies in blocks of the target's pool's layout (num_blocks of the rank's pool)
    drafter = DFlashDrafter(model, target.model, num_slots=spec.num_slots, num_blocks=num_blocks,
                            block_size=spec.block_size, max_seq_len=spec.max_model_len,
                            cuda_graphs=None if spec.dflash_cuda_graphs else False, matchers=matchers)
    drafter.checkpoint = os.path.abspath(folder)  # what the shard reports it loaded
    return drafter
