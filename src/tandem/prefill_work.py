"""A tick's prefill work: prompt chunks (sequence, start, end) the scheduler chose, sent in
a prefill command of their own, or riding on a verify of the running sequences (one forward
for both: tandem.shard.riders).

A failed prefill command is retried chunk by chunk so a failure finishes only its own
sequence. Chunks refused or not run on a verify are prefilled by a command of their own the
next tick. The sequences whose prefill completed: a first prefill emits its first token; a
later one (after a preemption or a recovery) writes its tokens but the last, which is row 0
of its next verify.
"""
from __future__ import annotations

from tandem.errors import ShapeError, ShardError
from tandem.grammar.verify_masks import start_mask
from tandem.scheduler import prefill_tokens
from tandem.sequence import FinishReason, Sequence, Status, logprob_entry, record_prompt_logprobs
from tandem.shard.commands import PrefillItem, PrefillResult
from tandem.verify.step import propose_drafts, verify_step

Chunk = tuple[Sequence, int, int]


class PrefillWork:
    def __init__(self, group, scheduler, ctx, metrics, clock, grammar_words: int, draft_cap):
        self.group, self.scheduler, self.ctx = group, scheduler, ctx
        self.metrics, self.clock, self.grammar_words, self.draft_cap = metrics, clock, grammar_words, draft_cap
        self.ride_refused = False  # the last ride's chunks were not run: the next tick prefills apart

    def run(self, chunks: list[Chunk]) -> list[Sequence]:
        """Prefill the chunks in one command; the sequences whose prefill completed."""
        if not chunks:
            return []
        items = [self.item(*c) for c in chunks]
        seqs = [s for s, _, _ in chunks]
        t0 = self.clock.now()
        try:
            res = self.group.prefill(items)
        except (ShardError, ShapeError) as e:
            if isinstance(e, ShardError) and e.unhealthy:
                self.scheduler.requeue(seqs)  # they wait for the recovery instead
                return []
            if len(chunks) == 1:
                seqs[0].finish(FinishReason.ERROR, error=f"prefill failed: {e}")
                return []
            return [s for chunk in chunks for s in self.run([chunk])]
        self.ctx.cost.record_prefill(sum(len(it.tokens) - it.cached_len for it in items), (self.clock.now() - t0) * 1000.0)
        return self._take(chunks, items, res, t0)

    def ride(self, batch: list[Sequence], chunks: list[Chunk]) -> list[Sequence]:
        """Verify the batch with the chunks riding on its forward; the sequences whose
        prefill completed."""
        kept: list[Chunk] = []
        items: list[PrefillItem] = []

        def riders() -> list[PrefillItem]:  # once the batch has its blocks: less the preempted
            kept[:] = [c for c in chunks if c[0].status is Status.RUNNING and not c[0].finished]
            items[:] = [self.item(*c) for c in kept]
            return items

        t0 = self.clock.now()
        res = verify_step(batch, self.ctx, riders)
        if not kept:
            return []
        if res is None or len(res.next_tokens) != len(kept):
            self.ride_refused = True
            return []
        return self._take(kept, items, res, t0)

    def item(self, s: Sequence, start: int, end: int) -> PrefillItem:
        blocks = self.scheduler.table(s)[: -(-end // self.scheduler.kv.block_size)]  # those of its first `end`
        # the grammar's start state masks the pick after the prompt (a later chunk's pick is not read)
        mask = start_mask(s.grammar, self.grammar_words) if s.grammar and not s.output_ids else b""
        tokens = prefill_tokens(s)
        scored = s.scores_prompt  # the first prefill of a request that asked for prompt logprobs
        return PrefillItem(slot=s.slot, tokens=tokens[:end], sampling=s.sampling, blocks=blocks, cached_len=start,
                           grammar_mask=mask, prompt_logprobs=s.params.prompt_logprobs if scored else None,
                           next_token=tokens[end] if scored and end < len(tokens) else -1)

    def _take(self, chunks: list[Chunk], items: list[PrefillItem], res: PrefillResult, t0: float) -> list[Sequence]:
        now = self.clock.now()
        started = []
        for i, ((s, start, end), tok) in enumerate(zip(chunks, res.next_tokens)):
            if items[i].prompt_logprobs is not None:
                record_prompt_logprobs(s, start, res.prompt_logprobs[i] if res.prompt_logprobs else None)
            if start == s.cached_len:  # its first chunk
                self.metrics.record_prefix_hit(len(prefill_tokens(s)), s.cached_len)
                self.metrics.queue_time.observe(t0 - s.arrival)
            if not self.scheduler.prefilled(s, end):
                continue  # more chunks in later ticks
            if not s.output_ids:
                self.metrics.prompt_tokens.inc(len(s.prompt_ids))
                self.metrics.time_to_first_token.observe(now - s.arrival)
                s.first_token_time = now
                asked = res.logprobs and s.output_logprobs is not None
                s.emit(tok, self.ctx.detok, logprob_entry(res.logprobs[i], 0) if asked else None)
                self.metrics.generated_tokens.inc()
            s.drafts = []
            self.scheduler.committed(s)
            started.append(s)
        # the cap counts the new sequences before their first propose: a cap left from a
        # smaller batch would draft (and, for a draft model, catch up) a whole wave of prompts
        self.ctx.draft_cap = self.draft_cap.cap()
        propose_drafts([s for s in started if not s.finished], self.ctx)
        return started
