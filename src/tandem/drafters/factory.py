"""The one place that turns a drafter's name into a drafter."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

DRAFTERS = ("none", "ngram", "draft-model", "dflash")
RANK_DRAFTERS = ("draft-model", "dflash")  # drafters with a model: they live on shard rank 0


def check_drafter_name(name: str) -> str:
    from tandem.errors import InvalidRequestError

    if name not in DRAFTERS:
        raise InvalidRequestError("drafter", f"unknown drafter {name!r}; choose one of {', '.join(DRAFTERS)}")
    return name


def resolve_dflash_checkpoint(model: str | None, checkpoint: str | None) -> tuple[str, int]:
    """(absolute folder, block_size) of the DFlash checkpoint an engine on `model` loads:
    `checkpoint`, or the weights shipped for the model when it is None. Reads only the
    folder's config.json; InvalidRequestError naming dflash_checkpoint when it does not fit."""
    from tandem.drafters.dflash import DFlashConfig, shipped_checkpoint
    from tandem.errors import InvalidRequestError
    from tandem.model.loader import model_name

    field = "dflash_checkpoint"
    if checkpoint is None:
        try:
            folder = shipped_checkpoint(model_name(model))
        except ValueError as e:
            raise InvalidRequestError(field, str(e)) from None
    else:
        folder = os.path.abspath(os.path.expanduser(checkpoint))
        if not os.path.isdir(folder):
            raise InvalidRequestError(field, f"{checkpoint!r} is not a folder (give a DFlash checkpoint folder)")
    config_path = os.path.join(folder, "config.json")
    has_weights = any(name.endswith(".safetensors") for name in os.listdir(folder))
    if not os.path.isfile(config_path) or not has_weights:
        raise InvalidRequestError(field, f"{folder!r} is not a DFlash checkpoint (it needs config.json and *.safetensors)")
    try:
        with open(config_path) as f:
            config = DFlashConfig.from_dict(json.load(f))
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # JSONDecodeError is a ValueError
        raise InvalidRequestError(field, f"{folder!r} is not a DFlash checkpoint: {type(e).__name__}: {e}") from None
    return folder, config.block_size


def build_drafter(name: str, group, *, ngram_max: int = 4, ngram_min: int = 1):
    """The scheduler-side drafter for `name` (None for "none")."""
    check_drafter_name(name)
    if name == "none":
        return None
    if name == "ngram":
        from tandem.drafters.ngram import NgramDrafter

        return NgramDrafter(max_ngram=ngram_max, min_ngram=ngram_min)
    if group.limits.drafter != name:
        raise ValueError(f"drafter {name!r} needs shard ranks built with it; the group has {group.limits.drafter!r}")
    from tandem.drafters.rank_proxy import RankDrafterProxy

    return RankDrafterProxy(group, name, whole_blocks=name == "dflash")


@dataclass(frozen=True)
class RankDrafterInfo:
    """What a rank's rank-side drafter was built from (InitReply.drafter on the wire)."""

    kind: str = "none"
    source: str = ""  # the DFlash checkpoint folder, or the draft model spec
    max_drafts: int = 0  # the most drafts a propose gives a sequence; 0 = no cap


def rank_drafter_info(spec, drafter) -> RankDrafterInfo:
    """The RankDrafterInfo of `drafter` (None on ranks > 0), built from ShardSpec `spec`."""
    if drafter is None:
        return RankDrafterInfo()
    if spec.drafter == "dflash":
        return RankDrafterInfo("dflash", drafter.checkpoint, drafter.block_size - 1)
    return RankDrafterInfo(spec.drafter, spec.draft_model or "", 0)


def build_rank_drafter(spec, target, *, device, dtype, progress: bool = True):
    """The rank-side drafter of a ShardSpec, beside the loaded target `target`."""
    from tandem.model.kv_cache import KVCache
    from tandem.model.loader import load_model

    check_drafter_name(spec.drafter)
    if spec.drafter == "draft-model":
        from tandem.drafters.draft_model import DraftModelDrafter

        if not spec.draft_model:
            raise ValueError("drafter 'draft-model' needs draft_model (a model spec sharing the target's tokenizer)")
        draft = load_model(spec.draft_model, dtype=dtype, device=device, progress=progress)
        if draft.tokenizer.get_vocab() != target.tokenizer.get_vocab():
            raise ValueError(f"draft model {spec.draft_model!r} does not share the target's tokenizer")
        c = draft.config
        cache = KVCache(c.num_layers, spec.num_slots, spec.max_seq_len, c.num_kv_heads, c.head_dim, dtype, device)
        return DraftModelDrafter(draft.model, cache, target_vocab=target.config.vocab_size)
    if spec.drafter == "dflash":
        from tandem.drafters.dflash import build_dflash_drafter

        return build_dflash_drafter(spec, target, device=device, dtype=dtype)
    raise ValueError(f"drafter {spec.drafter!r} does not live on a shard rank")
