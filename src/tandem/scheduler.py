"""Scheduler: who waits, who runs, which KV slot each holds, and how running
sequences are grouped into verify batches."""
from __future__ import annotations

from collections import deque

from tandem.batching import CostFn, plan_verify_batches
from tandem.sequence import Sequence, Status


class Scheduler:
    def __init__(self, num_slots: int, row_budget: int, max_batch: int | None = None):
        self.row_budget = row_budget
        self.max_batch = max_batch or num_slots
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free_slots: list[int] = list(range(num_slots - 1, -1, -1))

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def admit(self) -> list[Sequence]:
        """Waiting sequences that get a free slot now (continuous batching: between ticks)."""
        admitted = []
        while self.waiting and self.free_slots and len(self.running) < self.max_batch:
            seq = self.waiting.popleft()
            if seq.finished:  # aborted while waiting
                continue
            seq.slot = self.free_slots.pop()
            seq.status = Status.RUNNING
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def verify_batches(self, cost: CostFn | None = None, block: int = 0) -> list[list[Sequence]]:
        """Running sequences in verify batches within the row budget: greedy ones of
        different draft counts share a padded batch where the cost model says it pays
        (see tandem.batching), the others go by exact draft count. Each batch is in slot
        order: consecutive slots let the target read its KV cache in place. block: a block
        drafter's drafts a round (see tandem.batching.batch_width), else 0."""
        batches = plan_verify_batches(self.running, self.row_budget, self.max_batch, cost, block)
        return [sorted(b, key=lambda s: s.slot) for b in batches]

    def reap(self) -> list[Sequence]:
        """Remove finished sequences from the running set; their slots go back to the pool."""
        done = [s for s in self.running if s.finished]
        if done:
            self.running = [s for s in self.running if not s.finished]
            for s in done:
                if s.slot is not None:
                    self.free_slots.append(s.slot)
        return done

    def requeue(self, seqs: list[Sequence]) -> None:
        """Admitted sequences go back to the front of the queue, in order, their slots
        freed (a prefill that met a lost rank: they wait for the recovery instead)."""
        for s in seqs:
            self.running.remove(s)
            self.free_slots.append(s.slot)
            s.slot, s.status = None, Status.WAITING
        self.waiting.extendleft(reversed(seqs))

    def remove_waiting(self, seq: Sequence) -> bool:
        try:
            self.waiting.remove(seq)
            return True
        except ValueError:
            return False

    @property
    def has_work(self) -> bool:
        return bool(self.waiting) or any(not s.finished for s in self.running)
