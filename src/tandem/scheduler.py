"""Scheduler: who waits, who runs, which slot and which KV blocks each holds, and how
running sequences are grouped into verify batches.

KV memory decides admission: a waiting sequence starts when a slot and the blocks of
its prompt are free (the longest cached prefix of the prompt costs nothing), first come
first served. When the pool runs dry mid-generation the most recently admitted running
sequence is preempted: its blocks go back and it waits at the front of the queue, to be
prefilled again later from its own tokens (its output so far is kept; nothing is emitted
twice). The one allocator is tandem.kv.KVBlockManager: every rank keeps the layout the
commands carry.

Sequences of one prompt (the n choices of a request) share its KV: the first admitted
prefills it, the others are admitted once its full blocks are cached (the tick after its
prefill completes), so each prefills only the prompt's last, partial block.

A tick prefills at most `max_prefill_tokens` prompt tokens: a longer prompt, or a burst of
prompts, is prefilled in chunks over several ticks (the oldest first), and the running
sequences keep decoding between them. An admitted sequence is verified only once its
prefill is complete.
"""
from __future__ import annotations

from collections import deque
from itertools import count

from tandem.batching import CostFn, plan_verify_batches
from tandem.kv import KVBlockManager
from tandem.sequence import Sequence, Status


class Scheduler:
    def __init__(self, num_slots: int, row_budget: int, kv: KVBlockManager, max_batch: int | None = None,
                 max_prefill_tokens: int | None = None):
        self.row_budget = row_budget
        self.max_prefill_tokens = max_prefill_tokens or 1 << 62
        self.max_batch = max_batch or num_slots
        self.kv = kv
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free_slots: list[int] = list(range(num_slots - 1, -1, -1))
        self.num_preemptions = 0
        self.preempted_slots: list[int] = []  # slots the ranks should release (the engine takes them)
        self._admissions = count()
        self._admitted_at: dict[str, int] = {}  # request id -> admission order (the newest goes first)
        # request id -> tokens of its prefill the ranks hold, while the prefill is incomplete
        self.prefilling: dict[str, int] = {}

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def admit(self) -> list[Sequence]:
        """Waiting sequences that get a slot and their prompt's blocks now (continuous
        batching: between ticks). seq.cached_len: how much of its prefill the prefix cache
        holds already."""
        admitted, deferred = [], []
        in_prefill = {twin_key(s, self.kv) for s in self.running if s.request_id in self.prefilling} - {None}
        while self.waiting and self.free_slots and len(self.running) < self.max_batch:
            seq = self.waiting[0]
            if seq.finished:  # aborted while waiting
                self.waiting.popleft()
                continue
            key = twin_key(seq, self.kv)
            if key in in_prefill:  # its twin computes the prompt's blocks: this one takes them cached, next tick
                deferred.append(self.waiting.popleft())
                continue
            # a prompt to score needs every row's logits: none of it may come from the cache
            cached = self.kv.admit(seq.request_id, prefill_tokens(seq), lookup=not seq.scores_prompt)
            if cached is None:
                break  # first come first served: the head waits for blocks, the rest behind it
            self.waiting.popleft()
            seq.cached_len = cached
            seq.slot = self.free_slots.pop()
            seq.status = Status.RUNNING
            self._admitted_at[seq.request_id] = next(self._admissions)
            self.prefilling[seq.request_id] = cached
            self.running.append(seq)
            admitted.append(seq)
            if key is not None:
                in_prefill.add(key)
        self.waiting.extendleft(reversed(deferred))
        return admitted

    def prefill_chunks(self, budget: int | None = None) -> list[tuple[Sequence, int, int]]:
        """This tick's prefill work within `budget` tokens (default max_prefill_tokens):
        (sequence, start, end) per chunk, the longest-waiting first. A chunk that stops short
        of its prompt's end stops at a block boundary (the next chunk starts on a fresh block,
        as after a prefix-cache hit); a budget under a block moves the oldest on by one block."""
        left, chunks = min(budget or self.max_prefill_tokens, self.max_prefill_tokens), []
        for seq in sorted(self.pending_prefill(), key=lambda s: self._admitted_at[s.request_id]):
            if left <= 0:
                break
            start, total = self.prefilling[seq.request_id], len(prefill_tokens(seq))
            end = min(total, start + left)
            if end < total:
                bs = self.kv.block_size
                end = end // bs * bs
                if end <= start:
                    if chunks:
                        break  # the rest of the budget holds no whole block
                    end = min(total, (start // bs + 1) * bs)  # a budget under a block still moves on
            chunks.append((seq, start, end))
            left -= end - start
        return chunks

    def prefilled(self, seq: Sequence, end: int) -> bool:
        """The ranks hold seq's prefill up to `end`; whether that completes it."""
        if end < len(prefill_tokens(seq)):
            self.prefilling[seq.request_id] = end
            return False
        self.prefilling.pop(seq.request_id, None)
        return True

    def pending_prefill(self) -> list[Sequence]:
        """Admitted sequences whose prefill is not complete (they are not verified yet)."""
        return [s for s in self.running if s.request_id in self.prefilling and not s.finished]

    def make_room(self, batch: list[Sequence], rows: int) -> list[Sequence]:
        """Blocks for `rows` more positions of every sequence of the batch, preempting the
        most recently admitted running sequences while the pool runs dry; the batch less
        the preempted (the pool is then large enough for what is left of it)."""
        batch = [s for s in batch if s.status is Status.RUNNING]  # less those preempted for an earlier one
        for seq in sorted(batch, key=lambda s: self._admitted_at[s.request_id]):
            if seq.status is not Status.RUNNING:
                continue  # preempted for one before it
            while not self.kv.grow(seq.request_id, seq.kv_len + rows):
                victim = max((s for s in self.running if not s.finished), key=lambda s: self._admitted_at[s.request_id])
                self.preempt(victim)
                if victim is seq:
                    break
        return [s for s in batch if s.status is Status.RUNNING]

    def preempt(self, seq: Sequence) -> None:
        """Back to the front of the queue, its blocks and slot freed; re-prefilled from its
        own tokens when it is admitted again."""
        self.num_preemptions += 1
        self.preempted_slots.append(seq.slot)
        self._leave(seq)
        seq.slot = None
        seq.status = Status.WAITING
        seq.drafts = []
        self.waiting.appendleft(seq)

    def committed(self, seq: Sequence) -> None:
        """The ranks hold seq's KV up to its kv_len: blocks past it go back (a rewind after
        rejected drafts), its full blocks become shareable (a finished sequence's too: the
        prompt of a one-token request is the next one's prefix)."""
        if self.kv.has(seq.request_id):
            self.kv.commit(seq.request_id, seq.committed_ids)

    def table(self, seq: Sequence) -> list[int]:
        return self.kv.table(seq.request_id)

    def verify_batches(self, cost: CostFn | None = None, widths: tuple[int, ...] = ()) -> list[list[Sequence]]:
        """Running sequences in verify batches within the row budget: greedy ones of
        different draft counts share a padded batch where the cost model says it pays
        (see tandem.batching), the others go by exact draft count. widths: the draft
        counts a block drafter's forwards are padded to (see tandem.batching.batch_width)."""
        ready = [s for s in self.running if s.request_id not in self.prefilling]
        return plan_verify_batches(ready, self.row_budget, self.max_batch, cost, widths)

    def reap(self) -> list[Sequence]:
        """Remove finished sequences from the running set; their slots and blocks go back."""
        done = [s for s in self.running if s.finished]
        for s in done:
            self._leave(s)  # s.slot stays: the engine releases it on the ranks
        return done

    def requeue(self, seqs: list[Sequence]) -> None:
        """Admitted sequences go back to the front of the queue, in order, their slots and
        blocks freed (a prefill that met a lost rank: they wait for the recovery instead)."""
        for s in seqs:
            self._leave(s)
            s.slot, s.status = None, Status.WAITING
        self.waiting.extendleft(reversed(seqs))

    def reset_kv(self) -> None:
        """Restarted ranks hold no KV: every table is dropped; the running sequences are
        given new ones (re-prefilled from their tokens) as far as the pool goes, and the
        rest wait at the front of the queue."""
        running = [s for s in self.running if not s.finished]
        self.kv = KVBlockManager(self.kv.num_blocks, self.kv.block_size, prefix_caching=self.kv.prefix_caching)
        for s in running:
            s.cached_len = 0
            if self.kv.admit(s.request_id, prefill_tokens(s)) is None:
                self.preempt(s)
            else:
                self.prefilling[s.request_id] = 0

    def remove_waiting(self, seq: Sequence) -> bool:
        try:
            self.waiting.remove(seq)
            return True
        except ValueError:
            return False

    def kv_summary(self) -> dict:
        kv = self.kv
        return {"num_blocks": kv.num_blocks, "block_size": kv.block_size, "num_tokens": kv.num_blocks * kv.block_size,
                "free_blocks": kv.num_free(), "usage": kv.usage(), "prefix_caching": kv.prefix_caching}

    @property
    def has_work(self) -> bool:
        return bool(self.waiting) or any(not s.finished for s in self.running)

    def _leave(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        if seq.slot is not None:
            self.free_slots.append(seq.slot)
        self.kv.free(seq.request_id)
        self._admitted_at.pop(seq.request_id, None)
        self.prefilling.pop(seq.request_id, None)


def twin_key(seq: Sequence, kv: KVBlockManager) -> tuple | None:
    """What sequences with the same first prompt share (the n choices of one request): its
    prompt, when its first admission could take full blocks of it from the prefix cache; else
    None. Of twins admitted together only the first prefills the prompt's blocks: the others
    wait for them to be cached (Scheduler.admit)."""
    if seq.output_ids or not kv.prefix_caching or seq.scores_prompt or len(seq.prompt_ids) <= kv.block_size:
        return None
    return seq.prompt_key


def prefill_tokens(seq: Sequence) -> list[int]:
    """What a prefill writes into the KV: the prompt the first time; after a preemption or a
    recovery every token but the last, which is row 0 of the next verify."""
    return seq.all_ids[:-1] if seq.output_ids else seq.prompt_ids
