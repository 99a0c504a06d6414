"""A smaller model of the same tokenizer drafting for the whole batch at once.

It lives on rank 0 beside the target with a KV pool of its own (tandem.drafters.draft_blocks),
mirroring the target's positions. Its KV holds the sequence's tokens up to `lengths[slot]`.

The KV is filled lazily: prefill feeds nothing (unless the sequence runs alone, see
prefill), and a propose first feeds what the drafter has not seen (the catch-up: a
whole prompt the first time, or the tokens a sequence emitted while it did not
speculate). At large batches on a compute-bound target the batch cost rule may never
draft for a sequence, and a prefill at admission (a third of the target's own) would
then be pure waste. A propose catches up at most `catch_up_budget` rows (see propose).
A catch-up's bulk goes in KV-only forwards of at most `chunk` rows (no LM head: a
prompt's rows times a 151k vocabulary would be gigabytes); its last `tail` rows go with
the drafting forward, whose head runs on each sequence's last real row only. Then g-1
single-row steps.
Pad rows (a shorter sequence in a wider forward) sit past the slot's length and are
never attended. After a verdict that kept `rows` rows from P, the drafter stays
valid up to min(its length, P + rows) (it never fed its last draft).
A constrained sequence drafts under its grammar: each step's logits are masked with the
state its drafts so far reached (tandem.grammar.draft_matchers), in the same forward as
every other sequence, so the verify's grammar walk has nothing to cut, and a sampled
sequence's q is the masked distribution its drafts were drawn from.
"""
from __future__ import annotations

import torch

from tandem.drafters.draft_blocks import SlotBlocks
from tandem.grammar.draft_matchers import DraftMatchers, mask_draft_logits
from tandem.model.kv_cache import PagedKVCache
from tandem.sampling.filters import filtered_probs
from tandem.sampling.logit_processors import apply_to_last
from tandem.sampling.noise import STREAM_DRAFT, row_key, sample_rows
from tandem.shard.commands import DraftGrammar, SamplingSpec


class DraftModelDrafter:
    name = "draft-model"
    capture_layers: tuple[int, ...] = ()

    def __init__(self, model: torch.nn.Module, cache: PagedKVCache, target_vocab: int, max_model_len: int,
                 propose_batch_max: int = 64, matchers: DraftMatchers | None = None):
        self.model = model
        self.cache = cache
        self.blocks = SlotBlocks(cache.num_blocks, cache.block_size)
        self.max_model_len = max_model_len
        self.lengths: dict[int, int] = {}  # slot -> positions of its draft KV written
        self.target_vocab = target_vocab
        self.propose_batch_max = propose_batch_max
        self.device = next(model.parameters()).device
        self.chunk = 256  # most rows of one catch-up forward
        self.catch_up_budget = 256  # most bulk catch-up rows of one propose (see propose)
        self.tail = 2  # catch-up rows fed with the drafting forward: a steady round needs <= 2
        self.live: set[int] = set()  # slots prefilled and not released
        self.matchers = matchers  # None: constrained sequences draft unmasked (the verify cuts them)
        self._warm_up()

    @torch.inference_mode()
    def _warm_up(self) -> None:
        # One row through the model now, so that one-off costs of a first forward (the CPU
        # weight packs, page faults) do not land in the first propose: the batch cost rule
        # prices drafting from measured propose times. Slot 0's length stays 0.
        self._forward([[0]], [0], [0])
        self.blocks.shrink(0, 0)

    def set_table(self, slot: int, table: list[int]) -> None:
        pass  # its KV lies in a pool of its own (SlotBlocks)

    @torch.inference_mode()
    def prefill(self, slot: int, tokens: list[int], feats=None, cached_len: int = 0) -> None:
        """Lazy (the first propose catches up), except for a sequence that runs alone: it
        will draft, and its one-off catch-up inside a propose would be read by the batch
        rule as the cost of every draft step (it prices drafting per step), turning a
        paying batch-1 speculation off. Here it is KV only, as a propose would feed it."""
        others = self.live - {slot}
        # the next chunk of a prefill split over ticks (tandem.scheduler) keeps what it has
        have = self.lengths.get(slot, 0) if slot in self.live and 0 < cached_len == self.lengths.get(slot, 0) else 0
        self.live.add(slot)
        self._set_length(slot, have)
        if not others:
            self._feed([list(tokens[have:])], [slot], [have])
            self._set_length(slot, len(tokens))

    @torch.inference_mode()
    def propose(
        self,
        slots: list[int],
        histories: list[list[int]],
        last_tokens: list[int],
        num_drafts: list[int],
        sampling: list[SamplingSpec],
        grammars: list[DraftGrammar | None] | None = None,
    ) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        """Drafts for every sequence when all their catch-ups fit `catch_up_budget` rows
        (beyond each tail), or when there is one sequence. Otherwise no drafts this round:
        a wave of new or long idle sequences is caught up a budget a propose (smallest
        first, KV only; the last may get a part), so a propose stays bounded, and at large
        batches the batch rule usually turns drafting off before the rest of the wave has
        cost anything. (Drafting for the in-step few would not pay there either: the verify
        pads every sequence to their width, or runs a second forward.)"""
        want = [i for i, g in enumerate(num_drafts) if g > 0]
        bulk = {i: max(0, len(histories[i]) + 1 - self.lengths.get(slots[i], 0) - self.tail) for i in want}
        # at least 2 rows a sequence: while none drafts, each grows a row a tick, and the
        # catch-up must outpace that
        budget = max(self.catch_up_budget, 2 * len(want))
        if len(want) > 1 and sum(bulk.values()) > budget:
            rows, early = [], []
            for i in sorted((i for i in want if bulk[i] > 0), key=bulk.get):
                start = self.lengths.get(slots[i], 0)
                rows.append(histories[i][start : start + budget])  # the last one may be a part
                early.append(i)
                budget -= len(rows[-1])
                if budget <= 0:
                    break
            starts = [self.lengths.get(slots[i], 0) for i in early]
            self._feed(rows, [slots[i] for i in early], starts)
            for i, r, st in zip(early, rows, starts):
                self._set_length(slots[i], st + len(r))
            want = []
        drafts: list[list[int]] = [[] for _ in slots]
        q: list[torch.Tensor | None] = [None] * len(slots)
        if want:
            pick = lambda xs: [xs[i] for i in want]  # noqa: E731
            walks = (self.matchers.walks(pick(slots), pick(histories), pick(last_tokens), pick(grammars))
                     if self.matchers is not None and grammars else [None] * len(want))
            try:
                d, qd = self._draft(pick(slots), pick(histories), pick(last_tokens), pick(num_drafts), pick(sampling), walks)
            finally:
                for w in walks:
                    if w is not None:
                        w.finish()
            for i, di, qi in zip(want, d, qd):
                drafts[i], q[i] = di, qi
        return drafts, q

    def _draft(self, slots, histories, last_tokens, num_drafts, sampling, walks):
        """Catch every sequence up, then g_max draft steps for all of them (a walking
        sequence's under its grammar's mask)."""
        g_max = max(num_drafts)
        starts = [self.lengths.get(s, 0) for s in slots]
        catch_up = [h[st:] + [last] for h, st, last in zip(histories, starts, last_tokens)]
        positions = [len(h) for h in histories]  # where each last token sits
        tails = [min(len(c), self.tail) for c in catch_up]
        self._feed([c[: len(c) - t] for c, t in zip(catch_up, tails)], slots, starts)
        tail_rows = [c[len(c) - t :] for c, t in zip(catch_up, tails)]
        logits = self._forward(tail_rows, slots, [p + 1 - t for p, t in zip(positions, tails)])  # [n, V]
        drafts: list[list[int]] = [[] for _ in slots]
        qs: list[list[torch.Tensor]] = [[] for _ in slots]
        for step in range(g_max):
            # the rules see what the target's row will: the history, the last token, the drafts so far
            contexts = [h + [last] + d if spec.rules is not None else []
                        for h, last, d, spec in zip(histories, last_tokens, drafts, sampling)]
            # the rules first, the grammar last (as the target's picks have them)
            logits = mask_draft_logits(apply_to_last(logits, contexts, sampling), walks)
            tok = self._pick(logits, [p + step + 1 for p in positions], sampling, qs)
            for i, t in enumerate(tok):
                drafts[i].append(t)
                if walks[i] is not None:
                    walks[i].take(t)
            if step + 1 < g_max:
                logits = self._forward([[t] for t in tok], slots, [p + step + 1 for p in positions])
        for slot, p in zip(slots, positions):
            self._set_length(slot, p + g_max)
        # nothing past a complete grammar is emitted: no rows for it
        num_drafts = [g if w is None or w.limit is None else min(g, w.limit) for g, w in zip(num_drafts, walks)]
        q_out = [torch.stack(q)[:g] if q and g else None for q, g in zip(qs, num_drafts)]
        return [d[:g] for d, g in zip(drafts, num_drafts)], q_out

    def commit(self, slot: int, start_pos: int, rows: int, feats=None) -> None:
        self._set_length(slot, min(self.lengths.get(slot, 0), start_pos + rows))

    def committed(self, slots: list[int], last_tokens: list[int]) -> None:
        pass  # the draft model catches up at its next propose

    def release(self, slots: list[int]) -> None:
        for slot in slots:
            self.live.discard(slot)
            self._set_length(slot, 0)
            if self.matchers is not None:
                self.matchers.release(slot)

    def _set_length(self, slot: int, length: int) -> None:
        """The slot's draft KV holds `length` positions; blocks past them go back."""
        self.lengths[slot] = length
        self.blocks.shrink(slot, length)

    # ---- helpers ----------------------------------------------------------------------

    def _pick(self, logits: torch.Tensor, positions: list[int], sampling: list[SamplingSpec], qs) -> list[int]:
        out = logits.argmax(dim=-1).tolist()
        for i, spec in enumerate(sampling):
            if spec.greedy:
                continue
            q = filtered_probs(logits[i : i + 1], spec.temperature, spec.top_p, spec.top_k, spec.min_p)  # [1, V]
            out[i] = int(sample_rows(q, [row_key(spec.seed, positions[i], STREAM_DRAFT)])[0])
            qs[i].append(self._to_target_vocab(q[0]))
        return out

    def _to_target_vocab(self, q: torch.Tensor) -> torch.Tensor:
        if q.shape[-1] == self.target_vocab:
            return q
        padded = torch.zeros(self.target_vocab, dtype=q.dtype, device=q.device)
        m = min(self.target_vocab, q.shape[-1])
        padded[:m] = q[:m]
        return padded

    def _feed(self, rows: list[list[int]], slots: list[int], starts: list[int]) -> None:
        """Write ragged rows into the KV, no logits, in forwards of at most `chunk` rows.
        Each forward takes the longest remaining pieces at one width; a piece under half
        that width waits for a narrower forward (padding at most doubles the rows), and so
        does one whose padding would run past the context."""
        done = [0] * len(rows)
        todo = [i for i, r in enumerate(rows) if r]
        while todo:
            todo.sort(key=lambda i: done[i] - len(rows[i]))  # longest remaining first
            width = min(self.chunk, len(rows[todo[0]]) - done[todo[0]])
            group = []
            for i in todo:
                if len(group) >= max(1, self.chunk // width) or 2 * (len(rows[i]) - done[i]) < width:
                    break
                if starts[i] + done[i] + width <= self.max_model_len:
                    group.append(i)
            self._forward([rows[i][done[i] : done[i] + width] for i in group], [slots[i] for i in group],
                          [starts[i] + done[i] for i in group], logits=False)
            for i in group:
                done[i] += min(width, len(rows[i]) - done[i])
            todo = [i for i in todo if done[i] < len(rows[i])]

    def _forward(self, rows: list[list[int]], slots: list[int], starts: list[int],
                 logits: bool = True) -> torch.Tensor | None:
        """Ragged rows padded at their end; each sequence's last real row's logits [n, V]
        (the LM head runs on those rows only), or None with logits=False (KV only)."""
        width = max(len(r) for r in rows)
        padded = torch.zeros(len(rows), width, dtype=torch.long, device=self.device)
        for i, r in enumerate(rows):
            padded[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        last = [[len(r) - 1] for r in rows] if logits else [[] for _ in rows]
        # rows written go to the slot's own blocks (pad rows past them to the scratch block)
        tables = [self.blocks.cover(slot, st + len(r)) for slot, st, r in zip(slots, starts, rows)]
        out = self.model(
            padded,
            torch.tensor(starts, dtype=torch.int32, device=self.device),
            self.cache,
            self.cache.table_tensor(tables, max(st + width for st in starts)),
            logit_rows=torch.tensor(last, dtype=torch.long, device=self.device).view(len(rows), -1),
        )
        return out.logits[:, 0] if logits else None  # [n, V]
