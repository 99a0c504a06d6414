"""DFlashDrafter: the rank-side drafter that drafts a block per sequence from the target's
hidden states, for a whole batch in one drafter forward.

Per slot it knows the target's captured rows (the `target_layer_ids` layers,
concatenated) for positions 0..P-1, P = the slot's KV length, and turns them into
context keys/values of its own layers, kept in blocks laid out like the target's KV: the
same block ids (each rank-side command carries the sequence's block table), so a block
the prefix cache shares holds the drafter's context of its positions too. A sequence
whose prompt starts with cached blocks gets the target's rows of the rest only. Every
slot's pending rows are written out before such a prefill, and a slot's before it is
released, so a shared block never lacks them:

  prefill  the prompt's rows past its cached prefix -> pending (positions cached..len-1)
  commit   the kept rows of a verify    -> pending (positions start..start+rows-1);
           rows past them (rejected) are dropped first: a commit at `start` trims
           whatever the slot held from `start` on
  propose  every slot of the batch: the pending rows of all of them go through
           fc/norm/k/v in ONE flat pass into the context cache; then ONE block forward
           of [last token, mask x (B-1)] per sequence, context padded to the batch's
           longest P (masked), gives B-1 drafts each

The drafter never writes a draft's row anywhere: only target rows of kept tokens enter
its context, so a rejection needs no rewind beyond the commit's trim.

A constrained sequence drafts under its grammar: its block's logits are masked position by
position with the state its drafts so far reached (masked_picks.py; rank 0's matchers,
tandem.grammar.draft_matchers), so the verify's grammar walk has nothing to cut. The rest
of the batch keeps the block's batched picks.

On a GPU a propose is launch-bound (a few hundred small kernels for one block), so the
block forward and the flush replay CUDA graphs captured per shape bucket (below): on an
H200 a batch-1 propose went from ~35 ms eager to ~1 ms. With graphs, both are queued
already at the commit of a batch that drafted (`committed`), from each sequence's bonus
token: they run while the scheduler walks the verdict, and the propose reads the rows.
The drafter's dtype may differ from the target's (build_dflash_drafter runs it in bf16
beside a float32 target on a CPU with native bf16 matmuls); its head is then a copy of the
target's rows in its dtype, or the int8 codes of those rows where the target's head runs in
int8 (draft_head.py).
"""
from __future__ import annotations

import logging
import os

import torch

from tandem.drafters.dflash.draft_head import draft_head
from tandem.drafters.dflash.masked_picks import masked_picks
from tandem.drafters.dflash.model import DFlashDraftModel
from tandem.grammar.draft_matchers import DraftMatchers
from tandem.model.cuda_graph import CapturedGraph, next_pow2
from tandem.sampling.filters import filtered_probs
from tandem.sampling.noise import STREAM_DRAFT, row_key, sample_rows
from tandem.shard.commands import DraftGrammar, SamplingSpec


# On a CUDA device the block forward and the flush of small commits replay CUDA graphs
# (one per shape bucket): the context read is padded to a multiple of CTX_BUCKET, the batch
# to a power of two, a flush to a power of two of rows (up to FLUSH_MAX_ROWS; larger ones,
# long prompts, run eagerly). ShardSpec.dflash_cuda_graphs=False runs everything eagerly.
CTX_BUCKET = 256
FLUSH_MAX_ROWS = 512
PENDING_MAX = 32  # commits a slot keeps pending before they are folded into its context

log = logging.getLogger("tandem.drafters.dflash")


class DFlashDrafter:
    name = "dflash"
    checkpoint: str | None = None  # the folder its weights came from (build_dflash_drafter sets it)

    def __init__(self, model: DFlashDraftModel, target: torch.nn.Module, *, num_slots: int, num_blocks: int,
                 block_size: int, max_seq_len: int, propose_batch_max: int = 64, cuda_graphs: bool | None = None,
                 matchers: DraftMatchers | None = None):
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
        self.matchers = matchers  # None: constrained sequences draft unmasked (the verify cuts them)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.num_slots, self.max_seq_len = num_slots, max_seq_len
        # ctx_k[layer], ctx_v[layer]: [blocks + 1, hkv, kv_block, d], position t of a slot at
        # block tables[slot][t // kv_block]; valid below written[slot]. The last block is
        # scratch: padding rows and table entries name it
        self.kv_block, self.scratch = block_size, num_blocks
        shape = (num_blocks + 1, c.num_kv_heads, block_size, c.head_dim)
        # the LM head rows drafts may come from: all, or the checkpoint's draft vocabulary
        vocab = getattr(model, "draft_vocab", None)
        self.draft_vocab = vocab.to(self.device) if vocab is not None else None
        self.head = draft_head(target.lm_head, self.draft_vocab, self.dtype)
        self.ctx_k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(c.num_layers)]
        self.ctx_v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(c.num_layers)]
        self._mask_ids = torch.full((self.block_size - 1,), c.mask_token_id, dtype=torch.long, device=self.device)
        self._block_offsets = torch.arange(self.block_size, device=self.device)
        if cuda_graphs is None:
            cuda_graphs = self.device.type == "cuda"
        # (kind, shape bucket) -> captured graph; None = eager (the CPU, or graphs turned off).
        # Asked for on a CPU, the same padded static shapes run without capture (what the
        # tests check there).
        self.graphs: dict[tuple, CapturedGraph] | None = {} if cuda_graphs else None
        self._capture = bool(cuda_graphs) and self.device.type == "cuda"
        self._pool = torch.cuda.graph_pool_handle() if self._capture else None
        self.written = [0] * num_slots  # context positions in the cache
        self.length = [0] * num_slots  # positions whose target rows are known (written + pending)
        self.pending: dict[int, list[tuple[int, torch.Tensor]]] = {}  # slot -> [(start, feats [r, nL*H])]
        self.tables: dict[int, list[int]] = {}  # slot -> its block table, as the last command gave it
        # A block forward launched at commit for the next propose: slot -> (its row, start,
        # last token), and the outputs (logits, picks). Any change of a slot drops it.
        self._ready: tuple[dict[int, tuple[int, int, int]], torch.Tensor, torch.Tensor] | None = None

    # ---- RankDrafter --------------------------------------------------------------------

    def set_table(self, slot: int, table: list[int]) -> None:
        self.tables[slot] = list(table)

    def prefill(self, slot: int, tokens: list[int], feats: torch.Tensor | None, cached_len: int = 0) -> None:
        table = self.tables.get(slot)  # set for this prefill (set_table)
        self.pending.pop(slot, None)  # rows of a sequence the slot held before are not this one's
        self.release([slot])
        if table is not None:
            self.tables[slot] = table
        if cached_len:
            # the shared blocks' context: every slot's pending rows written out first
            self._flush(list(self.pending))
        self.written[slot] = self.length[slot] = cached_len
        self._append(slot, cached_len, len(tokens) - cached_len, feats)

    def commit(self, slot: int, start_pos: int, rows: int, feats: torch.Tensor | None) -> None:
        self._append(slot, start_pos, rows, feats)

    @torch.inference_mode()
    def committed(self, slots: list[int], last_tokens: list[int]) -> None:
        # With graphs (a GPU) the next propose's work starts now, queued without a host
        # sync: the kept rows go into the context and the block forward runs from the bonus
        # tokens, while the scheduler walks the verdict; the propose then only reads the
        # drafts. Without graphs (the CPU) the rows wait, folded in with later commits.
        if self.graphs is None:
            return
        try:
            self._flush(slots)
            starts = [self.length[s] for s in slots]
            if len(slots) > self.propose_batch_max or max(starts) + self.block_size > self.max_seq_len:
                return
            logits, picks = self._block(slots, starts, last_tokens)
        except Exception as e:  # noqa: BLE001 - the verdict stands; the next propose runs the block itself
            log.warning("dflash: the block forward at commit failed (%s); the propose will run it", e)
            self._ready = None
            return
        self._ready = ({s: (i, p, t) for i, (s, p, t) in enumerate(zip(slots, starts, last_tokens))}, logits, picks)

    def release(self, slots: list[int]) -> None:
        """Forget the slots; their pending rows are written out first, in one pass: the
        prefix cache may hand their full blocks to a later sequence."""
        self._ready = None
        self._flush([s for s in slots if self.pending.get(s) and s in self.tables])
        for slot in slots:
            self.written[slot] = 0
            self.length[slot] = 0
            self.pending.pop(slot, None)
            self.tables.pop(slot, None)
            if self.matchers is not None:
                self.matchers.release(slot)

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
        n = len(slots)
        if n == 0:
            return [], []
        for slot, h in zip(slots, histories):
            if self.length[slot] != len(h):
                raise RuntimeError(f"dflash: slot {slot} holds target rows for {self.length[slot]} positions, "
                                   f"its sequence has {len(h)} committed tokens")
        self._flush(slots)
        B = self.block_size
        starts = [len(h) for h in histories]
        ready = self._take_ready(slots, starts, last_tokens)
        logits, picks = ready if ready is not None else self._block(slots, starts, last_tokens)  # [n, B-1, V'], [n, B-1]
        drafts = (picks if self.draft_vocab is None else self.draft_vocab[picks]).tolist()
        q_out: list[torch.Tensor | None] = [None] * n
        walks = self._walks(slots, histories, last_tokens, num_drafts, grammars)
        try:
            for i, walk in enumerate(walks):
                if walk is not None:
                    drafts[i], q_out[i] = masked_picks(logits[i], walk, min(num_drafts[i], B - 1), sampling[i],
                                                       len(histories[i]) + 1, self.draft_vocab, self.model.config.vocab_size)
        finally:
            for walk in walks:
                if walk is not None:
                    walk.finish()
        for i, spec in enumerate(sampling):
            g = min(num_drafts[i], B - 1)
            if not spec.greedy and g > 0 and walks[i] is None:
                q = filtered_probs(logits[i, :g], spec.temperature, spec.top_p, spec.top_k, spec.min_p)  # [g, V']
                keys = [row_key(spec.seed, len(histories[i]) + 1 + j, STREAM_DRAFT) for j in range(g)]
                picked = sample_rows(q, keys)
                if self.draft_vocab is not None:  # q over the whole vocabulary: 0 outside the draft vocab
                    picked = self.draft_vocab[picked]
                    q = torch.zeros(g, self.model.config.vocab_size, device=q.device).index_copy_(1, self.draft_vocab, q)
                drafts[i] = picked.tolist()
                q_out[i] = q
        return [d[: max(0, min(g, B - 1))] for d, g in zip(drafts, num_drafts)], q_out

    def _walks(self, slots, histories, last_tokens, num_drafts, grammars):
        """A grammar walk for each constrained sequence that drafts and whose matcher could
        be had; None for the others (they keep the block's batched picks)."""
        if self.matchers is None or not grammars:
            return [None] * len(slots)
        wanted = [gr if g > 0 else None for gr, g in zip(grammars, num_drafts)]
        return self.matchers.walks(slots, histories, last_tokens, wanted)

    def _take_ready(self, slots: list[int], starts: list[int], last_tokens: list[int]):
        """The block forward launched at commit, when it covers these slots at these
        positions and last tokens (its rows in this order); else None."""
        ready, self._ready = self._ready, None
        if ready is None:
            return None
        where, logits, picks = ready
        rows = []
        for slot, start, last in zip(slots, starts, last_tokens):
            entry = where.get(slot)
            if entry is None or entry[1:] != (start, last):
                return None
            rows.append(entry[0])
        if rows == list(range(len(where))):
            return logits, picks
        idx = torch.tensor(rows, dtype=torch.long)
        idx = idx.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else idx
        return logits.index_select(0, idx), picks.index_select(0, idx)

    # ---- the block forward: eager, or replayed from a CUDA graph ---------------------------

    def _block(self, slots: list[int], starts: list[int], last_tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [n, B-1, V'] (float32) and greedy picks [n, B-1] of the blocks of `slots`,
        block i at position starts[i] after the context 0..starts[i]-1."""
        n, ctx_len = len(slots), max(starts)
        if self.graphs is None or n > self.propose_batch_max or ctx_len > self.max_seq_len:
            # one host->device copy: P (the last token's position), the last token, the table
            width = max(1, -(-ctx_len // self.kv_block))
            host = torch.tensor([[p, t] + self._table_row(s, width) for s, p, t in zip(slots, starts, last_tokens)],
                                dtype=torch.long, device=self.device)
            return self._block_forward(host[:, 0], host[:, 1], host[:, 2:], width * self.kv_block)
        nb = min(next_pow2(n), next_pow2(self.propose_batch_max))
        cb = min(self.max_seq_len, -(-max(1, ctx_len) // CTX_BUCKET) * CTX_BUCKET)
        width = -(-cb // self.kv_block)
        pad = nb - n  # padding rows: no context, the scratch block (their outputs are ignored)
        host = torch.tensor([[p, t] + self._table_row(s, width) for s, p, t in zip(slots, starts, last_tokens)]
                            + [[0, 0] + [self.scratch] * width] * pad, dtype=torch.long)
        key = ("block", nb, cb)
        runner = self.graphs.get(key)
        if runner is None:
            inputs = torch.zeros(nb, 2 + width, dtype=torch.long, device=self.device)
            inputs[:, 2:] = self.scratch
            runner = self.graphs[key] = CapturedGraph(
                lambda: self._block_forward(inputs[:, 0], inputs[:, 1], inputs[:, 2:], width * self.kv_block),
                inputs, self._pool, self._capture)
        logits, picks = runner.run(host)
        return logits[:n], picks[:n]

    def _table_row(self, slot: int, width: int) -> list[int]:
        """The slot's first `width` table entries, padded with the scratch block."""
        table = self.tables.get(slot, [])[:width]
        return table + [self.scratch] * (width - len(table))

    def _block_forward(self, starts: torch.Tensor, last_t: torch.Tensor, tables_t: torch.Tensor,
                       ctx_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """starts, last_t: [n] on the device, tables_t [n, ctx_len / kv_block]; the context read
        is 0..ctx_len-1 (>= every start; positions at or past a row's start are masked), its
        blocks gathered (the drafter's context is a few layers: small). No host sync: capturable."""
        c = self.model.config
        B = self.block_size
        dev = self.device
        n = starts.shape[0]
        block = torch.cat([last_t[:, None], self._mask_ids[None].expand(n, B - 1)], dim=1)  # [n, B]
        positions = starts[:, None] + self._block_offsets  # [n, B]
        hkv, d = c.num_kv_heads, c.head_dim
        # [n, W, hkv, kv_block, d] -> [n, hkv, W * kv_block, d]
        ctx_k = [k[tables_t].transpose(1, 2).reshape(n, hkv, ctx_len, d) for k in self.ctx_k]
        ctx_v = [v[tables_t].transpose(1, 2).reshape(n, hkv, ctx_len, d) for v in self.ctx_v]
        ctx_ok = torch.arange(ctx_len, device=dev)[None, :] < starts[:, None]  # [n, C]
        mask = torch.cat([ctx_ok[:, None, :].expand(n, B, ctx_len), torch.ones(n, B, B, dtype=torch.bool, device=dev)], dim=-1)
        x = self.target.embed(block)  # [n, B, H]
        if c.input_embedding_scale != 1.0:
            x = x * c.input_embedding_scale
        hidden = self.model.block_hidden(x.to(self.dtype), positions, ctx_k, ctx_v, mask[:, None])
        logits = self.model.logits(hidden[:, 1:], self.head)  # [n, B-1, V or draft vocab] float32
        return logits, logits.argmax(dim=-1)

    # ---- helpers ------------------------------------------------------------------------

    def _append(self, slot: int, start: int, rows: int, feats: torch.Tensor | None) -> None:
        """Keep target rows (feats [rows, nL*H]) for positions start..start+rows-1, dropping
        whatever the slot held from `start` on."""
        self._ready = None
        width = len(self.capture_layers) * self.model.config.hidden_size
        if feats is None or feats.dim() != 2 or feats.shape[1] != width:
            raise ValueError(f"dflash: slot {slot} got no captured rows of layers {self.capture_layers} "
                             f"([rows, {width}]), got {None if feats is None else tuple(feats.shape)}")
        if feats.shape[0] != rows:
            raise ValueError(f"dflash: slot {slot} got {feats.shape[0]} captured rows for {rows} kept rows")
        if start > self.length[slot]:
            raise ValueError(f"dflash: slot {slot} has rows up to {self.length[slot]}, a commit at {start} leaves a gap")
        self.written[slot] = min(self.written[slot], start)
        pending = self.pending.setdefault(slot, [])
        if start < self.length[slot]:  # a rewind: drop what the slot held from `start` on
            pending[:] = [(s, f[: start - s]) for s, f in pending if s < start]
        pending.append((start, feats.to(self.dtype)))
        self.length[slot] = start + rows
        # A sequence that does not draft (speculation off) still commits a row a tick: fold
        # its rows in now and then, so the list and the next flush stay bounded.
        if len(pending) >= PENDING_MAX:
            self._flush([slot])

    @torch.inference_mode()  # also called from commit, outside the propose's inference mode
    def _flush(self, slots: list[int]) -> None:
        """All pending rows of `slots` -> context keys/values, in one flat pass."""
        feats, pos, block = [], [], []
        for slot in slots:
            table = self.tables.get(slot, [])
            for start, f in self.pending.pop(slot, []):
                feats.append(f)
                pos.extend(range(start, start + f.shape[0]))
                block.extend(table[t // self.kv_block] for t in range(start, start + f.shape[0]))
            self.written[slot] = self.length[slot]
        if not feats:
            return
        rows = len(pos)
        offset = [t % self.kv_block for t in pos]
        if self.graphs is None or rows > FLUSH_MAX_ROWS:
            idx = torch.tensor([pos, block, offset], dtype=torch.long, device=self.device)
            self._flush_forward(torch.cat(feats), idx[0], idx[1], idx[2])
            return
        rb = max(8, next_pow2(rows))
        key = ("flush", rb)
        runner = self.graphs.get(key)
        if runner is None:
            inputs = torch.zeros(3, rb, dtype=torch.long, device=self.device)
            inputs[1] = self.scratch  # the warm-up runs write only the scratch block
            buf = torch.zeros(rb, feats[0].shape[-1], dtype=self.dtype, device=self.device)
            runner = self.graphs[key] = CapturedGraph(lambda: self._flush_forward(buf, inputs[0], inputs[1], inputs[2]),
                                                      inputs, self._pool, self._capture, extra=buf)
        # padding rows write the scratch block, which no sequence owns
        pad = rb - rows
        host = torch.tensor([pos + [0] * pad, block + [self.scratch] * pad, offset + [0] * pad], dtype=torch.long)
        torch.cat(feats, out=runner.extra[:rows])
        runner.run(host)

    def _flush_forward(self, feats: torch.Tensor, pos_t: torch.Tensor, block_t: torch.Tensor,
                       offset_t: torch.Tensor) -> None:
        for layer, (k, v) in enumerate(self.model.context_kv(feats, pos_t)):  # k, v: [R, hkv, d]
            self.ctx_k[layer][block_t, :, offset_t] = k
            self.ctx_v[layer][block_t, :, offset_t] = v
