"""Engine: tandem embedded in one process. add_request / step / generate / stream / abort.

step() is one tick: schedule (take the new requests, recover the shard group if it was
lost, admit what fits), run (prefill the admitted, then one verify step per batch of
sequences with the same draft count), release (the tick's outputs, once every rank has
its verdicts). Requests join and leave between ticks (continuous batching).

Its parts, each in a file of its own: RequestIntake (tandem.intake: checks, tokenizes,
the inbox), Scheduler (tandem.scheduler: the queues and the KV slots), the verify step
(tandem.verify.step), DraftCapPolicy (tandem.draft_cap), OutputTracker
(tandem.output_tracker: the deltas) and OutputRelease (tandem.release: holds a tick's
outputs until every rank has acknowledged its verdicts, then hands them to the sink).
"""
from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator, Sequence as Seq

from tandem.adaptive import AdaptiveSpec, BatchCostModel
from tandem import tokenize_text
from tandem.choices import choice_requests
from tandem.clock import Clock, MonotonicClock
from tandem.config import EngineConfig
from tandem.detokenizer import Detokenizer
from tandem.draft_cap import DraftCapPolicy
from tandem.drafters.factory import build_drafter
from tandem.due_outputs import DueOutput
from tandem.errors import InvalidRequestError, ShapeError, ShardError
from tandem.grammar.verify_masks import start_mask
from tandem.intake import Admission, Request, RequestIntake
from tandem.kv import KVBlockManager
from tandem.metrics import EngineMetrics
from tandem.output_tracker import OutputTracker
from tandem.outputs import RequestOutput
from tandem.release import OutputRelease, Sink
from tandem.sampling_params import SamplingParams
from tandem.scheduler import Scheduler, prefill_tokens
from tandem.sequence import FinishReason, Sequence, logprob_entry, record_prompt_logprobs
from tandem.shard.commands import PrefillItem
from tandem.verify.step import StepContext, propose_drafts, verify_step

log = logging.getLogger("tandem.engine")


class Engine:
    def __init__(
        self,
        group,
        tokenizer,
        eos_token_ids: Seq[int],
        config: EngineConfig | None = None,
        *,
        clock: Clock | None = None,
        metrics: EngineMetrics | None = None,
        model_name: str = "tandem",
        sink: Sink | None = None,
    ):
        """sink: where outputs go from inside the next tick once the ranks have acknowledged
        their verdicts (see tandem.release); None: every output comes back from step()."""
        self.config = config or EngineConfig()
        self.group = group
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.clock = clock or MonotonicClock()
        self.metrics = metrics or EngineMetrics()
        limits = group.limits
        drafter = build_drafter(self.config, group)
        prefix_caching = self.config.enable_prefix_caching
        kv = KVBlockManager(limits.num_blocks, limits.block_size, prefix_caching=prefix_caching)
        self.scheduler = Scheduler(limits.num_slots, limits.row_budget, kv,
                                   max_prefill_tokens=self.config.max_prefill_tokens)
        log.info("KV pool: %d blocks of %d tokens (%d tokens), max_model_len %d, prefix caching %s",
                 limits.num_blocks, limits.block_size, limits.num_blocks * limits.block_size, limits.max_model_len,
                 "on" if prefix_caching else "off")
        max_gamma = self.config.num_speculative_tokens if drafter is not None else 0
        whole_blocks = drafter is not None and drafter.whole_blocks
        self.adaptive = AdaptiveSpec(max_gamma, adaptive=self.config.adaptive, whole_blocks=whole_blocks)
        cost = BatchCostModel(warmup_samples=1, whole_blocks=whole_blocks)
        detok = Detokenizer(tokenizer)
        self.intake = RequestIntake(tokenizer, frozenset(eos_token_ids), limits, self.adaptive, self.clock)
        self.outputs = OutputTracker(self.intake, detok, self.metrics, self.clock)
        self.release = OutputRelease(group, self._due, self.outputs.build, sink)
        self.draft_cap = DraftCapPolicy(self.adaptive, cost, self.scheduler, enabled=self.config.adaptive)
        self.ctx = StepContext(
            group=group,
            drafter=drafter,
            adaptive=self.adaptive,
            cost=cost,
            metrics=self.metrics,
            clock=self.clock,
            detok=detok,
            max_verify_failures=self.config.max_verify_failures,
            draft_cap=max_gamma,
            on_committed=self.release.committed,
            make_room=self._make_room,
            block_table=self.scheduler.table,
            mask_words=self.intake.grammars.words,
            plan_ms=self.draft_cap.plan if self.config.adaptive else None,
            kv_committed=self.scheduler.committed,
        )
        self._lock = threading.RLock()  # held for a whole tick
        self._prefill_tick = False  # the last tick only admitted (see _prefill_only)

    @classmethod
    def from_config(cls, config: EngineConfig | None = None, *, clock: Clock | None = None, progress: bool = True,
                    sink: Sink | None = None, launcher=None, group_options: dict | None = None, **overrides) -> "Engine":
        """An engine on the configured model: one in-process rank, or `shards` gRPC shard
        processes (started by `launcher`, by default on this machine; see tandem.builder)."""
        from dataclasses import replace

        from tandem.builder import build_group

        config = replace(config, **overrides) if config else EngineConfig(**overrides)
        group, loaded = build_group(config, launcher=launcher, progress=progress, **(group_options or {}))
        return cls(group, loaded.tokenizer, loaded.eos_token_ids, config, clock=clock, model_name=loaded.name, sink=sink)

    # ---- requests -----------------------------------------------------------------------

    @property
    def requests(self) -> dict[str, Sequence]:
        return self.intake.requests

    @property
    def recovering(self) -> bool:
        """A restart of the lost shard group failed; the next tick tries again."""
        return self.intake.recovering

    @property
    def available(self) -> bool:
        """Whether new requests are taken now (not while the shard group is lost or recovers)."""
        return not self.intake.recovering and self.group.healthy()

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None, request_id: str | None = None) -> str:
        """Queue one request for the next tick; its id. Raises InvalidRequestError for bad
        input, EngineUnavailableError while the shard group recovers."""
        (admission,) = self.add_requests([Request(prompt, params, request_id)])
        if admission.error is not None:
            raise admission.error
        return admission.request_id

    def add_requests(self, requests: list[Request]) -> list[Admission]:
        """Queue several requests for the same tick (one bad request harms none of the
        others): a burst is prefilled as one batch even while a tick is in progress."""
        return self.intake.add(requests)

    def chat_prompt(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """Messages (and tools) rendered with the tokenizer's chat template, ready to generate from."""
        return self.intake.chat_prompt(messages, tools)

    def tokenize(self, prompt: str | None = None, *, messages: list[dict] | None = None, **options) -> list[int]:
        """The ids a request of this prompt (or conversation) generates from (tandem.tokenize_text)."""
        return tokenize_text.tokenize(self.tokenizer, prompt=prompt, messages=messages, **options)

    def detokenize(self, tokens: list[int]) -> str:
        return tokenize_text.detokenize(self.tokenizer, tokens, self.group.limits.vocab_size)

    def abort(self, request_id: str) -> bool:
        with self._lock:
            seq = self.requests.get(request_id)
            if seq is None or seq.finished:
                return False
            seq.finish(FinishReason.ABORT)
            self.scheduler.remove_waiting(seq)
            return True

    def has_unfinished(self) -> bool:
        return self.intake.pending or self.scheduler.has_work or self.release.held is not None

    # ---- the tick -----------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        with self._lock:
            self.intake.drain_into(self.scheduler)
            earlier = [] if self.group.healthy() else self._recover()
            others_wait = bool(self.scheduler.running)
            self.scheduler.admit()
            started = self._prefill(self.scheduler.prefill_chunks())
            if not self._prefill_only(started, others_wait):
                self._verify_running(started)
            self.metrics.record_scheduler(self.scheduler)
            return earlier + self.release.end_tick()

    def flush(self) -> list[RequestOutput]:
        """Outputs held from the last tick (see tandem.release), once the ranks acknowledged them."""
        with self._lock:
            return self.release.flush()

    def _prefill_only(self, started: list[Sequence], others_wait: bool) -> bool:
        """Whether this tick ends after its prefill. The sequences whose prefill completed
        send their first tokens now: their time to first token is their prefill, not
        prefill + the batch's verify. At most every other tick while others run, so a
        steady stream of arrivals cannot hold them back."""
        self._prefill_tick = bool(started) and not (self._prefill_tick and others_wait)
        return self._prefill_tick

    def _verify_running(self, started: list[Sequence]) -> None:
        if started and self.release.sink is not None:
            # Admitted right after a prefill tick, they share this tick with the verify;
            # with a sink, their first tokens still leave at their prefill.
            self.release.send_now()
        self.ctx.draft_cap = self.draft_cap.cap()
        for batch in self.scheduler.verify_batches(self.ctx.cost.estimate, self.adaptive.block):
            verify_step(batch, self.ctx)
            if not self.group.healthy():
                break  # the rest wait for the recovery next tick

    def _make_room(self, batch: list[Sequence], rows: int) -> list[Sequence]:
        """The batch less what the scheduler preempted to give it KV blocks for `rows`
        more positions; the preempted sequences' slots are released on the ranks."""
        kept = self.scheduler.make_room(batch, rows)
        self._release_slots(self.scheduler.preempted_slots)
        self.scheduler.preempted_slots = []
        return kept

    def _prefill(self, chunks: list[tuple[Sequence, int, int]]) -> list[Sequence]:
        """Prefill this tick's chunks (sequence, start, end) in one command; on failure retry
        one by one so a failure finishes only its own. The sequences whose prefill completed:
        a first prefill emits its first token; a later one (after a preemption or a recovery)
        writes its tokens but the last, which is row 0 of its next verify."""
        if not chunks:
            return []
        items = [self._prefill_item(s, start, end) for s, start, end in chunks]
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
            return [s for chunk in chunks for s in self._prefill([chunk])]
        now = self.clock.now()
        self.ctx.cost.record_prefill(sum(len(it.tokens) - it.cached_len for it in items), (now - t0) * 1000.0)
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

    def _prefill_item(self, s: Sequence, start: int, end: int) -> PrefillItem:
        blocks = self.scheduler.table(s)[: -(-end // self.scheduler.kv.block_size)]  # those of its first `end`
        # the grammar's start state masks the pick after the prompt (a later chunk's pick is not read)
        mask = start_mask(s.grammar, self.intake.grammars.words) if s.grammar and not s.output_ids else b""
        tokens = prefill_tokens(s)
        scored = s.scores_prompt  # the first prefill of a request that asked for prompt logprobs
        return PrefillItem(slot=s.slot, tokens=tokens[:end], sampling=s.sampling, blocks=blocks, cached_len=start,
                           grammar_mask=mask, prompt_logprobs=s.params.prompt_logprobs if scored else None,
                           next_token=tokens[end] if scored and end < len(tokens) else -1)

    def _recover(self) -> list[RequestOutput]:
        """Restart a lost shard group and re-prefill every running sequence from its tokens;
        the outputs the last tick held, settled first."""
        earlier = self.release.flush()
        self.intake.recovering = True
        try:
            self.group.restart()
        except Exception as e:  # noqa: BLE001 - stay recovering; the next tick tries again
            log.error("shard group restart failed: %s", e)
            return earlier
        self.scheduler.reset_kv()  # the new ranks hold no KV: this tick prefills them again
        log.warning("shard group restarted; re-prefilling %d running sequences", len(self.scheduler.pending_prefill()))
        self.intake.recovering = False
        return earlier

    def _due(self) -> list[DueOutput]:
        """The outputs owed now (OutputRelease builds them); finished sequences leave the
        scheduler, their slots go back to every rank."""
        dues = self.outputs.due()
        self._release_slots([s.slot for s in self.scheduler.reap() if s.slot is not None])
        return dues

    def _release_slots(self, slots: list[int]) -> None:
        if slots and self.group.healthy():
            try:
                self.group.release(slots)
            except (ShardError, ShapeError) as e:
                log.error("release of slots %s failed: %s", slots, e)

    # ---- conveniences -------------------------------------------------------------------

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None, *,
                 n: int = 1) -> list[RequestOutput]:
        """Run the given prompts to completion (with whatever else is running) and return
        their final outputs in order; with n > 1, n choices of each (prompt-major, each
        seeded apart: tandem.choices), all admitted together."""
        single = isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int))
        prompts = [prompts] if single else list(prompts)
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise InvalidRequestError("params", f"{len(plist)} params for {len(prompts)} prompts")
        requests = [r for i, (p, sp) in enumerate(zip(prompts, plist))
                    for r in choice_requests([p], sp or SamplingParams(), n, f"gen-{uuid.uuid4().hex}-{i}")]
        ids = []
        for admission in self.add_requests(requests):
            if admission.error is not None:
                for rid in ids:
                    self.abort(rid)
                raise admission.error
            ids.append(admission.request_id)
        final: dict[str, RequestOutput] = {}
        wanted = set(ids)
        while len(final) < len(ids):
            for out in self.step():
                if out.finished and out.request_id in wanted:  # not another caller's request
                    final[out.request_id] = out
        return [final[i] for i in ids]

    def stream(self, prompt, params: SamplingParams | None = None) -> Iterator[RequestOutput]:
        """Yield this request's outputs (with deltas) as they are produced, driving the
        engine from this thread."""
        rid = self.add_request(prompt, params)
        try:
            while True:
                for out in self.step():
                    if out.request_id == rid:
                        yield out
                        if out.finished:
                            return
        finally:
            self.abort(rid)

    def close(self) -> None:
        self.group.close()
