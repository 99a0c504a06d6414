"""ModelShard: one rank of the target model, its paged KV, and (on rank 0) a rank-side drafter.

It executes the shard control commands. It trusts nothing: a malformed command (a block
table too short, a block id outside the pool, rows written into a block another sequence
reads) is refused with ShapeError before any state changes, so the rank keeps serving.
The scheduler owns the block tables; a rank keeps only each slot's committed length.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tandem.drafters.rank_drafter import RankDrafter
from tandem.errors import ShapeError
from tandem.model.cuda_graph import next_pow2
from tandem.model.kv_cache import PagedKVCache
from tandem.model.verify_graphs import VerifyGraphs
from tandem.sampling.logprobs import last_logprobs, verify_logprobs
from tandem.sampling.rank_rule import pick_last, pick_rows
from tandem.shard.commands import (
    NO_LOGPROBS,
    PrefillItem,
    PrefillResult,
    ProposeBatch,
    ProposeResult,
    ShapeRules,
    ShardLimits,
    Verdict,
    VerifyBatch,
    VerifyResult,
)
from tandem.shard.prefill_groups import prefill_groups
from tandem.shard.prompt_scoring import score_prompt
from tandem.shard.riders import forward_with_riders


@dataclass
class _Pending:
    """A verify forward whose verdict has not arrived yet."""

    cmd: VerifyBatch
    feats: torch.Tensor | None  # the captured layers side by side, [n, k, len(capture) * H]
    picks: list[int] | None = None  # rank 0's pick for every row


class ModelShard:
    def __init__(
        self,
        model: torch.nn.Module,
        cache: PagedKVCache,
        *,
        num_slots: int,
        max_model_len: int,
        row_budget: int,
        vocab_size: int,
        rank: int = 0,
        world_size: int = 1,
        drafter: RankDrafter | None = None,
        graphs: VerifyGraphs | None = None,
    ):
        self.model = model
        self.cache = cache
        self.rank = rank
        self.world_size = world_size
        self.drafter = drafter if rank == 0 else None
        self.graphs = graphs  # CUDA graphs of the verify forward (one GPU rank), or None: eager
        self.vocab_size = vocab_size
        self.limits = ShardLimits(
            num_slots=num_slots,
            max_model_len=max_model_len,
            row_budget=row_budget,
            vocab_size=vocab_size,
            world_size=world_size,
            drafter=drafter.name if drafter else "none",
            propose_batch_max=drafter.propose_batch_max if drafter else 64,
            num_blocks=cache.num_blocks,
            block_size=cache.block_size,
            graphed=graphs is not None,
        )
        self.rules = ShapeRules.of(self.limits)
        self.lengths = [0] * num_slots  # slot -> positions of its KV committed
        self.capture = tuple(drafter.capture_layers) if drafter else ()
        self.history: dict[int, list[int]] = {}  # slot -> committed tokens (rank-side drafter input)
        self.pending: _Pending | None = None
        # slot -> the drafts the rank-side drafter last proposed, with their q (for sampling)
        self._drafts: dict[int, tuple[list[int], torch.Tensor | None]] = {}
        self.device = next(model.parameters()).device

    @torch.inference_mode()
    def capture_graphs_ahead(self, max_k: int) -> int:
        """The CUDA graphs of verifies of up to max_k rows a sequence and of prefills,
        captured now rather than on live traffic (see VerifyGraphs.capture_ahead); how many."""
        if self.graphs is None:
            return 0
        return self.graphs.capture_ahead(self.limits.num_slots, max_k, self.limits.row_budget, self.capture)

    # ---- commands ---------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, items: list[PrefillItem]) -> PrefillResult:
        self._check_prefill(items)
        self.pending = None  # a prefill after a failed verify supersedes it
        # The given tokens past cached_len go into the KV; the pick after them is the
        # sequence's next token, whose KV waits for row 0 of its next verify.
        forwarded: dict[int, tuple[torch.Tensor, dict[int, torch.Tensor] | None]] = {}
        scored = {}  # item -> its prompt's logprobs (those that ask: every row's logits)
        for i, it in enumerate(items):
            if it.prompt_logprobs is not None:
                last, hidden, scored[i] = score_prompt(self._forward, it, self.rules.row_budget, self.capture, self.device)
                forwarded[i] = (last, hidden)
        rest = [i for i in range(len(items)) if i not in scored]
        fresh = [len(items[i].tokens) - items[i].cached_len for i in rest]
        for group in prefill_groups(fresh, self.rules.row_budget):
            group = [rest[j] for j in group]
            if len(items[group[0]].tokens) - items[group[0]].cached_len > self.rules.row_budget:  # alone, in chunks
                forwarded[group[0]] = self._forward_prompt(items[group[0]])
            else:
                forwarded.update(zip(group, self._forward_prompts([items[i] for i in group])))
        logits = self._prefilled(items, [forwarded[i] for i in range(len(items))])
        return self._prefill_result(items, logits, scored)

    def _prefilled(self, items: list[PrefillItem], forwarded) -> list[torch.Tensor]:
        """The items' tokens are in the KV now (forwarded: each one's last-row logits and
        captured rows): their slots' lengths and histories, and the rank-side drafter's
        prefill. Returns the last rows' logits."""
        for it, (_, hidden) in zip(items, forwarded):
            self.lengths[it.slot] = len(it.tokens)
            self.history[it.slot] = list(it.tokens)
            self._drafts.pop(it.slot, None)
            if self.drafter is not None:
                self.drafter.set_table(it.slot, list(it.blocks))
                self.drafter.prefill(it.slot, list(it.tokens), self._joined(hidden), it.cached_len)
        return [last for last, _ in forwarded]

    def _prefill_result(self, items: list[PrefillItem], logits: list[torch.Tensor], scored=None) -> PrefillResult:
        if self.rank != 0:
            return PrefillResult(next_tokens=[])
        stacked = torch.stack(logits)  # [n, V]
        sampling = [it.sampling for it in items]
        picks = pick_last(stacked, [len(it.tokens) for it in items], sampling, [it.tokens for it in items],
                          grammar_masks=[it.grammar_mask for it in items])
        return PrefillResult(next_tokens=picks, logprobs=last_logprobs(stacked, picks, sampling),
                             prompt_logprobs=[scored.get(i, NO_LOGPROBS) for i in range(len(items))] if scored else [])

    def _check_prefill(self, items: list[PrefillItem]) -> None:
        for it in items:
            self._check_slot(it.slot)
            if not it.tokens:
                raise ShapeError("tokens non-empty", f"prefill of slot {it.slot} has no tokens")
            if len(it.tokens) >= self.limits.max_model_len:
                raise ShapeError("tokens < max_model_len", f"{len(it.tokens)} tokens for a context of {self.limits.max_model_len}")
            if not 0 <= it.cached_len < len(it.tokens):
                raise ShapeError("cached_len", f"slot {it.slot}: cached_len {it.cached_len} for {len(it.tokens)} tokens")
            self._check_tokens(it.tokens)
            self.rules.check_table(it.slot, list(it.blocks), len(it.tokens))
        if len({it.slot for it in items}) != len(items):
            raise ShapeError("slots distinct", "a prefill names a slot twice")
        written = [list(it.blocks[it.cached_len // self.cache.block_size :]) for it in items]
        self.rules.check_writes([it.slot for it in items], [list(it.blocks) for it in items], written, "prefill")

    def verify(self, cmd: VerifyBatch) -> VerifyResult:
        return self.verify_begin(cmd)()

    @property
    def forward_is_async(self) -> bool:
        """Whether verify_begin returns before the forward is done (a GPU queues it)."""
        return self.device.type == "cuda"

    @torch.inference_mode()
    def verify_begin(self, cmd: VerifyBatch, checked: bool = False) -> Callable[[], VerifyResult]:
        """Check the batch (its shape rules, unless the caller did: checked) and queue its
        forward; the call returned reads the picks back. On a GPU the forward runs in
        between: the shard server answers the commands that rode on this one meanwhile."""
        if not checked:
            self.rules.check(cmd)
        for slot, pos in zip(cmd.slots, cmd.start_pos):
            self._check_slot(slot)
            if pos != self.lengths[slot]:
                raise ShapeError("start_pos", f"slot {slot}: start_pos {pos} but the shard holds {self.lengths[slot]}")
            if pos + cmd.k > self.limits.max_model_len:
                raise ShapeError("context", f"slot {slot}: {pos}+{cmd.k} rows exceed the context {self.limits.max_model_len}")
        self._check_tokens(cmd.tokens)
        riders, rider_logits = list(cmd.prefill), []
        if riders:
            self._check_prefill(riders)  # each as a prefill item (the group checked them beside the batch)
        rows = torch.tensor(cmd.tokens, dtype=torch.long).view(cmd.n, cmd.k)  # on the host
        out = None
        if self.graphs is not None and not riders:  # a forward with chunks runs eagerly
            out = self.graphs.forward(list(cmd.tokens), cmd.n, cmd.k, list(cmd.block_tables), list(cmd.start_pos), self.capture)
        if riders:
            out, forwarded = forward_with_riders(self.model, self.cache, cmd, _to_device(rows, self.device),
                                                 self.capture, self.rules.row_budget)
            rider_logits = self._prefilled(riders, forwarded)
        elif out is None:
            out = self._forward(_to_device(rows, self.device), list(cmd.block_tables), cmd.start_pos)
        # one concatenation for the batch, not one a sequence at commit (queued, no sync)
        pending = self.pending = _Pending(cmd=cmd, feats=self._joined(out.hidden))

        @torch.inference_mode()
        def result() -> VerifyResult:
            prefilled = self._prefill_result(riders, rider_logits) if riders else None
            if self.rank != 0:
                return VerifyResult(batch_id=cmd.batch_id, picks=[], accept_probs=[], prefill=prefilled)
            q = [self._draft_probs(slot, cmd.tokens[i * cmd.k + 1 : (i + 1) * cmd.k]) for i, slot in enumerate(cmd.slots)]
            picks, accept = pick_rows(out.logits, rows, cmd.start_pos, cmd.sampling, q, [self.history[s] for s in cmd.slots],
                                   cmd.grammar_masks)
            pending.picks = picks
            return VerifyResult(batch_id=cmd.batch_id, picks=picks, accept_probs=accept,
                                logprobs=verify_logprobs(out.logits, rows, picks, cmd.sampling), prefill=prefilled)

        return result

    def commit(self, verdict: Verdict) -> None:
        p = self.pending
        if p is None or p.cmd.batch_id != verdict.batch_id:
            raise ShapeError("batch_id", f"verdict for batch {verdict.batch_id}, pending {p.cmd.batch_id if p else None}")
        if len(verdict.words) != p.cmd.n:
            raise ShapeError("len(words)==n", f"{len(verdict.words)} words for n={p.cmd.n}")
        if not verdict.failed and not all(1 <= w <= p.cmd.k for w in verdict.words):
            raise ShapeError("1<=word<=k", f"words {verdict.words} for k={p.cmd.k}")
        self.pending = None
        if verdict.failed:
            for slot in p.cmd.slots:  # the next round's drafts, whoever makes them, are not these
                self._drafts.pop(slot, None)
            return  # no rank advances: the rows stay past each slot's length, unused
        k = p.cmd.k
        for i, (slot, start, w) in enumerate(zip(p.cmd.slots, p.cmd.start_pos, verdict.words)):
            self.lengths[slot] = start + w
            if self.drafter is not None:
                self.drafter.set_table(slot, p.cmd.block_tables[i])
            self.history[slot].extend(p.cmd.tokens[i * k : i * k + w])  # host ids: no device read a sequence
            if self.drafter is not None:
                self.drafter.commit(slot, start, w, None if p.feats is None else p.feats[i, :w])
            self._drafts.pop(slot, None)
        if self.drafter is not None and k > 1 and p.picks is not None:  # a batch that drafted will likely again
            # each sequence's last emitted token: its pick after the kept drafts (the bonus)
            bonus = [p.picks[i * k + w - 1] for i, w in enumerate(verdict.words)]
            self.drafter.committed(list(p.cmd.slots), bonus)

    @torch.inference_mode()
    def propose(self, cmd: ProposeBatch) -> ProposeResult:
        if self.drafter is None:
            raise ShapeError("drafter", "this shard has no rank-side drafter")
        n = len(cmd.slots)
        if not (len(cmd.last_tokens) == len(cmd.positions) == len(cmd.num_drafts) == len(cmd.sampling) == n):
            raise ShapeError("propose lengths", "slots, last_tokens, positions, num_drafts, sampling differ in length")
        if cmd.grammars and len(cmd.grammars) != n:
            raise ShapeError("len(grammars) in (0, n)", f"{len(cmd.grammars)} grammars for n={n}")
        for slot, pos in zip(cmd.slots, cmd.positions):
            self._check_slot(slot)
            if pos != self.lengths[slot]:
                raise ShapeError("positions", f"slot {slot}: position {pos} but the shard holds {self.lengths[slot]}")
        self._check_tokens(cmd.last_tokens)
        drafts, q = self.drafter.propose(
            list(cmd.slots), [self.history[s] for s in cmd.slots], list(cmd.last_tokens), list(cmd.num_drafts), list(cmd.sampling),
            grammars=list(cmd.grammars) or None,
        )
        for slot, d, qi in zip(cmd.slots, drafts, q):
            self._drafts[slot] = (list(d), qi)
        return ProposeResult(drafts=[list(d) for d in drafts])

    def release(self, slots: list[int]) -> None:
        for slot in slots:
            self._check_slot(slot)
        for slot in slots:
            self.lengths[slot] = 0
            self.history.pop(slot, None)
            self._drafts.pop(slot, None)
        if self.drafter is not None:
            self.drafter.release(list(slots))

    # ---- helpers ----------------------------------------------------------------------

    def _joined(self, hidden: dict[int, torch.Tensor] | None) -> torch.Tensor | None:
        """The captured layers' rows side by side in capture order (what a rank-side drafter takes)."""
        if self.drafter is None or not self.capture or not hidden:
            return None
        return torch.cat([hidden[layer] for layer in self.capture], dim=-1)

    def _draft_probs(self, slot: int, drafts: list[int]) -> torch.Tensor | None:
        stored = self._drafts.get(slot)
        if stored is None or stored[1] is None or stored[0][: len(drafts)] != drafts:
            return None  # not this drafter's drafts: one-hot q
        return stored[1][: len(drafts)]

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.limits.num_slots:
            raise ShapeError("slots in range", f"slot {slot} outside [0, {self.limits.num_slots})")

    def _check_tokens(self, tokens: list[int]) -> None:
        if tokens and (min(tokens) < 0 or max(tokens) >= self.vocab_size):
            raise ShapeError("token ids", f"token ids must lie in [0, {self.vocab_size})")

    def _forward(self, rows: torch.Tensor, tables: list[list[int]], start_pos: list[int],
                 logit_rows: torch.Tensor | None = None):
        return self.model(
            rows,
            torch.tensor(start_pos, dtype=torch.int32, device=self.device),
            self.cache,
            self.cache.table_tensor(tables, max(start_pos) + rows.shape[1]),
            capture_layers=self.capture,
            logit_rows=logit_rows,
        )

    def _forward_prompts(self, items: list[PrefillItem]) -> list[tuple[torch.Tensor, dict[int, torch.Tensor] | None]]:
        """Prompts (each within the row budget past its cached prefix) in ONE forward, padded
        at their end to the longest: what _forward_prompt returns, for each. Pad rows write
        KV past their sequence's length (its own last block, or the scratch block), where the
        next verify writes before it reads (as a verify's do)."""
        fresh = [len(it.tokens) - it.cached_len for it in items]
        width = max(fresh)
        graphed = self._graphed_prompts(items, width) if self.graphs is not None else None
        if graphed is not None:
            return graphed
        rows = torch.zeros(len(items), width, dtype=torch.long)
        for i, it in enumerate(items):
            rows[i, : fresh[i]] = torch.tensor(it.tokens[it.cached_len :], dtype=torch.long)
        last_rows = torch.tensor([[f - 1] for f in fresh], dtype=torch.long, device=self.device)
        out = self._forward(rows.to(self.device), [list(it.blocks) for it in items], [it.cached_len for it in items],
                            logit_rows=last_rows)
        return [
            (out.logits[i, -1], {layer: h[i, : fresh[i]] for layer, h in out.hidden.items()} if self.capture else None)
            for i in range(len(items))
        ]

    def _graphed_prompts(self, items: list[PrefillItem], width: int):
        """The same through the prefill CUDA graphs, the width padded to a power of two and
        the items split into runs of the most one graph takes (an eager prefill of a short
        prompt is launch-bound on a GPU: a one-token request to SmolLM2 on an H200 took
        52.7 ms eager, 4.4 graphed); None where the shape is not graphed. The outputs are
        copied out of the graph's buffers: the next run may replay the same graph."""
        k = next_pow2(width)
        if k > self.limits.max_model_len or k > self.graphs.max_rows:
            return None
        per = 1 << ((self.graphs.max_rows // k).bit_length() - 1)  # the most one graph takes
        results = []
        for at in range(0, len(items), per):
            run = items[at : at + per]
            fresh = [len(it.tokens) - it.cached_len for it in run]
            tokens = [t for it, f in zip(run, fresh) for t in list(it.tokens[it.cached_len :]) + [0] * (k - f)]
            out = self.graphs.forward(tokens, len(run), k, [list(it.blocks) for it in run], [it.cached_len for it in run],
                                      self.capture, last_rows=[f - 1 for f in fresh])
            if out is None:
                return None  # all of them eagerly (rewriting the same KV)
            results += [
                (out.logits[i, 0].clone(),
                 {layer: h[i, :f].clone() for layer, h in out.hidden.items()} if self.capture else None)
                for i, f in enumerate(fresh)
            ]
        return results

    def _forward_prompt(self, it: PrefillItem) -> tuple[torch.Tensor, dict[int, torch.Tensor] | None]:
        """Write the tokens past the cached prefix into the KV in chunks of the row budget;
        return the logits of the last row and the captured layers' rows ([len, H] each)."""
        chunk = self.rules.row_budget
        hidden: dict[int, list[torch.Tensor]] = {layer: [] for layer in self.capture}
        last_logits = None
        for start in range(it.cached_len, len(it.tokens), chunk):
            part = torch.tensor(it.tokens[start : start + chunk], dtype=torch.long, device=self.device)[None]
            # the LM head on the chunk's last row only: a prompt's other rows need no logits
            last_row = torch.full((1, 1), part.shape[1] - 1, dtype=torch.long, device=self.device)
            out = self._forward(part, [list(it.blocks)], [start], logit_rows=last_row)
            last_logits = out.logits[0, -1]
            for layer in self.capture:
                hidden[layer].append(out.hidden[layer][0])
        captured = {layer: torch.cat(h) for layer, h in hidden.items()} if self.capture else None
        return last_logits, captured


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`; to a GPU through pinned memory, queued without waiting for
    the work already queued there."""
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)
