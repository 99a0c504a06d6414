"""Adaptive speculation: how many drafts each sequence gets next (the seed's
record_verify / spec_allowed), and a batch-level cap so that speculation never
makes a large batch slower than plain decoding.

Per sequence: gamma climbs a ladder after a fully accepted round and falls after a
rejected one; after `off_after` rounds in a row that accept nothing, speculation
is off for the sequence until it has emitted `retry_after` more tokens. A block
drafter (DFlash) has no ladder and no such rest: each tick, a sequence drafts only
while its own alpha pays for the rows its block adds (BatchCostModel.block_break_even),
and while it does not, its alpha drifts back toward the prior, so it retries soon.

Per batch: a measured cost table (forward ms by rows) and each sequence's
acceptance rate alpha give the expected tokens per millisecond of a draft cap c,
sum_i (1 - alpha_i^(c_i+1)) / (1 - alpha_i) / (T(rows(c)) + propose(c)), against
plain decoding n / T(n). The best cap wins, 0 included.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

GAMMA_LADDER = (0, 1, 2, 3, 4, 6, 8, 12, 16)
ALPHA_PRIOR = 0.7  # a sequence's alpha before any of its drafts were judged


def _ladder(max_gamma: int) -> tuple[int, ...]:
    """GAMMA_LADDER's rungs up to max_gamma, max_gamma included (a DFlash block of 8: 7)."""
    return tuple(sorted({g for g in GAMMA_LADDER if g <= max_gamma} | {max(0, max_gamma)}))


def block_ladder(max_gamma: int) -> tuple[int, ...]:
    """A block drafter's caps: 0, the whole block, and the prefixes whose verify rows (the
    drafts and the bonus row) are a power of two (a block of 8: 0, 1, 3, 7). A prefix saves the drafter nothing but
    saves verify rows, which a CPU pays for: SmolLM2 int4 on 2 cores verified 4 rows in
    20.6 ms against 29.6 for 8, and 3 drafts a round ran 64 tok/s against 7 drafts' 53.
    Few rungs, each a power of two: each is one more verify shape (on a GPU one more CUDA
    graph), and the cost model prices rows by power-of-two buckets."""
    rungs = {0, max(0, max_gamma)} | {(1 << i) - 1 for i in range(1, 8) if (1 << i) - 1 < max_gamma}
    return tuple(sorted(rungs))


@dataclass
class SpecControl:
    """One sequence's speculation state.

    alpha is the chance that a draft passes, given that the ones before it did (what
    expected_tokens assumes): EMAs of the drafts that passed and of the drafts judged (the
    passed ones and the first rejected one; the drafts after it were never judged). The
    plain share accepted / drafted read a block drafter's 1.6 of 7 drafts (acceptance
    length 2.6) as alpha 0.23, priced its rounds at 1.3 tokens and turned it off."""

    gamma: int
    misses: int = 0  # verify rounds in a row that accepted nothing
    off_until: int = 0  # speculation resumes once this many tokens are out
    passed: float = ALPHA_PRIOR  # EMA of drafts accepted a round (a prior of one judged draft)
    judged: float = 1.0  # EMA of drafts judged a round

    @property
    def alpha(self) -> float:
        return self.passed / self.judged


class AdaptiveSpec:
    def __init__(self, max_gamma: int, *, off_after: int = 3, retry_after: int = 32, ema: float | None = None,
                 adaptive: bool = True, whole_blocks: bool = False):
        self.max_gamma = max_gamma
        # whole_blocks (a block drafter: fewer drafts cost as much as all): gamma stays at
        # its most; only the batch cap and turning speculation off move it
        self.whole_blocks = whole_blocks
        self.ladder = block_ladder(max_gamma) if whole_blocks else _ladder(max_gamma)
        self.off_after = off_after
        self.retry_after = retry_after
        # A block round's outcome swings from 0 to 7 accepted, so its alpha is smoothed more:
        # at 0.3 a few misses priced DFlash out of stretches where it then accepted 3 a round
        # (CPU, batch 1, held-out prompts: 5.52 s against 5.34 s at 0.15 for the same tokens)
        self.ema = ema if ema is not None else (0.15 if whole_blocks else 0.3)
        self.adaptive = adaptive

    @property
    def widths(self) -> tuple[int, ...]:
        """The draft counts a block drafter's verify forwards are padded to (its ladder's
        rungs: see tandem.batching.batch_width), else () (each forward as wide as its drafts)."""
        return self.ladder[1:] if self.whole_blocks else ()

    def new_state(self) -> SpecControl:
        return SpecControl(gamma=self.max_gamma)

    def allowed(self, st: SpecControl, num_output: int) -> bool:
        return self.max_gamma > 0 and num_output >= st.off_until

    def record_verify(self, st: SpecControl, drafted: int, accepted: int, num_output: int) -> None:
        if drafted == 0 or not self.adaptive:
            return
        judged = accepted + (1 if accepted < drafted else 0)
        st.passed = (1 - self.ema) * st.passed + self.ema * accepted
        st.judged = (1 - self.ema) * st.judged + self.ema * judged
        i = self.ladder.index(st.gamma) if st.gamma in self.ladder else len(self.ladder) - 1
        if accepted == 0:
            st.misses += 1
            # a block drafter's misses show in alpha, which block_break_even weighs against what a
            # block costs: three misses in a row are common where it accepts 3 a round, and
            # 32 tokens of rest after them cost a CPU 2.05x -> 1.43x (40% of the tokens plain)
            if st.misses >= self.off_after and not self.whole_blocks:
                st.misses = 0
                st.off_until = num_output + self.retry_after
                st.gamma = self.max_gamma  # the retry starts fresh
            elif not self.whole_blocks:
                st.gamma = self.ladder[max(i - 1, 1)] if len(self.ladder) > 1 else 0
        else:
            st.misses = 0
            if accepted == drafted and not self.whole_blocks:
                st.gamma = self.ladder[min(i + 1, len(self.ladder) - 1)]

    def rest(self, st: SpecControl, num_output: int) -> None:
        """No drafts for this sequence until it has emitted one more token."""
        st.off_until = max(st.off_until, num_output + 1)

    def record_plain(self, st: SpecControl, tokens: int) -> None:
        """A round without drafts: alpha drifts back toward the prior (most of the way,
        ~63%, after `retry_after` plain tokens). Without this, a sequence whose low alpha
        made the batch cap 0 would never draft again: its alpha changes only when it drafts."""
        if self.adaptive and tokens > 0:
            st.passed += (ALPHA_PRIOR * st.judged - st.passed) * min(1.0, tokens / self.retry_after)


PREFILL_ROW_SHARE = 0.8  # a large verify's cost per row as a share of a prefill's, at least
EXTRAPOLATED_ROW_SHARE = 0.5  # a row past the measured forwards, as a share of the last measured step's (see estimate)
TURN_ON_MARGIN = 1.10  # how much faster than plain decoding a draft cap must look to be chosen
PROPOSE_WINDOW = 5  # recent proposes whose cheapest prices the next
PROPOSE_SAMPLES_TO_PRICE = 3  # proposes timed before their cost counts (see _propose_price)


def expected_tokens(alpha: float, g: int) -> float:
    """Tokens a round of g drafts yields when each draft passes with chance alpha."""
    if g == 0:
        return 1.0
    if alpha >= 1.0:
        return g + 1.0
    return (1.0 - alpha ** (g + 1)) / (1.0 - alpha)


class BatchCostModel:
    """Measured forward milliseconds by row count (power-of-two buckets, EMA)."""

    def __init__(self, ema: float = 0.3, warmup_samples: int = 0, whole_blocks: bool = False):
        self.ema = ema
        self.whole_blocks = whole_blocks  # a propose costs one step whatever its draft count (DFlash)
        # The first samples of each bucket (and of propose) are dropped: they pay one-off
        # costs (allocations, kernel choice, a CUDA-graph capture: 10-30x a replay) that
        # would otherwise price a cap out for good, as an unused cap is never re-measured.
        # The unmeasured bucket is priced optimistically meanwhile, so it gets tried again.
        self.warmup_samples = warmup_samples
        self._seen: dict[object, int] = {}
        self.forward_ms: dict[int, float] = {}
        # ms per draft step of the recent proposes, by bucket of the sequences the drafter's
        # own path drafted for (see record_propose)
        self._propose_samples: dict[int, deque[float]] = {}
        self.modelled_share = 1.0  # EMA: the share of proposing sequences that path took
        self.prefill_ms_per_row: float | None = None  # see record_prefill

    @staticmethod
    def _bucket(rows: int) -> int:
        return 1 << max(0, math.ceil(math.log2(max(rows, 1))))

    def _warming_up(self, key: object) -> bool:
        seen = self._seen.get(key, 0)
        self._seen[key] = seen + 1
        return seen < self.warmup_samples

    def record_forward(self, rows: int, ms: float) -> None:
        b = self._bucket(rows)
        if self._warming_up(b):
            return
        old = self.forward_ms.get(b)
        if old is not None:
            ms = min(ms, 2.0 * old)  # one stall (a busy machine, a GC pause) moves the estimate by ema * old at most
        self.forward_ms[b] = ms if old is None else (1 - self.ema) * old + self.ema * ms

    def record_prefill(self, rows: int, ms: float) -> None:
        """A prefill of `rows` prompt rows took `ms`: what a row costs where the forward is
        compute-bound, known before any large verify has run. It floors the price of row
        counts above every measured bucket (see estimate), so that a large batch is priced
        before it first speculates: there the optimistic guess (the largest bucket's cost)
        would try drafts, and a draft model's catch-up, that a compute-bound target cannot use.
        The cheapest row seen counts: a floor must not rise with a slow (cold) prefill."""
        if rows > 0 and ms > 0:
            per, old = ms / rows, self.prefill_ms_per_row
            self.prefill_ms_per_row = per if old is None else min(old, per)

    def record_propose(self, steps: int, ms: float, proposing: int = 1, copied: int = 0) -> None:
        """A propose of `steps` draft steps for `proposing` sequences took ms; `copied` of them
        drafted by lookup (copy first: tandem.drafters.copy_first), for next to nothing. Timed
        by how many the drafter's own path took: a CPU's DFlash propose for 8 costs 4x that
        for 1, and one priced by the cheapest propose seen, a single sequence's or one that
        copied all, made drafting look free at batch 8."""
        modelled = proposing - copied
        if steps <= 0 or proposing <= 0:
            return
        self.modelled_share = (1 - self.ema) * self.modelled_share + self.ema * modelled / proposing
        b = self._bucket(modelled)
        if modelled <= 0 or self._warming_up(("propose", b)):
            return
        self._propose_samples.setdefault(b, deque(maxlen=PROPOSE_WINDOW)).append(ms / (1 if self.whole_blocks else steps))

    def propose_ms_per_step(self, sequences: int = 1) -> float | None:
        """What a propose for `sequences` sequences costs a draft step: the cheapest of the
        recent proposes of their bucket (None before any is timed). One-off costs only ever
        add time (a drafter's CUDA graph capture for a new shape: 12.6 ms against 0.8 on an
        H200), and a drafter priced out by them would never be timed again; a propose that
        really got dearer shows once the window has moved on. A bucket with too few proposes
        timed is priced optimistically, like an unmeasured forward (see estimate)."""
        timed = {b: min(w) for b, w in self._propose_samples.items() if len(w) >= PROPOSE_SAMPLES_TO_PRICE}
        if not timed:
            return None
        b = self._bucket(sequences)
        if b in timed:
            return timed[b]
        below = [k for k in timed if k < b]
        if below:
            return timed[max(below)]
        nearest = min(timed)
        return timed[nearest] * b / nearest

    def _propose_price(self, drafting: int) -> float:
        """Expected ms a draft step of this tick's propose costs, `drafting` sequences drafting:
        priced for the share of them the drafter's own path has lately taken (the rest copy).
        Until a few proposes are timed, proposing counts as free, so that a first slow sample
        cannot stop drafting before a fair one comes."""
        k = drafting * self.modelled_share
        if k <= 0:
            return 0.0
        whole = math.ceil(k)
        per = self.propose_ms_per_step(whole)
        return 0.0 if per is None else per * k / whole

    def estimate(self, rows: int) -> float | None:
        if not self.forward_ms:
            return None
        b = self._bucket(rows)
        below = [k for k in self.forward_ms if k < b]
        at_or_above = [v for k, v in self.forward_ms.items() if k >= b]
        # Unmeasured buckets are priced optimistically, so that they get tried (and
        # measured) rather than never chosen: above the measured ones, the largest smaller
        # bucket's cost; below them, the smallest larger one's scaled down by rows (no
        # forward gets cheaper faster than that).
        if b in self.forward_ms:
            t = self.forward_ms[b]
        elif below:
            t = self.forward_ms[max(below)]
        else:
            nearest = min(k for k in self.forward_ms if k > b)
            t = self.forward_ms[nearest] * b / nearest
        if not at_or_above and len(below) >= 2:
            # past the measured forwards, rows cost at least half what each row of the last
            # measured step did (a GEMM's rows get cheaper as they grow, not free): a CPU's
            # 8-row verify of SmolLM2 (29 ms against 17 for 4 rows) priced 16 rows at 29,
            # and batch 8 then tried drafts at 43 ms a tick that plain decoding did in 27
            top, prev = sorted(below)[-2:][::-1]
            step = max(0.0, (self.forward_ms[top] - self.forward_ms[prev]) / (top - prev))
            t = max(t, self.forward_ms[top] + EXTRAPOLATED_ROW_SHARE * step * (rows - top))
        if not at_or_above and self._prefill_is_compute():
            # each row past the largest measured forward adds at least a compute row (what a
            # prefill's cost, a little less: a batch's wider GEMMs run faster per row than one
            # prompt's). Priced by the measured cost alone, a CPU's 32-row decode of Qwen2.5
            # 1.5B (304 ms) put 64 rows at 304 ms, drafted, and paid 600 a tick.
            top = max(below)
            t = max(t, self.forward_ms[top] + PREFILL_ROW_SHARE * self.prefill_ms_per_row * (rows - top))
        # more rows never cost less: a bucket priced above a larger one (a first forward
        # that paid for allocations, a stall) is held to it, or it would never be tried again
        return min([t, *at_or_above])

    def block_break_even(self, g: int, n: int) -> float:
        """The fewest extra tokens a block of g drafts must be expected to add for one of n
        running sequences to pay for it: its g rows at the mean price of a draft row,
        (T(n (g + 1)) - T(n)) / (n g), counted in plain tokens (T(n) / n each). On a GPU's
        small batches rows are nearly free and almost any alpha pays; on a CPU a hopeless
        sequence's rows do not. 0 while the forwards are not yet measured. The batch rule
        (best_cap) still decides whether drafting pays at all, propose included."""
        plain, full = self.estimate(n), self.estimate(n * (g + 1))
        if plain is None or full is None or g <= 0 or plain <= 0:
            return 0.0
        return max(0.0, full - plain) / plain  # g * (full - plain) / (n g), over plain / n

    def _prefill_is_compute(self) -> bool:
        """Whether the prefill's cost per row can be a compute rate: only if no measured
        forward ran cheaper per row. On a GPU a short prompt's eager prefill is launch-bound
        (an H200 measured 7-50 ms a row, against 3.5 ms for a whole 1-row verify), and as a
        floor it priced every draft out, for good: an unused bucket is never measured."""
        per = self.prefill_ms_per_row
        return per is not None and all(per <= ms / b for b, ms in self.forward_ms.items())

    def best_cap(self, gammas: list[int], alphas: list[float], ladder: tuple[int, ...],
                 plan: Callable[[list[int]], float | None] | None = None) -> int:
        """The draft cap for this tick; 0 while no forward has been measured.

        gammas/alphas: every running sequence's (gamma 0 for one whose speculation is off:
        it still takes a row and yields a token). plan(draft counts) prices the tick's
        forwards as the scheduler will batch them (tandem.batching.plan_cost: padded
        merges or one forward per count); without it, one forward of sum(g + 1) rows."""
        n = len(gammas)
        if n == 0:
            return max(ladder)
        if not self.forward_ms:
            # plain decoding until a forward has been measured: a first wave of many
            # sequences would otherwise draft (and a draft model catch up its prompts) blind
            return 0
        price = plan or (lambda gs: self.estimate(sum(g + 1 for g in gs)))
        best_cap, best_rate = 0, None
        for cap in ladder:
            gs = [min(g, cap) for g in gammas]
            t = price(gs)
            if t is None:
                return max(ladder)
            drafting = sum(1 for g in gs if g > 0)
            t += self._propose_price(drafting) * (min(1, max(gs)) if self.whole_blocks else max(gs))
            tokens = sum(expected_tokens(a, g) for a, g in zip(alphas, gs))
            rate = tokens / max(t, 1e-6)
            # Speculating at all must pay clearly (the estimates are noisy and a wrong "on"
            # costs a whole batch of rows); among caps that speculate, a small edge will do.
            margin = TURN_ON_MARGIN if best_cap == 0 else 1.02
            if best_rate is None or rate > best_rate * margin:
                best_cap, best_rate = cap, rate
        return best_cap
