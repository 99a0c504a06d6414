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
from tandem.intake import Admission, Request, RequestIntake
from tandem.kv import KVBlockManager
from tandem.metrics import EngineMetrics
from tandem.output_tracker import OutputTracker
from tandem.outputs import RequestOutput
from tandem.prefill_budget import stall_budget
from tandem.prefill_work import PrefillWork
from tandem.release import OutputRelease, Sink
from tandem.sampling_params import SamplingParams
from tandem.scheduler import Scheduler
from tandem.sequence import FinishReason, Sequence
from tandem.verify.step import StepContext, verify_step

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
        self.prefills = PrefillWork(group, self.scheduler, self.ctx, self.metrics, self.clock,
                                    self.intake.grammars.words, self.draft_cap)
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
            if self._chunks_ride():
                chunks = self.scheduler.prefill_chunks(self.group.limits.row_budget)
                started = self.prefills.run([c for c in chunks if c[0].scores_prompt])  # every row's logits: apart
                self._verify_running(started, [c for c in chunks if not c[0].scores_prompt])
            else:
                started = self.prefills.run(self.scheduler.prefill_chunks(self._prefill_budget()))
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
        steady stream of arrivals cannot hold them back. Never with a sink: the first
        tokens leave at the prefill anyway (_verify_running), and a tick of its own would
        only hold the running streams back."""
        self._prefill_tick = (bool(started) and not (self._prefill_tick and others_wait)
                              and self.release.sink is None)
        return self._prefill_tick

    def _prefill_budget(self) -> int | None:
        """Prompt tokens this tick may prefill apart: bounded by config.prefill_stall where
        some sequence ready to verify was already streaming when the oldest prompt waiting
        for its prefill arrived (tandem.prefill_budget). Prompts sent with the streams
        running (a batch sent at once) are what that wave waits for anyway: full width."""
        pending = self.scheduler.pending_prefill() if self.config.prefill_stall > 0 else []
        if not pending:
            return None
        since = min(s.arrival for s in pending)
        ready = [s for s in self.scheduler.running if not s.finished and s.request_id not in self.scheduler.prefilling]
        if not any(s.first_token_time is not None and s.first_token_time < since for s in ready):
            return None
        rows = sum(1 + len(s.drafts) for s in ready)
        return stall_budget(self.ctx.cost, rows, self.config.prefill_stall, self.group.limits.row_budget)

    def _chunks_ride(self) -> bool:
        """Whether this tick's prompt chunks ride on a verify (config.mixed_prefill): some
        sequence is ready to verify, and the last ride was not refused (its chunks then
        go in a prefill of their own, where a failure finishes only its own sequence)."""
        refused, self.prefills.ride_refused = self.prefills.ride_refused, False
        mixed = self.config.mixed_prefill
        if mixed is None:  # a riding forward runs eagerly: it pays only where every forward does
            mixed = not self.group.limits.graphed
        if not mixed or refused:
            return False
        return any(not s.finished and s.request_id not in self.scheduler.prefilling for s in self.scheduler.running)

    def _verify_running(self, started: list[Sequence], ride: list[tuple[Sequence, int, int]] = ()) -> None:
        """One verify step per batch; the prompt chunks `ride` on the first."""
        if started and self.release.sink is not None:
            # Admitted right after a prefill tick, they share this tick with the verify;
            # with a sink, their first tokens still leave at their prefill.
            self.release.send_now()
        self.ctx.draft_cap = self.draft_cap.cap()
        for batch in self.scheduler.verify_batches(self.ctx.cost.estimate, self.adaptive.widths):
            if ride:
                self.prefills.ride(batch, ride)
                ride = []
            else:
                verify_step(batch, self.ctx)
            if not self.group.healthy():
                return  # the rest wait for the recovery next tick
        self.prefills.run(ride)  # no batch to ride on

    def _make_room(self, batch: list[Sequence], rows: int) -> list[Sequence]:
        """The batch less what the scheduler preempted to give it KV blocks for `rows`
        more positions; the preempted sequences' slots are released on the ranks."""
        kept = self.scheduler.make_room(batch, rows)
        self._release_slots(self.scheduler.preempted_slots)
        self.scheduler.preempted_slots = []
        return kept

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
