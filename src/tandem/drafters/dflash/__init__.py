"""DFlash: a block-diffusion drafter conditioned on the target's hidden states.

model.py       the draft model (config in the z-lab layout, layers, context projection)
checkpoint.py  load / save checkpoint folders; the weights shipped for the default model
drafter.py     the rank-side drafter: context cache per slot, batched block propose
"""
from __future__ import annotations

import logging

from tandem.drafters.dflash.checkpoint import load_dflash_checkpoint, save_dflash_checkpoint, shipped_checkpoint
from tandem.drafters.dflash.drafter import DFlashDrafter
from tandem.drafters.dflash.model import DFlashConfig, DFlashDraftModel

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


def build_dflash_drafter(spec, target, *, device, dtype) -> DFlashDrafter:
    """The DFlash drafter of a ShardSpec beside the loaded target (a LoadedModel):
    spec.dflash_checkpoint, or the weights shipped for the target when that is None."""
    folder = getattr(spec, "dflash_checkpoint", None) or shipped_checkpoint(target.name)
    model = load_dflash_checkpoint(folder, dtype=dtype, device=device)
    trained_for = model.config.extra.get("tandem", {}).get("target_model")
    if trained_for and trained_for != target.name:
        log.warning("DFlash checkpoint %s was trained for %r, the target is %r: expect few accepted drafts",
                    folder, trained_for, target.name)
    return DFlashDrafter(model, target.model, num_slots=spec.num_slots, max_seq_len=spec.max_seq_len)
