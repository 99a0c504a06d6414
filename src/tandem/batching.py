"""Which running sequences share one verify forward.

The seed batches sequences with the same draft count: n*(g+1) rows, one forward. With
drafters whose draft count varies from sequence to sequence (an n-gram match is as long
as it is), that costs one forward per distinct count each tick, and on hardware where a
forward mostly streams the weights (a CPU or GPU at small batch) every extra forward
costs nearly as much as the first.

So greedy sequences of different counts may share a batch: each is padded to the
batch's count with pad rows. The pad rows are computed but never verified: a sequence's
verdict reads only the picks of its own rows (verify.step), and rows after them cannot
change them (causal attention). Whether to merge is a cost question, answered with the
measured forward cost by rows: the greedy count levels, sorted, are split into
contiguous runs so that the estimated sum of forward times is least (a small dynamic
programme over at most max_gamma + 1 levels).

Not merged: sampled sequences (the rank's q covers the drafter's own drafts only, and
the accept rule must see exactly them) and sequences whose context has no room for the
padding. They batch by exact count, as in the seed.
"""
from __future__ import annotations

from collections.abc import Callable

from tandem.sequence import Sequence

CostFn = Callable[[int], "float | None"]  # estimated forward ms for a number of rows; None = unknown
MAX_ROWS = 17  # 1 + the most drafts a round (EngineConfig allows 16)


def plan_verify_batches(running: list[Sequence], row_budget: int, max_batch: int,
                        cost: CostFn | None = None, widths: tuple[int, ...] = ()) -> list[list[Sequence]]:
    """Batches for this tick (the exact-count ones first, largest count first, then the
    merged ones); every batch fits the row budget at its batch_width(batch, widths)."""
    exact: dict[int, list[Sequence]] = {}
    mergeable: dict[int, list[Sequence]] = {}
    for s in running:
        if s.finished:
            continue
        g = len(s.drafts)
        (mergeable if can_pad(s) else exact).setdefault(g, []).append(s)

    batches = []
    for g in sorted(exact, reverse=True):
        batches += _chunk(exact[g], g, row_budget, max_batch)
    for run in _merge_levels(mergeable, row_budget, max_batch, cost):
        width = batch_width(run, widths)
        batches += _chunk(sorted(run, key=lambda s: -len(s.drafts)), width, row_budget, max_batch)
    return batches


def batch_width(batch: list[Sequence], widths: tuple[int, ...] = ()) -> int:
    """Drafts per sequence in the batch's forward: the longest (shorter ones are padded).
    With a block drafter (widths = the draft counts its rounds take, tandem.adaptive.
    block_ladder) a batch that drafts and can pad is padded to the next of them: a
    request's last round, cut short by max_tokens, or a copied draft, would otherwise be
    one more verify shape (on a GPU one more CUDA graph; an H200 captured (1, 3) inside a
    timed run: ~0.1 s of a 0.9 s batch-1 benchmark)."""
    g = max(len(s.drafts) for s in batch)
    if g > 0 and all(can_pad(s) for s in batch):
        return min((w for w in widths if w >= g), default=g)
    return g


def can_pad(s: Sequence) -> bool:
    # room for up to MAX_ROWS rows past the committed KV: padding never runs past the context
    return s.params.greedy and s.max_model_len - s.kv_len >= MAX_ROWS


def _chunk(seqs: list[Sequence], g: int, row_budget: int, max_batch: int) -> list[list[Sequence]]:
    per_batch = max(1, min(max_batch, row_budget // (g + 1)))
    return [seqs[i : i + per_batch] for i in range(0, len(seqs), per_batch)]


def _forward_ms(n: int, g: int, row_budget: int, max_batch: int, cost: CostFn) -> float | None:
    """Estimated time of n sequences padded to g drafts, chunked by the row budget."""
    per_batch = max(1, min(max_batch, row_budget // (g + 1)))
    total = 0.0
    for i in range(0, n, per_batch):
        t = cost(min(per_batch, n - i) * (g + 1))
        if t is None:
            return None
        total += t
    return total


def plan_cost(draft_counts: list[int], row_budget: int, max_batch: int, cost: CostFn) -> float | None:
    """Least estimated forward ms of a tick whose sequences draft `draft_counts` (all taken
    as mergeable): what the adaptive draft cap prices. None while nothing is measured."""
    levels: dict[int, int] = {}
    for g in draft_counts:
        levels[g] = levels.get(g, 0) + 1
    counts = sorted(levels, reverse=True)
    _, total = _best_runs(counts, [levels[g] for g in counts], row_budget, max_batch, cost)
    return total


def _merge_levels(levels: dict[int, list[Sequence]], row_budget: int, max_batch: int,
                  cost: CostFn | None) -> list[list[Sequence]]:
    """Contiguous runs of the sorted draft-count levels, each run one padded batch (before
    chunking), chosen for the least estimated total forward time. Without a cost model
    (or before anything is measured) every level merges into one run: one forward a tick."""
    counts = sorted(levels, reverse=True)  # counts[0] is the largest
    runs, _ = _best_runs(counts, [len(levels[g]) for g in counts], row_budget, max_batch, cost)
    return [[s for x in run for s in levels[counts[x]]] for run in runs]


def _best_runs(counts: list[int], sizes: list[int], row_budget: int, max_batch: int,
               cost: CostFn | None) -> tuple[list[range], float | None]:
    """Split levels 0..L-1 (draft counts in descending order, sizes[i] sequences each) into
    contiguous runs padded to each run's first count; least total estimated ms."""
    L = len(counts)
    if L == 0:
        return [], 0.0

    def run_cost(i: int, j: int) -> float | None:  # levels i..j-1 padded to counts[i]
        return _forward_ms(sum(sizes[i:j]), counts[i], row_budget, max_batch, cost)

    everything = run_cost(0, L) if cost is not None else None
    if everything is None or L == 1:
        return [range(0, L)], everything
    # best[j]: least cost of levels 0..j-1; cut[j]: where its last run starts
    best, cut = [0.0] + [float("inf")] * L, [0] * (L + 1)
    for j in range(1, L + 1):
        for i in range(j):
            c = run_cost(i, j)
            if c is not None and best[i] + c < best[j] - 1e-9:  # strictly better: ties keep longer runs
                best[j], cut[j] = best[i] + c, i
    runs, j = [], L
    while j > 0:
        runs.append(range(cut[j], j))
        j = cut[j]
    return runs[::-1], best[L]
