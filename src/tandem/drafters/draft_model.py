"""A smaller model of the same tokenizer drafting for the whole batch at once.

It lives on rank 0 beside the target with KV slots of its own, mirroring the
target's positions. Its KV holds the sequence's tokens up to `length[slot]`; a
propose first feeds what it has not seen (the catch-up, padded to the batch's
longest; pad rows sit past each slot's length and are never attended), then
g-1 single-row steps. After a verdict that kept `rows` rows from P, the drafter
stays valid up to min(its length, P + rows) (it never fed its last draft).
"""
from __future__ import annotations

import torch

from tandem.model.kv_cache import KVCache
from tandem.sampling.filters import filtered_probs
from tandem.sampling.noise import STREAM_DRAFT, row_key, sample_rows
from tandem.shard.commands import SamplingSpec


class DraftModelDrafter:
    name = "draft-model"
    capture_layers: tuple[int, ...] = ()

    def __init__(self, model: torch.nn.Module, cache: KVCache, target_vocab: int, propose_batch_max: int = 64):
        self.model = model
        self.cache = cache
        self.target_vocab = target_vocab
        self.propose_batch_max = propose_batch_max
        self.device = next(model.parameters()).device
        self.chunk = 256  # rows per prefill forward

    @torch.inference_mode()
    def prefill(self, slot: int, tokens: list[int], hidden=None) -> None:
        for start in range(0, len(tokens), self.chunk):
            part = tokens[start : start + self.chunk]
            self._forward([part], [slot], [start])
        self.cache.set_length(slot, len(tokens))

    @torch.inference_mode()
    def propose(
        self,
        slots: list[int],
        histories: list[list[int]],
        last_tokens: list[int],
        num_drafts: list[int],
        sampling: list[SamplingSpec],
    ) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        n = len(slots)
        g_max = max(num_drafts) if num_drafts else 0
        if g_max <= 0:
            return [[] for _ in slots], [None] * n
        starts = [self.cache.lengths[s] for s in slots]
        catch_up = [h[st:] + [last] for h, st, last in zip(histories, starts, last_tokens)]
        positions = [len(h) for h in histories]  # where each last token sits
        logits = self._forward(catch_up, slots, starts)  # [n, V] at each catch-up's last row
        drafts: list[list[int]] = [[] for _ in slots]
        qs: list[list[torch.Tensor]] = [[] for _ in slots]
        for step in range(g_max):
            tok = self._pick(logits, [p + step + 1 for p in positions], sampling, qs)
            for i, t in enumerate(tok):
                drafts[i].append(t)
            if step + 1 < g_max:
                logits = self._forward([[t] for t in tok], slots, [p + step + 1 for p in positions])
        for slot, p in zip(slots, positions):
            self.cache.set_length(slot, p + g_max)
        q_out = [torch.stack(q)[:g] if q else None for q, g in zip(qs, num_drafts)]
        return [d[:g] for d, g in zip(drafts, num_drafts)], q_out

    def commit(self, slot: int, start_pos: int, rows: int, hidden=None) -> None:
        self.cache.set_length(slot, min(self.cache.lengths[slot], start_pos + rows))

    def release(self, slot: int) -> None:
        self.cache.set_length(slot, 0)

    # ---- helpers ----------------------------------------------------------------------

    def _pick(self, logits: torch.Tensor, positions: list[int], sampling: list[SamplingSpec], qs) -> list[int]:
        out = logits.argmax(dim=-1).tolist()
        for i, spec in enumerate(sampling):
            if spec.greedy:
                continue
            q = filtered_probs(logits[i : i + 1], spec.temperature, spec.top_p, spec.top_k)  # [1, V]
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

    def _forward(self, rows: list[list[int]], slots: list[int], starts: list[int]) -> torch.Tensor:
        """Ragged rows padded at their end; returns each sequence's last real row's logits [n, V]."""
        width = max(len(r) for r in rows)
        padded = torch.zeros(len(rows), width, dtype=torch.long, device=self.device)
        for i, r in enumerate(rows):
            padded[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        out = self.model(
            padded,
            torch.tensor(slots, dtype=torch.long, device=self.device),
            torch.tensor(starts, dtype=torch.long, device=self.device),
            self.cache,
            attn_len=max(starts) + width,
        )
        last = torch.tensor([len(r) - 1 for r in rows], device=self.device)
        return out.logits[torch.arange(len(rows), device=self.device), last]  # [n, V]
