"""The one place that turns a configured drafter (see drafters.registry) into a drafter:
the scheduler-side one beside the engine, the rank-side one on shard rank 0."""
from __future__ import annotations

from tandem.drafters.registry import drafter_kind
from tandem.shard.commands import RankDrafterInfo


def build_drafter(config, group):
    """The scheduler-side drafter of an EngineConfig (None for "none"): the n-gram drafter,
    or the proxy of a rank-side one, which the group's ranks must carry (behind prompt
    lookup with copy_min_ngram)."""
    kind = drafter_kind(config.drafter)
    if kind.runs == "nowhere":
        return None
    if not kind.on_rank:
        from tandem.drafters.ngram import NgramDrafter

        return NgramDrafter(max_ngram=config.ngram_max, min_ngram=config.ngram_min)
    if group.limits.drafter != kind.name:
        raise ValueError(f"drafter {kind.name!r} needs shard ranks built with it; the group has {group.limits.drafter!r}")
    from tandem.drafters.rank_proxy import RankDrafterProxy

    proxy = RankDrafterProxy(group, kind.name, whole_blocks=kind.whole_blocks)
    copy_min = kind.copy_min_ngram if config.copy_min_ngram is None else config.copy_min_ngram
    if not copy_min:
        return proxy
    from tandem.drafters.copy_first import CopyFirstDrafter

    return CopyFirstDrafter(proxy, min_match=copy_min, max_match=config.ngram_max)


def rank_drafter_info(spec, drafter) -> RankDrafterInfo:
    """The RankDrafterInfo of `drafter` (None on ranks > 0), built from ShardSpec `spec`."""
    if drafter is None:
        return RankDrafterInfo()
    if drafter_kind(spec.drafter).checkpoint is not None:
        return RankDrafterInfo(spec.drafter, drafter.checkpoint, drafter.block_size - 1)
    return RankDrafterInfo(spec.drafter, spec.draft_model or "", 0)


def load_draft_model(spec, target, *, device, dtype, progress: bool = True):
    """The draft model of a ShardSpec (a LoadedModel), checked to share the target's tokenizer."""
    from tandem.model.loader import load_model

    if not spec.draft_model:
        raise ValueError("drafter 'draft-model' needs draft_model (a model spec sharing the target's tokenizer)")
    draft = load_model(spec.draft_model, dtype=dtype, device=device, progress=progress)
    if draft.tokenizer.get_vocab() != target.tokenizer.get_vocab():
        raise ValueError(f"draft model {spec.draft_model!r} does not share the target's tokenizer")
    return draft


def build_rank_drafter(spec, target, *, device, dtype, progress: bool = True, draft=None, num_blocks: int = 0):
    """The rank-side drafter of a ShardSpec, beside the loaded target `target`; a draft
    model (`draft`, loaded already, or loaded here) gets a KV pool of num_blocks blocks."""
    kind = drafter_kind(spec.drafter)
    if not kind.on_rank:
        raise ValueError(f"drafter {spec.drafter!r} does not live on a shard rank")
    if kind.checkpoint is not None:
        from tandem.drafters.dflash import build_dflash_drafter

        return build_dflash_drafter(spec, target, device=device, dtype=dtype, num_blocks=num_blocks)
    from tandem.drafters.draft_model import DraftModelDrafter
    from tandem.grammar.draft_matchers import DraftMatchers
    from tandem.model.kv_cache import PagedKVCache

    draft = draft or load_draft_model(spec, target, device=device, dtype=dtype, progress=progress)
    c = draft.config
    # as many blocks as the target's pool, and a few a slot for the drafts past it
    blocks = max(num_blocks, 1) + 2 * spec.num_slots
    cache = PagedKVCache(c.num_layers, blocks, spec.block_size, c.num_kv_heads, c.head_dim, dtype, device, scratch_blocks=1)
    # constrained sequences draft under their grammar, with the target's tokenizer (the scheduler's)
    matchers = DraftMatchers(target.tokenizer, target.config.vocab_size, target.eos_token_ids)
    return DraftModelDrafter(draft.model, cache, target_vocab=target.config.vocab_size,
                             max_model_len=spec.max_model_len, matchers=matchers)
