"""The one place that turns a drafter's name into a drafter."""
from __future__ import annotations

DRAFTERS = ("none", "ngram", "draft-model", "dflash")
RANK_DRAFTERS = ("draft-model", "dflash")  # drafters with a model: they live on shard rank 0


def check_drafter_name(name: str) -> str:
    from tandem.errors import InvalidRequestError

    if name not in DRAFTERS:
        raise InvalidRequestError("drafter", f"unknown drafter {name!r}; choose one of {', '.join(DRAFTERS)}")
    return name


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

    return RankDrafterProxy(group, name)


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
