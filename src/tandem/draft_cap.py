"""The draft-cap policy: this tick's cap on drafts per sequence, from what each running
sequence's drafts have been worth and what a verify of the whole batch costs."""
from __future__ import annotations

from tandem.adaptive import AdaptiveSpec, BatchCostModel, expected_tokens
from tandem.batching import plan_cost
from tandem.scheduler import Scheduler


class DraftCapPolicy:
    def __init__(self, adaptive: AdaptiveSpec, cost: BatchCostModel, scheduler: Scheduler, *, enabled: bool):
        self.adaptive = adaptive
        self.cost = cost
        self.scheduler = scheduler
        self.enabled = enabled  # off: every sequence may draft max_gamma

    def cap(self) -> int:
        if not self.enabled:
            return self.adaptive.max_gamma
        live = [s for s in self.scheduler.running if not s.finished]
        cost, adaptive = self.cost, self.adaptive
        if adaptive.whole_blocks:  # a block drafter rests a sequence no prefix of whose block pays (see block_break_even)
            needs = [(c, cost.block_break_even(c, len(live))) for c in adaptive.widths]
            for s in live:
                if all(expected_tokens(s.spec.alpha, min(c, s.spec.gamma)) - 1.0 < need for c, need in needs):
                    adaptive.rest(s.spec, len(s.output_ids))
        gammas = [s.spec.gamma if adaptive.allowed(s.spec, len(s.output_ids)) else 0 for s in live]
        return cost.best_cap(gammas, [s.spec.alpha for s in live], adaptive.ladder, plan=self.plan)

    def plan(self, draft_counts: list[int]) -> float | None:
        """Estimated forward ms of a tick whose sequences draft `draft_counts`."""
        return plan_cost(draft_counts, self.scheduler.row_budget, self.scheduler.max_batch, self.cost.estimate)
