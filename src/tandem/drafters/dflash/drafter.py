"""DFlashDrafter: the rank-side drafter that drafts a block per sequence from the target's
hidden states, for a whole batch in one drafter forward.

Per slot it knows the target's captured rows (the `target_layer_ids` layers,
concatenated) for positions 0..P-1, P = the slot's KV length, and turns them into
context keys/values of its own layers, kept in a slotted cache like the target's KV:

  prefill  the prompt's rows            -> pending (features of positions 0..len-1)
  commit   the kept rows of a verify    -> pending (positions start..start+rows-1);
           rows past them (rejected) are dropped first: a commit at `start` trims
           whatever the slot held from `start` on
  propose  every slot of the batch: the pending rows of all of them go through
           fc/norm/k/v in ONE flat pass into the context cache; then ONE block forward
           of [last token, mask x (B-1)] per sequence, context padded to the batch's
           longest P (masked), gives B-1 drafts each

The drafter never writes a draft's row anywhere: only target rows of kept tokens enter
its context, so a rejection needs no rewind beyond the commit's trim.
"""
from __future__ import annotations

import torch

from tandem.drafters.dflash.model import DFlashDraftModel
from tandem.sampling.filters import filtered_probs
from tandem.sampling.noise import STREAM_DRAFT, row_key, sample_rows
from tandem.shard.commands import SamplingSpec


class DFlashDrafter:
    name = "dflash"

    def __init__(self, model: DFlashDraftModel, target: torch.nn.Module, *, num_slots: int, max_seq_len: int,
                 propose_batch_max: int = 64):
        c = model.config
        tc = target.config
        if c.hidden_size != tc.hidden_size:
            raise ValueError(f"DFlash hidden_size {c.hidden_size} != the target's {tc.hidden_size}")
        if c.vocab_size != tc.vocab_size:
            raise ValueError(f"DFlash vocab_size {c.vocab_size} != the target's {tc.vocab_size}")
        bad = [i for i in c.target_layer_ids if not 0 <= i < tc.num_layers]
        if bad:
            raise ValueError(f"DFlash target_layer_ids {bad} outside the target's layers 0..{tc.num_layers - 1}")
        if c.num_target_layers is not None and c.num_target_layers != tc.num_layers:
            raise ValueError(f"this DFlash checkpoint was made for a {c.num_target_layers}-layer target, not {tc.num_layers}")
        self.model = model
        self.target = target
        self.capture_layers = tuple(c.target_layer_ids)
        self.block_size = c.block_size
        self.propose_batch_max = propose_batch_max
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        shape = (num_slots, c.num_kv_heads, max_seq_len, c.head_dim)
        # ctx_k[layer], ctx_v[layer]: [slots, hkv, max_seq_len, d]; valid below written[slot]
        # the LM head rows drafts may come from: all, or the checkpoint's draft vocabulary
        vocab = getattr(model, "draft_vocab", None)
        self.draft_vocab = vocab.to(self.device) if vocab is not None else None
        self.head = target.lm_head if vocab is None else target.lm_head.weight[self.draft_vocab].clone()
        self.ctx_k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(c.num_layers)]
        self.ctx_v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(c.num_layers)]
        self.written = [0] * num_slots  # context positions in the cache
        self.length = [0] * num_slots  # positions whose target rows are known (written + pending)
        self.pending: dict[int, list[tuple[int, torch.Tensor]]] = {}  # slot -> [(start, feats [r, nL*H])]

    # ---- RankDrafter --------------------------------------------------------------------

    def prefill(self, slot: int, tokens: list[int], hidden: dict[int, torch.Tensor] | None) -> None:
        self.release(slot)
        self._append(slot, 0, len(tokens), hidden)

    def commit(self, slot: int, start_pos: int, rows: int, hidden: dict[int, torch.Tensor] | None) -> None:
        self._append(slot, start_pos, rows, hidden)

    def release(self, slot: int) -> None:
        self.written[slot] = 0
        self.length[slot] = 0
        self.pending.pop(slot, None)

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
        if n == 0:
            return [], []
        for slot, h in zip(slots, histories):
            if self.length[slot] != len(h):
                raise RuntimeError(f"dflash: slot {slot} holds target rows for {self.length[slot]} positions, "
                                   f"its sequence has {len(h)} committed tokens")
        self._flush(slots)
        c = self.model.config
        B = self.block_size
        dev = self.device
        # one host->device copy: P (the last token's position), the last token, the slot
        starts, last_t, slot_t = torch.tensor([[len(h) for h in histories], last_tokens, slots], dtype=torch.long, device=dev)
        block = torch.full((n, B), c.mask_token_id, dtype=torch.long, device=dev)
        block[:, 0] = last_t
        positions = starts[:, None] + torch.arange(B, device=dev)  # [n, B]
        ctx_len = max(len(h) for h in histories)
        ctx_k = [k[slot_t, :, :ctx_len] for k in self.ctx_k]  # [n, hkv, C, d]
        ctx_v = [v[slot_t, :, :ctx_len] for v in self.ctx_v]
        ctx_ok = torch.arange(ctx_len, device=dev)[None, :] < starts[:, None]  # [n, C]
        mask = torch.cat([ctx_ok[:, None, :].expand(n, B, ctx_len), torch.ones(n, B, B, dtype=torch.bool, device=dev)], dim=-1)
        x = self.target.embed(block)  # [n, B, H]
        if c.input_embedding_scale != 1.0:
            x = x * c.input_embedding_scale
        hidden = self.model.block_hidden(x.to(self.dtype), positions, ctx_k, ctx_v, mask[:, None])
        logits = self.model.logits(hidden[:, 1:], self.head)  # [n, B-1, V or draft vocab] float32
        picks = logits.argmax(dim=-1)
        drafts = (picks if self.draft_vocab is None else self.draft_vocab[picks]).tolist()
        q_out: list[torch.Tensor | None] = [None] * n
        for i, spec in enumerate(sampling):
            g = min(num_drafts[i], B - 1)
            if not spec.greedy and g > 0:
                q = filtered_probs(logits[i, :g], spec.temperature, spec.top_p, spec.top_k)  # [g, V']
                keys = [row_key(spec.seed, len(histories[i]) + 1 + j, STREAM_DRAFT) for j in range(g)]
                picked = sample_rows(q, keys)
                if self.draft_vocab is not None:  # q over the whole vocabulary: 0 outside the draft vocab
                    picked = self.draft_vocab[picked]
                    q = torch.zeros(g, self.model.config.vocab_size, device=q.device).index_copy_(1, self.draft_vocab, q)
                drafts[i] = picked.tolist()
                q_out[i] = q
        return [d[: max(0, min(g, B - 1))] for d, g in zip(drafts, num_drafts)], q_out

    # ---- helpers ------------------------------------------------------------------------

    def _append(self, slot: int, start: int, rows: int, hidden: dict[int, torch.Tensor] | None) -> None:
        """Keep target rows for positions start..start+rows-1, dropping whatever the slot
        held from `start` on."""
        if hidden is None or any(layer not in hidden for layer in self.capture_layers):
            raise ValueError(f"dflash: slot {slot} got no captured rows of layers {self.capture_layers}")
        feats = torch.cat([hidden[layer] for layer in self.capture_layers], dim=-1)  # [rows, nL*H]
        if feats.shape[0] != rows:
            raise ValueError(f"dflash: slot {slot} got {feats.shape[0]} captured rows for {rows} kept rows")
        if start > self.length[slot]:
            raise ValueError(f"dflash: slot {slot} has rows up to {self.length[slot]}, a commit at {start} leaves a gap")
        self.written[slot] = min(self.written[slot], start)
        kept = []
        for s, f in self.pending.get(slot, []):
            if s < start:
                kept.append((s, f[: start - s]))
        kept.append((start, feats.to(self.dtype)))
        self.pending[slot] = kept
        self.length[slot] = start + rows

    def _flush(self, slots: list[int]) -> None:
        """All pending rows of `slots` -> context keys/values, in one flat pass."""
        feats, pos, owner = [], [], []
        for slot in slots:
            for start, f in self.pending.pop(slot, []):
                feats.append(f)
                pos.append(torch.arange(start, start + f.shape[0], device=self.device))
                owner.append(torch.full((f.shape[0],), slot, dtype=torch.long, device=self.device))
            self.written[slot] = self.length[slot]
        if not feats:
            return
        pos_t, owner_t = torch.cat(pos), torch.cat(owner)
        for layer, (k, v) in enumerate(self.model.context_kv(torch.cat(feats), pos_t)):  # k, v: [R, hkv, d]
            self.ctx_k[layer][owner_t, :, pos_t] = k
            self.ctx_v[layer][owner_t, :, pos_t] = v
