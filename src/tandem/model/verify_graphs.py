"""CUDA graphs of the target's verify forward.

One graph per bucket (batch padded to a power of two, k rows, block tables padded to the
blocks of a power of two of at least MIN_CTX positions, captured layers), captured the
first time a verify of that bucket runs and replayed after. Few context buckets keep
captures rare: a capture costs about as much as a few dozen replays. Padding rows and
table entries name the cache's scratch block, and their outputs are dropped; the
attention reads each sequence's own blocks only, up to its own positions. Prefills of
prompts within the row budget have graphs of their own, padded to a power of two the same
way, whose LM head runs on each prompt's last row only (ModelShard._graphed_prompts), and
a long prompt's chunks run eagerly. A forward whose own bucket has no graph replays the
nearest deeper bucket's, where one is captured.
The outputs live in the graph's static buffers until its next replay: the shard reads
them (picks, and the captured rows at commit) before its next verify.
"""
from __future__ import annotations

import numpy as np
import torch

from tandem.model.cuda_graph import CapturedGraph, next_pow2
from tandem.model.kv_cache import PagedKVCache
from tandem.model.llama import ModelOutput

MIN_CTX = 256


class VerifyGraphs:
    def __init__(self, model: torch.nn.Module, cache: PagedKVCache, max_model_len: int, *, max_rows: int = 256,
                 max_graphs: int = 192, capture: bool = True):
        if cache.scratch_block is None:
            raise ValueError("verify graphs need a KV cache with a scratch block (PagedKVCache(..., scratch_blocks=1))")
        self.model, self.cache = model, cache
        self.max_model_len = max_model_len
        # Each graph keeps its [rows, vocab] float32 logits alive: rows and count are capped.
        self.max_rows, self.max_graphs = max_rows, max_graphs
        self.capture = capture
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.graphs: dict[tuple, CapturedGraph] = {}
        self._deeper: dict[tuple, int] = {}  # key -> the deeper bucket whose graph serves it (_deeper_graph)
        self.fused_kernels = getattr(model, "fused_kernels", None)  # what the graphs were captured with
        self.device = next(model.parameters()).device

    def forward(self, tokens: list[int], n: int, k: int, tables: list[list[int]], start_pos: list[int],
                capture_layers: tuple[int, ...], last_rows: list[int] | None = None) -> ModelOutput | None:
        """The forward of n sequences x k rows (tokens sequence-major), or None when this
        shape is not graphed (the caller runs it eagerly). With last_rows (a prompt's
        prefill) the logits are those of row last_rows[i] of each sequence, [n, 1, vocab]."""
        self._drop_if_kernels_changed()
        nb = next_pow2(n)
        if nb * k > self.max_rows:
            return None
        cb = self._bucket(max(max(start_pos) + k, max(len(t) for t in tables) * self.cache.block_size))
        prompt = last_rows is not None
        key = (nb, k, cb, tuple(capture_layers), prompt)
        runner = self.graphs.get(key)
        if runner is None:
            cb, runner = self._deeper_graph(key)
        if runner is None:
            if len(self.graphs) >= self.max_graphs:
                return None
            runner = self.graphs[key] = self._build(*key)
        # one host->device copy: row i = [its k tokens, its start position(, its last row),
        # its block table padded with the scratch block]; built in numpy, as a deep
        # bucket's table of Python ints cost milliseconds a tick (64 x 2048 entries: 19 ms)
        table_at, scratch = k + 1 + prompt, self.cache.scratch_block
        host = np.full((nb, table_at + cb // self.cache.block_size), scratch, dtype=np.int64)
        host[:, :table_at] = 0
        host[:n, :k] = np.asarray(tokens, dtype=np.int64).reshape(n, k)
        host[:n, k] = start_pos
        if prompt:
            host[:n, k + 1] = last_rows
        for i, table in enumerate(tables):
            host[i, table_at : table_at + len(table)] = table
        host = torch.from_numpy(host)
        out = runner.run(host)
        return ModelOutput(logits=out.logits[:n], hidden={layer: h[:n] for layer, h in out.hidden.items()})

    def capture_ahead(self, max_batch: int, max_k: int, row_budget: int, capture_layers: tuple[int, ...]) -> int:
        """Capture, before any request, the shapes a server meets first, at the shortest
        context bucket: every power-of-two batch up to max_batch sequences with 1..max_k
        rows each, within the row budget (verifies), and every power-of-two batch and
        prompt width within max_rows (prefills: which batches arrive together is chance),
        and all of them again at the deepest bucket.
        A capture on live traffic stalls every running stream (a few dozen replays' time
        each). Returns how many were captured."""
        self._drop_if_kernels_changed()
        layers = tuple(capture_layers)
        shapes = []
        for k in range(1, max_k + 1):  # verifies
            shapes += [(nb, k, False) for nb in _pow2_upto(next_pow2(max_batch))
                       if (nb // 2 + 1) * k <= row_budget and nb * k <= self.max_rows]  # some n padded to nb fits
        for k in _pow2_upto(min(self.max_rows, next_pow2(row_budget), self.max_model_len)):
            shapes += [(nb, k, True) for nb in _pow2_upto(next_pow2(max_batch)) if nb * k <= self.max_rows]  # prefills
        keys = [(nb, k, self._bucket(k), layers, prompt) for nb, k, prompt in shapes]  # a prefill's, a first verify's
        # and every shape at the deepest bucket too, which serves any deeper context than
        # the shortest (_deeper_graph): sequences cross buckets as they grow, and the rest
        # of a prompt whose prefix the cache holds starts deep (a shared system prompt's tail)
        deepest = self._bucket(self.max_model_len)
        keys += [(nb, k, deepest, layers, prompt) for nb, k, prompt in shapes if self._bucket(k) < deepest]
        added = 0
        for key in keys:
            if key not in self.graphs and len(self.graphs) < self.max_graphs:
                self.graphs[key] = self._build(*key)
                added += 1
        return added

    def _deeper_graph(self, key: tuple) -> tuple[int, CapturedGraph | None]:
        """The graph of the same shape at the nearest deeper context bucket, and that
        bucket: the attention reads each sequence's own positions only, so a table padded
        further with the scratch block gives the same rows. A graph not captured ahead is
        otherwise captured on live traffic, stalling every running stream."""
        nb, k, cb, layers, prompt = key
        bucket = self._deeper.get(key)
        if bucket is None:  # looked up once a key: every tick at that bucket asks again
            deeper = [c for (n2, k2, c, l2, p2) in self.graphs if (n2, k2, l2, p2) == (nb, k, layers, prompt) and c > cb]
            if not deeper:
                return cb, None
            bucket = self._deeper[key] = min(deeper)
        return bucket, self.graphs[(nb, k, bucket, layers, prompt)]

    def _drop_if_kernels_changed(self) -> None:
        """A graph replays the kernels it was captured with: after model.fused_kernels
        changes, every graph is captured again, in a new pool (the caching allocator
        frees a pool once no graph holds it, and a capture into it then fails)."""
        fused = getattr(self.model, "fused_kernels", None)
        if fused != self.fused_kernels:
            self.graphs.clear()
            self._deeper.clear()
            if self.capture:
                self.pool = torch.cuda.graph_pool_handle()
            self.fused_kernels = fused

    def _bucket(self, ctx: int) -> int:
        """The positions of the block tables of a forward reaching position ctx (a whole
        number of blocks)."""
        bs = self.cache.block_size
        positions = max(MIN_CTX, next_pow2(ctx), bs)
        return -(-min(positions, max(self.max_model_len, ctx)) // bs) * bs

    def _build(self, nb: int, k: int, cb: int, capture_layers: tuple[int, ...], prompt: bool) -> CapturedGraph:
        table_at = k + 1 + prompt
        inputs = torch.zeros(nb, table_at + cb // self.cache.block_size, dtype=torch.long, device=self.device)
        inputs[:, table_at:] = self.cache.scratch_block  # the warm-up runs before capture write only there

        def body() -> ModelOutput:
            return self.model(inputs[:, :k], inputs[:, k], self.cache, inputs[:, table_at:].int(),
                              capture_layers=capture_layers,
                              logit_rows=inputs[:, k + 1 : table_at] if prompt else None)

        return CapturedGraph(body, inputs, self.pool, self.capture)


def _pow2_upto(n: int) -> list[int]:
    return [1 << i for i in range(n.bit_length()) if 1 << i <= n]
