"""The codec: tandem.shard.commands dataclasses <-> protos/shard.proto messages, one-to-one.

encode_X(dataclass) -> message and decode_X(message) -> dataclass for every command
and result. Lists keep their order and shape; the one lossy field is a sampling seed,
which travels modulo 2**64 (the counter-based sampler uses no more of it). A verify batch
whose sequences are all greedy sends no sampling specs (an empty list decodes as n greedy
ones): at n=64 the 64 empty submessages cost ~0.1 ms a tick to build and parse.
"""
from __future__ import annotations

from tandem.errors import ShapeError
from tandem.rpc.generated import shard_pb2 as pb
from tandem.shard.commands import (
    GREEDY,
    DraftGrammar,
    LogitRules,
    PrefillItem,
    PrefillResult,
    ProposeBatch,
    ProposeResult,
    RankDrafterInfo,
    RowLogprobs,
    SamplingSpec,
    ShardLimits,
    Verdict,
    VerifyBatch,
    VerifyResult,
)
from tandem.shard.spec import ShardSpec

_MASK64 = (1 << 64) - 1


# ---- sampling -----------------------------------------------------------------------------

def encode_sampling(s: SamplingSpec) -> pb.SamplingSpec:
    m = pb.SamplingSpec(temperature=s.temperature, top_k=s.top_k, seed=s.seed & _MASK64)
    if s.top_p != 1.0:
        m.top_p = s.top_p
    if s.min_p != 0.0:
        m.min_p = s.min_p
    if s.rules is not None:
        m.rules.CopyFrom(encode_rules(s.rules))
    if s.logprobs is not None:
        m.logprobs = s.logprobs
    return m


def decode_sampling(m: pb.SamplingSpec) -> SamplingSpec:
    top_p = m.top_p if m.HasField("top_p") else 1.0
    min_p = m.min_p if m.HasField("min_p") else 0.0
    rules = decode_rules(m.rules) if m.HasField("rules") else None
    logprobs = m.logprobs if m.HasField("logprobs") else None
    return SamplingSpec(temperature=m.temperature, top_p=top_p, top_k=m.top_k, seed=m.seed, min_p=min_p, rules=rules,
                        logprobs=logprobs)


def encode_row_logprobs(r: RowLogprobs) -> pb.RowLogprobs:
    return pb.RowLogprobs(chosen=r.chosen, top_ids=r.top_ids, top_logprobs=r.top_logprobs, drafts=r.drafts)


def decode_row_logprobs(m: pb.RowLogprobs) -> RowLogprobs:
    if len(m.top_ids) != len(m.top_logprobs) or (m.top_ids and len(m.top_ids) % max(1, len(m.chosen))):
        raise ShapeError("logprobs", f"{len(m.top_ids)} top ids, {len(m.top_logprobs)} top logprobs for {len(m.chosen)} rows")
    return RowLogprobs(chosen=list(m.chosen), top_ids=list(m.top_ids), top_logprobs=list(m.top_logprobs),
                       drafts=list(m.drafts))


def encode_rules(r: LogitRules) -> pb.LogitRules:
    m = pb.LogitRules(prompt_len=r.prompt_len, presence_penalty=r.presence_penalty, frequency_penalty=r.frequency_penalty,
                      bias_ids=[t for t, _ in r.logit_bias], bias_values=[b for _, b in r.logit_bias],
                      min_tokens=r.min_tokens, min_tokens_ids=r.min_tokens_ids)
    if r.repetition_penalty != 1.0:
        m.repetition_penalty = r.repetition_penalty
    return m


def decode_rules(m: pb.LogitRules) -> LogitRules:
    if len(m.bias_ids) != len(m.bias_values):
        raise ShapeError("logit_bias", f"{len(m.bias_ids)} bias ids for {len(m.bias_values)} values")
    return LogitRules(
        prompt_len=m.prompt_len, presence_penalty=m.presence_penalty, frequency_penalty=m.frequency_penalty,
        repetition_penalty=m.repetition_penalty if m.HasField("repetition_penalty") else 1.0,
        logit_bias=tuple(zip(m.bias_ids, m.bias_values)), min_tokens=m.min_tokens, min_tokens_ids=tuple(m.min_tokens_ids),
    )


# ---- init / limits ------------------------------------------------------------------------

def encode_spec(spec: ShardSpec) -> pb.ShardSpec:
    m = pb.ShardSpec(
        dtype=spec.dtype,
        device=spec.device,
        num_slots=spec.num_slots,
        row_budget=spec.row_budget,
        drafter=spec.drafter,
        num_speculative_tokens=spec.num_speculative_tokens,
        cuda_graphs=spec.cuda_graphs,
        dflash_cuda_graphs=spec.dflash_cuda_graphs,
        block_size=spec.block_size,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        quantization=spec.quantization,
    )
    if spec.max_model_len is not None:
        m.max_model_len = spec.max_model_len
    if spec.kv_cache_memory_gb is not None:
        m.kv_cache_memory_gb = spec.kv_cache_memory_gb
    if spec.dflash_dtype is not None:
        m.dflash_dtype = spec.dflash_dtype
    if spec.model is not None:
        m.model = spec.model
    if spec.draft_model is not None:
        m.draft_model = spec.draft_model
    if spec.dflash_checkpoint is not None:
        m.dflash_checkpoint = spec.dflash_checkpoint
    return m


def decode_spec(m: pb.ShardSpec) -> ShardSpec:
    return ShardSpec(
        model=m.model if m.HasField("model") else None,
        dtype=m.dtype,
        device=m.device,
        num_slots=m.num_slots,
        max_model_len=m.max_model_len if m.HasField("max_model_len") else None,
        row_budget=m.row_budget,
        drafter=m.drafter,
        draft_model=m.draft_model if m.HasField("draft_model") else None,
        dflash_checkpoint=m.dflash_checkpoint if m.HasField("dflash_checkpoint") else None,
        num_speculative_tokens=m.num_speculative_tokens,
        cuda_graphs=m.cuda_graphs,
        dflash_cuda_graphs=m.dflash_cuda_graphs,
        dflash_dtype=m.dflash_dtype if m.HasField("dflash_dtype") else None,
        block_size=m.block_size,
        kv_cache_memory_gb=m.kv_cache_memory_gb if m.HasField("kv_cache_memory_gb") else None,
        gpu_memory_utilization=m.gpu_memory_utilization,
        quantization=m.quantization or "auto",
    )


def encode_limits(x: ShardLimits) -> pb.ShardLimits:
    return pb.ShardLimits(
        num_slots=x.num_slots,
        max_model_len=x.max_model_len,
        row_budget=x.row_budget,
        vocab_size=x.vocab_size,
        world_size=x.world_size,
        drafter=x.drafter,
        propose_batch_max=x.propose_batch_max,
        num_blocks=x.num_blocks,
        block_size=x.block_size,
        graphed=x.graphed,
    )


def decode_limits(m: pb.ShardLimits) -> ShardLimits:
    return ShardLimits(
        num_slots=m.num_slots,
        max_model_len=m.max_model_len,
        row_budget=m.row_budget,
        vocab_size=m.vocab_size,
        world_size=m.world_size,
        drafter=m.drafter,
        propose_batch_max=m.propose_batch_max,
        num_blocks=m.num_blocks,
        block_size=m.block_size,
        graphed=m.graphed,
    )


def encode_drafter_info(x: RankDrafterInfo) -> pb.DrafterInfo:
    return pb.DrafterInfo(kind=x.kind, source=x.source, max_drafts=x.max_drafts)


def decode_drafter_info(m: pb.DrafterInfo) -> RankDrafterInfo:
    return RankDrafterInfo(kind=m.kind or "none", source=m.source, max_drafts=m.max_drafts)


# ---- prefill ------------------------------------------------------------------------------

def encode_prefill(items: list[PrefillItem]) -> pb.PrefillRequest:
    return pb.PrefillRequest(items=[_encode_prefill_item(it) for it in items])


def _encode_prefill_item(it: PrefillItem) -> pb.PrefillItem:
    m = pb.PrefillItem(slot=it.slot, tokens=it.tokens, sampling=encode_sampling(it.sampling), blocks=it.blocks,
                       cached_len=it.cached_len, grammar_mask=it.grammar_mask, next_token=it.next_token)
    if it.prompt_logprobs is not None:
        m.prompt_logprobs = it.prompt_logprobs
    return m


def decode_prefill(m: pb.PrefillRequest) -> list[PrefillItem]:
    return _decode_prefill_items(m.items)


def _decode_prefill_items(items) -> list[PrefillItem]:
    return [PrefillItem(slot=it.slot, tokens=list(it.tokens), sampling=decode_sampling(it.sampling),
                        blocks=list(it.blocks), cached_len=it.cached_len, grammar_mask=bytes(it.grammar_mask),
                        prompt_logprobs=it.prompt_logprobs if it.HasField("prompt_logprobs") else None,
                        next_token=it.next_token) for it in items]


def encode_prefill_result(r: PrefillResult) -> pb.PrefillResult:
    return pb.PrefillResult(next_tokens=r.next_tokens, logprobs=[encode_row_logprobs(x) for x in r.logprobs],
                            prompt_logprobs=[encode_row_logprobs(x) for x in r.prompt_logprobs])


def decode_prefill_result(m: pb.PrefillResult) -> PrefillResult:
    return PrefillResult(next_tokens=list(m.next_tokens), logprobs=[decode_row_logprobs(x) for x in m.logprobs],
                         prompt_logprobs=[decode_row_logprobs(x) for x in m.prompt_logprobs])


# ---- verify / verdict ---------------------------------------------------------------------

def encode_verify(c: VerifyBatch) -> pb.VerifyBatch:
    return pb.VerifyBatch(
        batch_id=c.batch_id,
        n=c.n,
        k=c.k,
        slots=c.slots,
        start_pos=c.start_pos,
        tokens=c.tokens,
        sampling=[] if all(s == GREEDY for s in c.sampling) else [encode_sampling(s) for s in c.sampling],
        blocks=[b for t in c.block_tables for b in t],
        block_counts=[len(t) for t in c.block_tables],
        grammar_masks=c.grammar_masks,
        prefill=[_encode_prefill_item(it) for it in c.prefill],
    )


def decode_verify(m: pb.VerifyBatch) -> VerifyBatch:
    return VerifyBatch(
        batch_id=m.batch_id,
        n=m.n,
        k=m.k,
        slots=list(m.slots),
        start_pos=list(m.start_pos),
        tokens=list(m.tokens),
        sampling=[decode_sampling(s) for s in m.sampling] if m.sampling else [GREEDY] * max(0, m.n),
        block_tables=_split(list(m.blocks), list(m.block_counts), "verify block tables"),
        grammar_masks=[bytes(x) for x in m.grammar_masks],
        prefill=_decode_prefill_items(m.prefill),
    )


def encode_verify_result(r: VerifyResult) -> pb.VerifyResult:
    m = pb.VerifyResult(batch_id=r.batch_id, picks=r.picks, accept_probs=r.accept_probs,
                        logprobs=[encode_row_logprobs(x) for x in r.logprobs])
    if r.prefill is not None:
        m.prefill.CopyFrom(encode_prefill_result(r.prefill))
    return m


def decode_verify_result(m: pb.VerifyResult) -> VerifyResult:
    # accept_probs are 0/1 for greedy rows and probabilities otherwise: float32 is plenty
    return VerifyResult(batch_id=m.batch_id, picks=list(m.picks), accept_probs=list(m.accept_probs),
                        logprobs=[decode_row_logprobs(x) for x in m.logprobs],
                        prefill=decode_prefill_result(m.prefill) if m.HasField("prefill") else None)


def encode_verdict(v: Verdict) -> pb.Verdict:
    return pb.Verdict(batch_id=v.batch_id, words=v.words)


def decode_verdict(m: pb.Verdict) -> Verdict:
    return Verdict(batch_id=m.batch_id, words=list(m.words))


# ---- propose / release --------------------------------------------------------------------

def encode_propose(c: ProposeBatch) -> pb.ProposeBatch:
    return pb.ProposeBatch(
        slots=c.slots,
        last_tokens=c.last_tokens,
        positions=c.positions,
        num_drafts=c.num_drafts,
        sampling=[encode_sampling(s) for s in c.sampling],
        grammars=[pb.DraftGrammar(kind=g.kind, value=g.value, start=g.start) if g is not None else pb.DraftGrammar()
                  for g in c.grammars],
    )


def decode_propose(m: pb.ProposeBatch) -> ProposeBatch:
    return ProposeBatch(
        slots=list(m.slots),
        last_tokens=list(m.last_tokens),
        positions=list(m.positions),
        num_drafts=list(m.num_drafts),
        sampling=[decode_sampling(s) for s in m.sampling],
        grammars=[DraftGrammar(g.kind, g.value, g.start) if g.kind else None for g in m.grammars],
    )


def encode_propose_result(r: ProposeResult) -> pb.ProposeResult:
    return pb.ProposeResult(tokens=[t for d in r.drafts for t in d], counts=[len(d) for d in r.drafts])


def decode_propose_result(m: pb.ProposeResult) -> ProposeResult:
    return ProposeResult(drafts=_split(list(m.tokens), list(m.counts), "propose result"))


def _split(flat: list[int], counts: list[int], what: str) -> list[list[int]]:
    """flat cut into consecutive runs of counts[i] (ShapeError where they do not cover it)."""
    if sum(counts) != len(flat) or any(c < 0 for c in counts):
        raise ShapeError(what, f"counts {counts} do not cover {len(flat)} entries")
    out, at = [], 0
    for c in counts:
        out.append(flat[at : at + c])
        at += c
    return out


def encode_release(slots: list[int]) -> pb.ReleaseRequest:
    return pb.ReleaseRequest(slots=slots)


def decode_release(m: pb.ReleaseRequest) -> list[int]:
    return list(m.slots)
