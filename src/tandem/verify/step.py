"""One batched verify, as the seed's step_verify_dflash_batched does it:

  0. KV blocks for every row (the scheduler preempts the newest sequences when the pool
     runs dry);
  1. send the n*k rows to the target in ONE forward;
  2. verdicts for every sequence first (before any emit);
  3. commit: the verdict words go to every rank, which rewind each KV to
     pre_verify_len + accepted + 1, and the blocks past it go back to the pool (a group
     may read the acknowledgements later: the batch goes to `on_committed`, whose owner,
     tandem.release, settles them before the tick's outputs leave);
  4. emit the accepted drafts, then the bonus token, nothing past a stop;
  5. adapt, then propose the next drafts (batched, per-sequence fallback).

Failures: a single in-process rank that raised advanced nothing: the drafts go
back and are verified next tick (the batch finishes with an error after
`max_verify_failures` tries in a row). Anything else (a lost or failing rank, a
deadline, a short result) has had the all-zero verdict sent, and finishes every
sequence of the batch with an error naming the cause. A verdict some rank never
acknowledged finishes its batch when the tick is settled (tandem.release); a batch whose command
went out behind it was not run (state_advanced=False) and waits for the recovery.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import count

from tandem.adaptive import AdaptiveSpec, BatchCostModel
from tandem.batching import MAX_ROWS, batch_width
from tandem.clock import Clock
from tandem.detokenizer import Detokenizer
from tandem.errors import ShapeError, ShardError
from tandem.grammar.verify_masks import constrained_rows, padded_mask, with_forced
from tandem.metrics import EngineMetrics
from tandem.sequence import FinishReason, Sequence, logprob_entry
from tandem.shard.commands import PrefillItem, PrefillResult, Verdict, VerifyBatch, VerifyResult, failed_verdict
from tandem.verify.accept import accepted_prefix, accepted_sampled
from tandem.verify.forced import forced_width

log = logging.getLogger("tandem.verify")


@dataclass
class StepContext:
    """Everything a verify step touches besides its batch."""

    group: object  # ShardGroup
    drafter: object | None  # Drafter
    adaptive: AdaptiveSpec
    cost: BatchCostModel
    metrics: EngineMetrics
    clock: Clock
    detok: Detokenizer
    max_verify_failures: int = 3
    draft_cap: int = 0  # this tick's batch-level cap on drafts per sequence
    batch_ids: count = field(default_factory=lambda: count(1))
    # told of each verdict sent (batch id, its sequences): their outputs wait for every
    # rank's acknowledgement (tandem.release.OutputRelease.committed)
    on_committed: Callable[[int, list[Sequence]], None] = lambda batch_id, batch: None
    # the KV blocks (tandem.scheduler): room for a batch's rows (the batch less the
    # sequences preempted for it), a sequence's block table, and its KV committed
    make_room: Callable[[list[Sequence], int], list[Sequence]] = lambda batch, rows: batch
    block_table: Callable[[Sequence], list[int]] = lambda seq: []
    kv_committed: Callable[[Sequence], None] = lambda seq: None
    mask_words: int = 0  # int32 words of one grammar mask row (tandem.grammar.verify_masks)
    # the tick's estimated forward ms for the sequences' draft counts (tandem.draft_cap), or
    # None (no adaptive speculation): every forced token joins its drafts
    plan_ms: Callable[[list[int]], float | None] | None = None


def verify_step(batch: list[Sequence], ctx: StepContext,
                riders: Callable[[], list[PrefillItem]] | None = None) -> PrefillResult | None:
    """riders: the prompt chunks to prefill in the same forward, asked for once the batch
    has its KV blocks (making room may preempt a chunk's sequence). Returns their result,
    or None where none rode or they were not run (the caller prefills them apart)."""
    mask_rows = _grammar_rows(batch, ctx)
    batch = ctx.make_room(batch, batch_width(batch, ctx.adaptive.widths) + 1)
    if not batch:
        return None
    n, g = len(batch), batch_width(batch, ctx.adaptive.widths)
    k = g + 1
    drafts = [s.drafts for s in batch]
    forced = [s.forced for s in batch]
    for s in batch:
        s.drafts = []
    cmd = VerifyBatch(
        batch_id=next(ctx.batch_ids),
        n=n,
        k=k,
        slots=[s.slot for s in batch],
        start_pos=[s.kv_len for s in batch],
        tokens=[t for s, d in zip(batch, drafts) for t in padded_rows(s.last_token, d, k)],
        sampling=[s.sampling for s in batch],
        block_tables=[ctx.block_table(s) for s in batch],
        grammar_masks=[padded_mask(mask_rows[id(s)], k) if id(s) in mask_rows else b"" for s in batch] if mask_rows else [],
        prefill=riders() if riders is not None else [],
    )
    t0 = ctx.clock.now()
    res = _forward(cmd, batch, drafts, ctx)
    if res is None:
        return None
    verify_ms = (ctx.clock.now() - t0) * 1000.0
    ctx.metrics.verify_ms.observe(verify_ms)
    ctx.cost.record_forward(n * k + sum(len(it.tokens) - it.cached_len for it in cmd.prefill if res.prefill), verify_ms)

    accepted = verdicts(cmd, res, drafts, batch)
    try:
        ctx.group.commit(Verdict(batch_id=cmd.batch_id, words=[a + 1 for a in accepted]))
    except ShardError as e:
        _fail(batch, f"verify verdict not delivered: {e}", ctx)
        return
    ctx.on_committed(cmd.batch_id, batch)

    emitted = 0
    for i, s in enumerate(batch):
        s.verify_failures = 0
        logprobs = res.logprobs[i] if s.output_logprobs is not None else None  # only for those that asked
        emitted += emit(s, drafts[i], res.picks[i * k : (i + 1) * k], accepted[i], ctx, logprobs, forced[i])
        ctx.kv_committed(s)  # the rows past its new length go back to the pool
    ctx.metrics.generated_tokens.inc(emitted)
    ctx.metrics.record_verify([len(d) for d in drafts], accepted)

    t1 = ctx.clock.now()
    propose_drafts([s for s in batch if not s.finished], ctx)
    propose_ms = (ctx.clock.now() - t1) * 1000.0
    ctx.metrics.log_tick(n, g, sum(accepted), sum(len(d) for d in drafts), verify_ms, propose_ms)
    return res.prefill


def _grammar_rows(batch: list[Sequence], ctx: StepContext) -> dict[int, object]:
    """Constrained sequences' drafts cut where the grammar refuses them, and their mask rows (by id)."""
    out = {}
    for s in batch:
        if s.grammar is not None:
            kept, out[id(s)] = constrained_rows(s.grammar, s.drafts, ctx.mask_words, keep_refused=not s.params.greedy)
            if len(kept) < len(s.drafts):
                ctx.metrics.grammar_cut_tokens.inc(len(s.drafts) - len(kept))
                s.forced = max(0, s.forced - (len(s.drafts) - len(kept)))  # forced tokens come last
                s.drafts = kept
    return out


def padded_rows(last_token: int, drafts: list[int], k: int) -> list[int]:
    """[last, d_0..d_{g-1}], then pad rows up to k (a sequence in a wider batch, see
    tandem.batching). A pad row repeats the row before it; its pick is never read: the
    verdict walks this sequence's own drafts only."""
    rows = [last_token, *drafts]
    return rows + [rows[-1]] * (k - len(rows))


def _forward(cmd: VerifyBatch, batch: list[Sequence], drafts: list[list[int]], ctx: StepContext) -> VerifyResult | None:
    """The target forward, or None after handling its failure."""
    try:
        res = ctx.group.verify(cmd)
    except ShapeError as e:
        if cmd.prefill:  # refused chunks must not fail the running batch: it goes alone
            log.warning("chunks riding on batch %d refused (%s); the batch goes alone", cmd.batch_id, e)
            return _forward(replace(cmd, prefill=[]), batch, drafts, ctx)
        _fail(batch, f"verify batch refused ({e})", ctx)
        return None
    except ShardError as e:
        ctx.metrics.verify_failures.inc()
        if e.state_advanced:
            _fail(batch, f"verify failed: {e}", ctx)
            return None
        # Nothing advanced: put the drafts back and verify them again next tick.
        for s, d in zip(batch, drafts):
            s.drafts = d
            s.verify_failures += 1
        log.warning("verify of batch %d failed (%s); retrying next tick", cmd.batch_id, e)
        tries = max(s.verify_failures for s in batch)
        if tries >= ctx.max_verify_failures:
            _fail(batch, f"verify failed {tries} times in a row: {e}", ctx)
        return None
    if len(res.picks) < cmd.n * cmd.k or len(res.accept_probs) < cmd.n * cmd.k or _short_logprobs(cmd, res):
        try:
            ctx.group.commit(failed_verdict(cmd.batch_id, cmd.n))
        except ShardError as e:
            log.error("failed verdict for batch %d not delivered: %s", cmd.batch_id, e)
        _fail(batch, f"verify short result: {len(res.picks)} picks for {cmd.n * cmd.k} rows", ctx)
        return None
    return res


def _short_logprobs(cmd: VerifyBatch, res: VerifyResult) -> bool:
    """Whether a sequence that asked for logprobs lacks some of its rows'."""
    want = [i for i, spec in enumerate(cmd.sampling) if spec.logprobs is not None]
    if not want:
        return False
    return len(res.logprobs) < cmd.n or any(
        len(res.logprobs[i].chosen) < cmd.k or len(res.logprobs[i].drafts) < cmd.k - 1 for i in want)


def verdicts(cmd: VerifyBatch, res: VerifyResult, drafts: list[list[int]], batch: list[Sequence]) -> list[int]:
    """Every sequence's accepted count, before anything is emitted."""
    k = cmd.k
    out = []
    for i, s in enumerate(batch):
        picks = res.picks[i * k : (i + 1) * k]
        if s.params.greedy:
            out.append(accepted_prefix(drafts[i], picks))
        else:
            out.append(accepted_sampled(drafts[i], picks, res.accept_probs[i * k : (i + 1) * k], s.seed, cmd.start_pos[i]))
    return out


def emit(s: Sequence, drafts: list[int], picks: list[int], accepted: int, ctx: StepContext, logprobs=None,
         forced: int = 0) -> int:
    """The accepted drafts, then the bonus token; nothing past a stop condition; returns how
    many tokens it emitted. logprobs:
    the sequence's RowLogprobs (when it asked): an accepted draft's entry is the draft's at
    its row, the bonus token's its pick's. forced: the drafts' last ones the grammar forced;
    the adaptive rule judges the drafter by its own drafts (a forced token always passes)."""
    drafted = len(drafts) - forced
    if drafts:
        s.stats.num_drafts += 1
        s.stats.num_draft_tokens += len(drafts)
        s.stats.num_accepted_tokens += accepted
        if drafted:
            ctx.adaptive.record_verify(s.spec, drafted, min(accepted, drafted), len(s.output_ids))
        if ctx.drafter is not None:
            ctx.drafter.on_commit(s, len(drafts), accepted)
    before = len(s.output_ids)
    for r, t in enumerate([*drafts[:accepted], picks[accepted]]):
        s.emit(t, ctx.detok, logprob_entry(logprobs, r, draft=r < accepted) if logprobs is not None else None)
        if s.finished:
            break
    if not drafted:
        ctx.adaptive.record_plain(s.spec, len(s.output_ids) - before)
    return len(s.output_ids) - before


def num_drafts_for(s: Sequence, ctx: StepContext) -> int:
    if ctx.drafter is None or not ctx.adaptive.allowed(s.spec, len(s.output_ids)):
        return 0
    # the bonus token always comes, so more than budget-1 drafts could never be emitted
    return max(0, min(s.spec.gamma, ctx.draft_cap, s.budget - 1))


def propose_drafts(seqs: list[Sequence], ctx: StepContext) -> None:
    """Batched propose for every eligible sequence, chunked by the drafter's width;
    a chunk whose batched call fails falls back to one propose per sequence."""
    if ctx.drafter is None:
        return
    want = [(s, num_drafts_for(s, ctx)) for s in seqs]
    want = [(s, g) for s, g in want if g > 0]
    width = max(1, ctx.drafter.propose_batch_max)
    t0 = ctx.clock.now()
    copied = 0
    for i in range(0, len(want), width):
        chunk = want[i : i + width]
        try:
            proposed = ctx.drafter.propose([s for s, _ in chunk], [g for _, g in chunk])
            copied += ctx.drafter.copied
        except Exception as e:  # noqa: BLE001 - the per-sequence path is the fallback
            log.warning("batched propose failed (%s); per-sequence path", e)
            proposed = [_propose_one(s, g, ctx) for s, g in chunk]
        for (s, g), d in zip(chunk, proposed):
            s.drafts = list(d[:g])
    for s in seqs:
        s.forced = 0
    _add_forced(seqs, ctx)
    if want:
        ms = (ctx.clock.now() - t0) * 1000.0
        ctx.metrics.propose_ms.observe(ms)
        ctx.cost.record_propose(max(g for _, g in want), ms, len(want), copied)
        ctx.metrics.copied_drafts.inc(copied)


def _add_forced(seqs: list[Sequence], ctx: StepContext) -> None:
    """Constrained sequences: the tokens their grammar forces join their drafts. A sampled
    sequence gets them only without drafts of the drafter's: the rank's q covers exactly the
    drafter's own drafts (a forced token's q is one-hot, and p under the mask is too). As
    many as their rows pay for (tandem.verify.forced)."""
    most = min(MAX_ROWS - 1, ctx.group.limits.row_budget - 1)
    forced: dict[int, list[int]] = {}
    for s in seqs:
        if s.grammar is not None and (s.params.greedy or not s.drafts):
            kept, forced[id(s)] = with_forced(s.grammar, s.drafts, min(most, s.budget - 1) - len(s.drafts))
            ctx.metrics.grammar_cut_tokens.inc(len(s.drafts) - len(kept))
            s.drafts = kept
    live = [s for s in seqs if not s.finished]
    width = forced_width([len(s.drafts) for s in live], [len(forced.get(id(s), ())) for s in live],
                         [s.spec.alpha for s in live], ctx.plan_ms) if forced else None
    for s in live:
        f = forced.get(id(s), [])[: None if width is None else max(0, width - len(s.drafts))]
        s.drafts, s.forced = s.drafts + f, len(f)


def _propose_one(s: Sequence, g: int, ctx: StepContext) -> list[int]:
    try:
        return ctx.drafter.propose_one(s, g)
    except Exception as e:  # noqa: BLE001 - no drafts: the sequence decodes plainly this round
        log.error("propose for %s failed: %s", s.request_id, e)
        return []


def _fail(batch: list[Sequence], why: str, ctx: StepContext) -> None:
    log.error("finishing %d sequences: %s", len(batch), why)
    for s in batch:
        s.finish(FinishReason.ERROR, error=why)
