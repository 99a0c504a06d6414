"""Engine: tandem embedded in one process. add_request / step / generate / stream / abort.

step() is one tick: recover the shard group if it was lost, admit waiting requests
(prefill), then one verify step per batch of sequences with the same draft count.
Requests join and leave between ticks (continuous batching).

A tick's outputs leave only once every rank has acknowledged its verdicts. By default
step() waits for that and returns them. A caller that sets `emit` (the scheduler actor)
lets a group whose acknowledgements come later (gRPC sessions) keep the round trip off
the tick: the outputs are held, and `emit` gets them from inside the next tick as soon
as the acknowledgements are read, while that tick's first command runs on the ranks.
Held outputs are built (their text decoded) only then, off the tick too (due_outputs).
"""
from __future__ import annotations

import logging
import secrets
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence as Seq

from tandem.adaptive import AdaptiveSpec, BatchCostModel, expected_tokens
from tandem.batching import plan_cost
from tandem.clock import Clock, MonotonicClock
from tandem.config import EngineConfig
from tandem.detokenizer import Detokenizer
from tandem.due_outputs import DueOutput, build_output
from tandem.drafters.factory import build_drafter
from tandem.errors import EngineUnavailableError, InvalidRequestError, ShapeError, ShardError
from tandem.metrics import EngineMetrics
from tandem.outputs import RequestOutput
from tandem.sampling_params import SamplingParams
from tandem.scheduler import Scheduler
from tandem.sequence import FinishReason, Sequence, Status
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
    ):
        self.config = config or EngineConfig()
        self.group = group
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(eos_token_ids)
        self.model_name = model_name
        self.clock = clock or MonotonicClock()
        self.metrics = metrics or EngineMetrics()
        limits = group.limits
        self.scheduler = Scheduler(limits.num_slots, limits.row_budget)
        drafter = build_drafter(self.config.drafter, group, ngram_max=self.config.ngram_max, ngram_min=self.config.ngram_min)
        max_gamma = self.config.num_speculative_tokens if drafter is not None else 0
        whole_blocks = drafter is not None and drafter.whole_blocks
        self.adaptive = AdaptiveSpec(max_gamma, adaptive=self.config.adaptive, whole_blocks=whole_blocks)
        self.ctx = StepContext(
            group=group,
            drafter=drafter,
            adaptive=self.adaptive,
            cost=BatchCostModel(warmup_samples=1, whole_blocks=whole_blocks),
            metrics=self.metrics,
            clock=self.clock,
            detok=Detokenizer(tokenizer),
            max_verify_failures=self.config.max_verify_failures,
            draft_cap=max_gamma,
        )
        self.requests: dict[str, Sequence] = {}
        self._reported: dict[str, tuple[int, str]] = {}  # request id -> (tokens, text) already handed out
        self._lock = threading.RLock()  # held for a whole tick
        self._submit_lock = threading.Lock()  # guards `requests` and `_inbox`; held briefly
        self._inbox: deque[Sequence] = deque()  # added since the last tick began
        self._ids = 0
        self.recovering = False
        self._prefill_tick = False  # the last tick only admitted (see step)
        # Called from inside step() (on its thread) with outputs held from the tick before;
        # None: every output comes back from step() (see the module's docstring).
        self.emit: Callable[[list[RequestOutput]], None] | None = None
        self._held: list[DueOutput] | None = None  # the last tick's outputs, verdicts unacknowledged
        group.on_acknowledged = self._acknowledged

    # ---- building -----------------------------------------------------------------------

    @classmethod
    def from_config(cls, config: EngineConfig | None = None, *, clock: Clock | None = None, progress: bool = True, **overrides) -> "Engine":
        """An engine on the configured model: one in-process rank, or `shards` gRPC shard processes."""
        from dataclasses import replace

        config = replace(config, **overrides) if config else EngineConfig(**overrides)
        if config.shards == 1:
            from tandem.shard.factory import build_model_shard
            from tandem.shard.local_group import LocalShardGroup

            shard, loaded = build_model_shard(config.shard_spec(), progress=progress)
            group = LocalShardGroup(shard)
        else:
            from tandem.model.loader import load_tokenizer
            from tandem.rpc.launcher import launch_local_group

            group = launch_local_group(config.shard_spec(), config.shards)
            loaded = load_tokenizer(config.model)
        return cls(group, loaded.tokenizer, loaded.eos_token_ids, config, clock=clock, model_name=loaded.name)

    # ---- requests -----------------------------------------------------------------------

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None, request_id: str | None = None) -> str:
        """Queue one request for the next tick; its id. Raises InvalidRequestError for bad
        input, EngineUnavailableError while the shard group recovers."""
        (result,) = self.add_requests([(prompt, params, request_id)])
        if isinstance(result, Exception):
            raise result
        return result

    def add_requests(self, requests: list[tuple]) -> list[str | Exception]:
        """Queue several requests, each (prompt, params, request_id or None), for the same
        tick: per request its id, or the error it was refused with (one bad request harms
        none of the others). All that are taken land in the inbox together, so a burst is
        prefilled as one batch even while a tick is in progress."""
        if self.recovering:
            return [EngineUnavailableError("the shard group is recovering; retry shortly") for _ in requests]
        # one tokenizer call for all text prompts: a third of the time of one call each
        # (a text that is no Unicode, such as a lone surrogate, would fail the whole call: it
        # is left out of it, and refused alone in _prompt_ids)
        texts = [p for p, _, _ in requests if _tokenizable(p)]
        encoded = iter(self.tokenizer(texts).input_ids if texts else [])
        prepared: list[tuple | Exception] = []
        for prompt, params, request_id in requests:
            params = params or SamplingParams()
            try:
                ids = self._prompt_ids(prompt, next(encoded) if _tokenizable(prompt) else None)
                if not isinstance(params, SamplingParams):
                    raise InvalidRequestError("params", f"expected SamplingParams, got {type(params).__name__}")
                prepared.append((prompt, ids, params, request_id))
            except InvalidRequestError as e:
                prepared.append(e)
        results: list[str | Exception] = []
        # Only the short submit lock, never the tick's: requests sent during a tick wait
        # in the inbox, and the next tick takes every waiting one at once.
        with self._submit_lock:
            for item in prepared:
                if isinstance(item, Exception):
                    results.append(item)
                    continue
                prompt, ids, params, request_id = item
                if request_id is None:
                    self._ids += 1
                    request_id = f"req-{self._ids}"
                elif request_id in self.requests:
                    results.append(InvalidRequestError("request_id", f"{request_id!r} is already running"))
                    continue
                seq = Sequence(
                    request_id=request_id,
                    prompt=prompt if isinstance(prompt, str) else None,
                    prompt_ids=ids,
                    params=params,
                    seed=params.seed if params.seed is not None else secrets.randbits(63),
                    eos_ids=self.eos_ids,
                    max_seq_len=self.group.limits.max_seq_len,
                    arrival=self.clock.now(),
                )
                seq.spec = self.adaptive.new_state()
                self.requests[request_id] = seq
                self._inbox.append(seq)
                results.append(request_id)
        return results

    def _prompt_ids(self, prompt, encoded: list[int] | None = None) -> list[int]:
        """The prompt's token ids, checked; `encoded`: a text prompt's ids, tokenized already."""
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt", "must not be empty")
            if not _tokenizable(prompt):
                raise InvalidRequestError("prompt", "is not valid Unicode text (it holds a lone UTF-16 surrogate)")
            ids = encoded if encoded is not None else self.tokenizer(prompt).input_ids
        elif isinstance(prompt, (list, tuple)):
            ids = list(prompt)
            vocab = self.group.limits.vocab_size
            if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in ids):
                raise InvalidRequestError("prompt", f"token ids must be integers in [0, {vocab})")
        else:
            raise InvalidRequestError("prompt", f"must be a string or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise InvalidRequestError("prompt", "must not be empty")
        limit = self.group.limits.max_seq_len
        if len(ids) >= limit:
            raise InvalidRequestError("prompt", f"{len(ids)} tokens do not fit the context of {limit} (max_seq_len) with room to generate")
        return ids

    def abort(self, request_id: str) -> bool:
        with self._lock:
            seq = self.requests.get(request_id)
            if seq is None or seq.finished:
                return False
            seq.finish(FinishReason.ABORT)
            self.scheduler.remove_waiting(seq)
            return True

    def has_unfinished(self) -> bool:
        return bool(self._inbox) or self.scheduler.has_work or self._held is not None

    # ---- the tick -----------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        with self._lock:
            with self._submit_lock:
                while self._inbox:
                    self.scheduler.add(self._inbox.popleft())
            earlier = []  # outputs held from the last tick that no acknowledgement released
            if not self.group.healthy():
                earlier = self._flush_held()
                self._recover()
            others_wait = bool(self.scheduler.running)
            admitted = self._admit()
            if admitted and not (self._prefill_tick and others_wait):
                # The new sequences' first tokens go out now: their time to first token is
                # their prefill, not prefill + the batch's verify. At most every other tick
                # while others run, so a steady stream of arrivals cannot hold them back.
                self._prefill_tick = True
                return earlier + self._flush_held() + self._collect()
            if admitted and self.emit is not None:
                # Admitted right after a prefill tick, they share this tick with the verify;
                # with a way out mid-tick, their first tokens still leave at their prefill.
                # (A prefill is no verdict: every rank has replied to it already.)
                firsts = self._collect()
                if firsts:
                    self.emit(firsts)
            self._prefill_tick = False
            self.ctx.draft_cap = self._draft_cap()
            for batch in self.scheduler.verify_batches(self.ctx.cost.estimate, self.adaptive.block):
                verify_step(batch, self.ctx)
                if not self.group.healthy():
                    break  # the rest wait for the recovery next tick
            earlier += self._flush_held()
            if self.emit is not None and self.group.owes_acknowledgements():
                self._held = self._due()  # built and released by _acknowledged during the next tick
                return earlier
            self._settle()
            return earlier + self._collect()

    def _settle(self) -> None:
        """Wait until every rank has acknowledged the verdicts sent so far: no output leaves
        before. A batch whose verdict some rank did not take finishes with an error (a
        sequence that finished in that tick anyway keeps its tokens: none follow), and
        its held outputs are dropped."""
        lost = self.group.settle()
        failed = set()
        for batch_id in lost:
            for s in self.ctx.unsettled.get(batch_id, []):
                if not s.finished:
                    failed.add(s.request_id)
                s.finish(FinishReason.ERROR, error=f"verify verdict of batch {batch_id} not acknowledged by every rank")
        if self._held and failed:
            # built, never handed out: the final output's deltas start after them, so no
            # stream gets a token whose verdict a rank never took
            self._build([d for d in self._held if d.request_id in failed])
            self._held = [d for d in self._held if d.request_id not in failed]
        self.ctx.unsettled.clear()

    def _acknowledged(self) -> None:
        """The group's call once it has read every acknowledgement owed so far, all taken
        (from inside a later command, before that command's reply): the held outputs go."""
        self.ctx.unsettled.clear()
        held, self._held = self._held, None
        if held:
            self.emit(self._build(held))

    def flush(self) -> list[RequestOutput]:
        """Outputs held from the last tick (see emit), once the ranks acknowledged them."""
        with self._lock:
            return self._flush_held()

    def _flush_held(self) -> list[RequestOutput]:
        """The held outputs that no acknowledgement released yet (no command went out since,
        or a rank was lost): settle now, then hand them back."""
        if self._held is None:
            return []
        self._settle()  # may release them through _acknowledged
        held, self._held = self._held or [], None
        return self._build(held)

    def _admit(self) -> bool:
        """Prefill the sequences that got a slot; whether there were any."""
        new = self.scheduler.admit()
        if new:
            self._prefill(new, first=True)
        return bool(new)

    def _prefill(self, seqs: list[Sequence], first: bool) -> None:
        """Prefill a batch; on failure retry one by one so a failure finishes only its own."""
        items = [self._prefill_item(s, first) for s in seqs]
        t0 = self.clock.now()
        try:
            res = self.group.prefill(items)
        except (ShardError, ShapeError) as e:
            if isinstance(e, ShardError) and e.unhealthy:
                self._requeue(seqs)
                return
            if len(seqs) == 1:
                seqs[0].finish(FinishReason.ERROR, error=f"prefill failed: {e}")
                return
            for s in seqs:
                self._prefill([s], first)
            return
        now = self.clock.now()
        self.ctx.cost.record_prefill(sum(len(it.tokens) for it in items), (now - t0) * 1000.0)
        for s, tok in zip(seqs, res.next_tokens):
            if first:
                self.metrics.prompt_tokens.inc(len(s.prompt_ids))
                self.metrics.queue_time.observe(t0 - s.arrival)
                self.metrics.time_to_first_token.observe(now - s.arrival)
                s.first_token_time = now
                s.emit(tok, self.ctx.detok)
                self.metrics.generated_tokens.inc()
            s.drafts = []
        # the cap counts the new sequences before their first propose: a cap left from a
        # smaller batch would draft (and, for a draft model, catch up) a whole wave of prompts
        self.ctx.draft_cap = self._draft_cap()
        propose_drafts([s for s in seqs if not s.finished], self.ctx)

    @staticmethod
    def _prefill_item(s: Sequence, first: bool) -> PrefillItem:
        # A re-prefill writes all but the last token, which is row 0 of the next verify.
        return PrefillItem(slot=s.slot, tokens=s.prompt_ids if first else s.all_ids[:-1], sampling=s.sampling)

    def _requeue(self, seqs: list[Sequence]) -> None:
        """Admitted sequences whose prefill met a lost rank wait for the recovery instead."""
        for s in seqs:
            self.scheduler.running.remove(s)
            self.scheduler.free_slots.append(s.slot)
            s.slot, s.status = None, Status.WAITING
        self.scheduler.waiting.extendleft(reversed(seqs))

    def _recover(self) -> None:
        """Restart a lost shard group and re-prefill every running sequence from its tokens."""
        self.recovering = True
        try:
            self.group.restart()
        except Exception as e:  # noqa: BLE001 - stay recovering; the next tick tries again
            log.error("shard group restart failed: %s", e)
            return
        running = [s for s in self.scheduler.running if not s.finished]
        log.warning("shard group restarted; re-prefilling %d running sequences", len(running))
        self.recovering = False
        if running:
            self._prefill(running, first=False)

    def _draft_cap(self) -> int:
        if not self.config.adaptive:
            return self.adaptive.max_gamma
        live = [s for s in self.scheduler.running if not s.finished]
        sched, cost = self.scheduler, self.ctx.cost
        if self.adaptive.whole_blocks:  # a block drafter rests a sequence whose block does not pay (see block_break_even)
            need = cost.block_break_even(self.adaptive.max_gamma, len(live))
            for s in live:
                if expected_tokens(s.spec.alpha, s.spec.gamma) - 1.0 < need:
                    self.adaptive.rest(s.spec, len(s.output_ids))
        gammas = [s.spec.gamma if self.adaptive.allowed(s.spec, len(s.output_ids)) else 0 for s in live]
        return cost.best_cap(gammas, [s.spec.alpha for s in live], self.adaptive.ladder,
                             plan=lambda gs: plan_cost(gs, sched.row_budget, sched.max_batch, cost.estimate))

    # ---- outputs ------------------------------------------------------------------------

    def _collect(self) -> list[RequestOutput]:
        return self._build(self._due())

    def _due(self) -> list[DueOutput]:
        """The outputs this tick owes (built later by _build); finished requests leave, their
        slots are released."""
        dues = []
        with self._submit_lock:
            requests = list(self.requests.items())
        for rid, seq in requests:
            prev_tokens, prev_text = self._reported.get(rid, (0, ""))
            if len(seq.output_ids) != prev_tokens or seq.finished:
                dues.append(DueOutput.of(seq, prev_tokens, prev_text))
                self._reported[rid] = (len(seq.output_ids), prev_text)  # the text once built
            if seq.finished:
                self.metrics.requests_finished.labels(finished_reason=seq.finish_reason.value).inc()
                if seq.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
                    self.metrics.record_finished(seq.arrival, seq.first_token_time, len(seq.output_ids), self.clock.now())
                with self._submit_lock:
                    del self.requests[rid]
                self._reported.pop(rid, None)
        done = self.scheduler.reap()
        slots = [s.slot for s in done if s.slot is not None]
        if slots and self.group.healthy():
            try:
                self.group.release(slots)
            except (ShardError, ShapeError) as e:
                log.error("release of slots %s failed: %s", slots, e)
        return dues

    def _build(self, dues: list[DueOutput]) -> list[RequestOutput]:
        outs = [build_output(d, self.ctx.detok) for d in dues]
        for d, out in zip(dues, outs):
            if self._reported.get(d.request_id, (None,))[0] == d.tokens:
                self._reported[d.request_id] = (d.tokens, out.text)
        return outs

    # ---- conveniences -------------------------------------------------------------------

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run the given prompts to completion (with whatever else is running) and return
        their final outputs in order."""
        single = isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int))
        prompts = [prompts] if single else list(prompts)
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise InvalidRequestError("params", f"{len(plist)} params for {len(prompts)} prompts")
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        final: dict[str, RequestOutput] = {}
        while len(final) < len(ids):
            for out in self.step():
                if out.finished:
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

    def chat_prompt(self, messages: list[dict]) -> str:
        """Messages rendered with the tokenizer's chat template, ready to generate from."""
        if not self.tokenizer.chat_template:
            raise InvalidRequestError("messages", "this model has no chat template")
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def close(self) -> None:
        self.group.close()


def _tokenizable(prompt) -> bool:
    """A non-empty text that encodes to UTF-8 (what the tokenizer takes)."""
    if not isinstance(prompt, str) or not prompt:
        return False
    if prompt.isascii():
        return True
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
