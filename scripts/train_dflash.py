"""Train a DFlash drafter for a target model from the target's own greedy continuations.

No data set can be downloaded here, so the script makes its own:
  1. prompts: chat requests built from templates x subjects (stories, explanations,
     lists, code, arithmetic, ...), optionally with style requests (--modifiers) and
     user turns the target writes itself (--num-self-prompts, as Magpie does), and
     training-only prompts from more subjects, templates and code tasks (--extra-prompts;
     the held-out prompts stay those of --num-prompts alone); a set of subjects and code
     tasks is held out for evaluation only (all of it in scripts/dflash_prompts.py);
  2. data: the target's greedy continuation of every prompt (batched decoding with our
     own forward and KV cache), capturing the drafter's target layers on the way, so
     the features are what the engine's prefill/verify forwards hand the drafter (for
     a corpus over one call, --save-tokens / --load-tokens: see the device workflow);
  3. training: random anchors p in each response; the block [token p, mask x (B-1)]
     sees the target features of positions < p and learns the tokens p+1..p+B-1
     (cross-entropy through the target's frozen LM head, weighted exp(-(j-1)/decay)
     by block position j, as in the DFlash paper); many blocks per sequence in one
     forward, each masked to its own context and its own rows;
  4. evaluation on held-out prompts: the offline acceptance (leading drafts equal to
     the target's greedy tokens, averaged over uniform anchors), the same walked as the
     engine's rounds (a round at the first generated token, the next one accepted + 1
     later), and the engine's own (drafter=dflash, greedy, B-1 drafts a round, no
     adaptation).

Why the engine's acceptance length is below the uniform-anchor one: it is no engine bug.
Rounds are not uniform anchors: a stretch the drafter gets right is crossed in few rounds,
one it gets wrong in many, so rounds over-sample the hard positions. Walking the offline
per-anchor counts as the engine does gives the engine's number (3.056 walked vs 3.041
in the engine, 3.767 over uniform anchors, for the shipped weights; tests/dflash checks
that the walk predicts the engine's rounds exactly on a tiny float32 target).

With --draft-vocab-coverage < 1 (default 0.999) the drafter drafts from the most frequent
generated tokens only, the head being those rows in training and in the engine (a CPU
propose then scores ~21k rows instead of 49k; ~14k with the narrower 16000-prompt data).

General traffic (--general-prompts, scripts/dflash_general_prompts.py): chat requests of
eight kinds (code in many languages, math, lists and tables, long prose, rewriting and
summarising, multilingual, structured output, everyday requests; some with a system
prompt, many around a passage) and raw completions (no chat template) of text that ships
in the installed Python packages (sources, C/C++ headers, READMEs, pydoc topics), up to
--max-prompt-tokens long; --sample-share of all continuations are sampled (--temperature,
--top-k) instead of greedy. Every training prompt overlapping the evaluation set
(bench/dflash_eval_prompts.py) is dropped; tests/dflash/test_eval_prompts.py checks the
sources are disjoint from it anyway. --one-call generates (prompts chunked by length,
--pos-budget positions a chunk, until --gen-seconds), rebuilds the features and trains
in one process, or with --save-tokens DIR saves the tokens (and the per-kind counts) for a
later call's --load-tokens DIR; --revocab widens the draft vocabulary of a warm start to the
new corpus, or with --draft-vocab-size N re-chooses N rows (the corpus's most frequent).

The weights are saved in bf16 in the z-lab checkpoint layout. The shipped weights
(src/tandem/drafters/dflash/weights/smollm2: 3 layers, intermediate 768, 8.3 M parameters,
16.8 MB, draft vocabulary 20736) are run E's (scripts/dflash_notes.md, 2026-12-02): run D's
recipe below over two calls on one warm H200, a saved corpus, then a warm start from C with
a head of C's width re-chosen on the corpus (evaluation set, engine, float32: 2.064 -> 2.499;
held-out families 3.047 -> 3.032):

  python scripts/train_dflash.py --model smollm2.gguf --device cuda --out UNUSED --one-call \
      --num-prompts 16000 --extra-prompts 20000 --max-template-prompts 16000 --general-prompts 44000 \
      --num-self-prompts 4000 --data-seed 3 --sample-share 0.25 --train-gen-tokens 192 --gen-batch 4000 \
      --gen-seconds 330 --max-train-rows 14000000 --save-tokens TOKDIR
  python scripts/train_dflash.py --model smollm2.gguf --device cuda --out OUTDIR --num-prompts 16000 \
      --extra-prompts 20000 --max-template-prompts 16000 --general-prompts 44000 --sample-share 0.25 \
      --data-seed 3 --load-tokens TOKDIR --max-train-rows 14000000 --init-from PREVIOUS --revocab \
      --draft-vocab-size 20736 --lr 5e-4 --train-seconds 100000 --total-seconds 470 --eval-every 2000 \
      --engine-baseline

  (64000 prompts, all generated in 199 s: 10.17M tokens, cut to 14M rows: 57178 prompts,
  9.10M generated tokens; 6296 steps in 324 s; held-out offline / walked 3.953 / 3.228 at
  the start, 3.791 / 3.169 at the end; bench prompts 2.696 walked.)

Run D (2026-12-01, not shipped) warm-started C on general traffic in one H200 call
(evaluation set, engine, float32: 2.064 -> 2.441; held-out families 3.041 -> 2.937):

  python scripts/train_dflash.py --model smollm2.gguf --device cuda --out OUTDIR --one-call \
      --num-prompts 16000 --extra-prompts 20000 --max-template-prompts 12000 --general-prompts 40000 \
      --num-self-prompts 4000 --data-seed 2 --sample-share 0.25 --train-gen-tokens 192 --gen-batch 4000 \
      --gen-seconds 240 --init-from PREVIOUS --revocab --lr 5e-4 --train-seconds 100000 --total-seconds 522 \
      --eval-every 2000 --engine-baseline --max-train-rows 14000000

  (56000 prompts, 124 dropped by decontamination and length; 10 of 16 length chunks done by
  the deadline: 37513 prompts, 5.95M generated tokens, 8.41M rows; 2840 steps in 154 s at
  70 ms a step; held-out offline / walked 3.727 / 3.005 at the start, 3.517 / 2.927 at the
  end, engine 2.937 with 64/64 outputs equal to no-spec; bench prompts 2.727 walked.)

Run C, the weights D and E started from (held-out engine acceptance 3.041,
against the 2.923 they started from, 2026-11-30), came from a 2-GPU H200 host, one process a GPU, back to back:

  python scripts/train_dflash.py --model smollm2.gguf --device cuda --out UNUSED \
      --num-prompts 16000 --extra-prompts 100000 --num-self-prompts 12000 --data-seed 1 \
      --gen-batch 4000 --save-tokens TOKDIR --gen-seconds 460 --shard I/2        # I = 0, 1
  python scripts/train_dflash.py --model smollm2.gguf --device cuda --out OUTDIR --engine-baseline \
      --num-prompts 16000 --extra-prompts 100000 --data-seed 1 --gen-batch 4000 \
      --load-tokens TOKDIR --shard 0/2 --max-train-rows 16000000 --init-from PREVIOUS \
      --lr 5e-4 --train-seconds 100000 --total-seconds 485 --eval-every 3000

  (PREVIOUS: the weights of the run below. ~64000 prompts and 13.1M generated tokens a
  GPU, 379 s; then 9995 steps in 370 s on shard 0; held-out: offline 3.767, walked 3.056,
  engine 3.041 with 64/64 outputs equal to no-spec; bench prompts 2.722 walked. Shard 1 at
  lr 1e-3 gave engine 3.055, offline 3.716.)

  The weights they started from came from two H200 calls back to back on one machine:

  python scripts/train_dflash.py --model smollm2.gguf --device cuda --out UNUSED \
      --num-prompts 16000 --extra-prompts 42000 --num-self-prompts 4000 --gen-batch 4000 \
      --save-tokens TOKDIR --gen-seconds 460
  python scripts/train_dflash.py --model smollm2.gguf --device cuda --out OUTDIR --engine-baseline \
      --num-prompts 16000 --extra-prompts 42000 --gen-batch 4000 --load-tokens TOKDIR \
      --max-train-rows 16000000 --train-seconds 100000 --total-seconds 430 --eval-every 2500

  (62000 prompts: the 16000 of the run below, 42000 extra, 4000 self-written -> 12.49M
  generated tokens in 16 chunks, 373 s, --gen-seconds not reached; then the features of
  15.09M rows rebuilt in 29 s, 7243 steps of 96 sequences x 32 blocks in 300 s (the
  step count fitted to --total-seconds: --max-steps 7243 repeats it), 385 s before the
  engine check; held-out: offline acceptance length 3.638 over uniform anchors, 2.931
  walked, engine 2.923 with 64/64 outputs equal to no-spec; bench prompts 2.624 walked.
  While training, held-out offline/walked: 3.206/2.612 at step 2500, 3.592/2.879 at 5000.)
  Each sequence is seen ~11 times instead of ~40: four times the data per parameter
  closed much of the generalisation gap that the weights below showed.

  Run A of scripts/dflash_notes.md, the baseline of B (draft vocabulary 13824, 16.7 MB), came
  from one run:

  python scripts/train_dflash.py --model smollm2.gguf --device cuda --out OUTDIR --engine-baseline \
      --num-prompts 16000 --gen-batch 4000 --max-steps 6800 --train-seconds 100000

  (16000 prompts -> 2.96M generated tokens in 124 s, 6800 steps of 96 sequences x 32
  blocks in 274 s, 416 s in all before the engine check; held-out: offline acceptance
  length 3.244 over uniform anchors, 2.611 walked, engine 2.615 with 64/64 outputs equal
  to no-spec). On its training batches the same weights reach 5.1 (uniform anchors), so
  what limits them is generalisation, not fitting. More varied prompts alone did not help:
  `--num-prompts 14000 --modifiers --num-self-prompts 5000 --total-seconds 470` (3.43M
  tokens, 6800 steps) gave 3.290 offline, 2.629 walked, engine 2.630. A run of the same data cut to 2662 steps
  gave engine 2.489; the weights before those (2 layers, intermediate 1024, full
  vocabulary, 10000 prompts, 4917 steps of 64 sequences) 2.944 offline / 2.344 engine.

The device workflow: the GGUF (94 MiB) is over one call's 64 MiB carry, so it travels in
two halves (`split -n 2`), the first copied out of the repository on one call and joined
with the second on the next call, back to back while the machine is warm; the gguf wheel
travels with the first half (pip install --target, PYTHONPATH). Point TANDEM_CACHE_DIR
outside the repository so later calls on the same machine skip the dequantization.
A checkpoint over 16 MiB comes back split (`split -b 15000000`) and is joined with cat.
Gzipped (`gzip -1`), each half is ~3.7 MB smaller, which leaves room beside the working
tree for the wheel as well.

A corpus whose generation and training do not fit one call's 600 s: --save-tokens DIR
generates the continuations alone (no features: ~43k tokens/s on an H200 at --gen-batch
4000) in shuffled chunks under DIR (on the device's /tmp, ~60 MB for 12.5M tokens) until
--gen-seconds; the next call, on the still-warm machine, trains with --load-tokens DIR,
which rebuilds the features with one causal prefill per whole sequence (the decode's rows
up to rounding; ~0.5M rows/s) and keeps them packed without padding (5760 bytes a row for
SmolLM2: 15M rows, 87 GB; --max-train-rows caps it).

Regularisers for the generalisation gap, all off by default and not yet measured:
--weight-decay (default 0.01), --dropout (residual branches, training only, by forward
hooks), --feature-noise (Gaussian, times each target layer row's RMS), --label-smoothing.
--eval-every logs the held-out offline and walked numbers while training.

A small CPU run checks the pipeline:
  python scripts/train_dflash.py --device cpu --num-prompts 24 --num-eval 4 --gen-tokens 24 \
      --gen-batch 8 --batch 4 --blocks-per-seq 4 --train-seconds 20 --out /tmp/dflash-smoke
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from dataclasses import replace

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from tandem.drafters.dflash import DFlashConfig, DFlashDraftModel, save_dflash_checkpoint  # noqa: E402
from tandem.drafters.dflash.checkpoint import load_dflash_checkpoint  # noqa: E402
from tandem.drafters.dflash.model import spread_layer_ids  # noqa: E402
from tandem.model.kv_cache import fixed_tables  # noqa: E402
from tandem.model.loader import load_model  # noqa: E402

from dflash_prompts import bench_prompts, chat_ids, make_extra_prompts, make_prompts, self_sampled_prompts  # noqa: E402

# ---- data: greedy continuations with the captured layers ------------------------------

KV_BLOCK = 16  # positions of a block of the target's KV cache


@torch.inference_mode()
def _pick(logits, sample, temperature: float, top_k: int, gen):
    """Next tokens [n]: the argmax, or where sample [n] is True a draw at `temperature`
    from the top_k tokens."""
    best = logits.argmax(-1)
    if sample is None or not bool(sample.any()):
        return best
    top = torch.topk(logits.float() / temperature, top_k, dim=-1)
    drawn = top.indices.gather(1, torch.multinomial(torch.softmax(top.values, -1), 1, generator=gen))[:, 0]
    return torch.where(sample, drawn, best)


def greedy_with_features(model, prompts: list[list[int]], layers: tuple[int, ...], max_new: int, batch: int,
                         eos: set[int], prefill_batch: int = 64, features: bool = True, sample=None,
                         temperature: float = 0.8, top_k: int = 40, gen=None):
    """Each prompt's greedy continuation (cut after the first stop token) and the captured
    rows of every position: tokens [N, T] (0-padded), feats [N, T, len(layers)*H] (bf16),
    prompt_len [N], seq_len [N]. Rows 0..seq_len-2 hold the features the engine would
    hand the drafter (the last token's row is never context). With features=False, the
    tokens alone (feats is None). sample [N] (bool, optional): those prompts' continuations
    are sampled (temperature, top_k, generator gen) instead of greedy."""
    if not features:
        layers = ()
    dev = model.device
    H = model.config.hidden_size
    t_max = max(len(p) for p in prompts) + max_new
    N = len(prompts)
    all_tokens = torch.zeros(N, t_max, dtype=torch.long, device=dev)
    feat_dtype = torch.bfloat16 if dev.type == "cuda" else model.dtype  # bf16 halves the GPU store
    all_feats = torch.zeros(N, t_max, len(layers) * H, dtype=feat_dtype, device=dev) if features else None
    prompt_len = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=dev)
    seq_len = torch.zeros(N, dtype=torch.long, device=dev)
    eos_t = torch.tensor(sorted(eos), device=dev)
    for b0 in range(0, N, batch):
        chunk = prompts[b0 : b0 + batch]
        n = len(chunk)
        lens = prompt_len[b0 : b0 + n]
        t0 = int(lens.max())
        tables = fixed_tables(n, t0 + max_new, KV_BLOCK, dev)  # sequence i: the blocks of row i
        cache = model.new_cache(n * tables.shape[1], KV_BLOCK)
        tokens = torch.zeros(n, t0 + max_new, dtype=torch.long, device=dev)
        for i, p in enumerate(chunk):
            tokens[i, : len(p)] = torch.tensor(p, device=dev)
        feats = all_feats[b0 : b0 + n] if features else None
        samp = None if sample is None else sample[b0 : b0 + n].to(dev)
        nxt = torch.empty(n, dtype=torch.long, device=dev)
        for s0 in range(0, n, prefill_batch):  # prefill in sub-batches: full logits are [n, t0, V]
            s1 = min(n, s0 + prefill_batch)
            start = torch.zeros(s1 - s0, dtype=torch.int32, device=dev)
            out = model(tokens[s0:s1, :t0], start, cache, tables[s0:s1], capture_layers=layers)
            if features:
                feats[s0:s1, :t0] = torch.cat([out.hidden[i] for i in layers], dim=-1).to(feat_dtype)
            nxt[s0:s1] = _pick(out.logits[torch.arange(s1 - s0, device=dev), lens[s0:s1] - 1],
                               None if samp is None else samp[s0:s1], temperature, top_k, gen)
        rows = torch.arange(n, device=dev)
        done = torch.zeros(n, dtype=torch.bool, device=dev)
        end = torch.full((n,), max_new, dtype=torch.long, device=dev)  # generated tokens kept per sequence
        for t in range(max_new):
            pos = lens + t
            tokens[rows, pos] = nxt
            stop = torch.isin(nxt, eos_t) & ~done
            end = torch.where(stop, torch.full_like(end, t + 1), end)
            done |= stop
            if t + 1 == max_new or bool(done.all()):
                break
            out = model(nxt[:, None], pos, cache, tables, capture_layers=layers)
            if features:
                feats[rows, pos] = torch.cat([out.hidden[i][:, 0] for i in layers], dim=-1).to(feat_dtype)
            nxt = _pick(out.logits[:, 0], samp, temperature, top_k, gen)
        all_tokens[b0 : b0 + n, : t0 + max_new] = tokens
        seq_len[b0 : b0 + n] = lens + end
        del cache
    return all_tokens, all_feats, prompt_len, seq_len


# ---- data too large for one call: tokens saved in one call, features rebuilt in the next --


class Packed:
    """Sequences stored back to back without padding: tokens [P], feats [P, F] (or None),
    off [N] (each sequence's first row), prompt_len [N], seq_len [N]. A padded corpus of
    60k sequences would hold ~300 rows each; packed it holds ~220."""

    def __init__(self, tokens, feats, off, prompt_len, seq_len, self_written=None):
        self.tokens, self.feats, self.off, self.prompt_len, self.seq_len = tokens, feats, off, prompt_len, seq_len
        self.self_written = self_written  # [N] bool (self-written prompts) or None: not known

    @property
    def n(self) -> int:
        return int(self.off.shape[0])

    def rows(self, idx: torch.Tensor, t_len: int) -> torch.Tensor:
        """[b, t_len] row indices of sequences idx (past a sequence's end: its last row,
        which no block reads: anchors end 2 before it, labels past it are invalid)."""
        pos = torch.arange(t_len, device=idx.device)[None]
        return self.off[idx][:, None] + torch.minimum(pos, self.seq_len[idx][:, None] - 1)

    def batch(self, idx: torch.Tensor, t_len: int):
        r = self.rows(idx, t_len)
        return self.tokens[r], self.feats[r]


def pack(tokens, prompt_len, seq_len) -> Packed:
    """Packs padded tokens [N, T] (features left out)."""
    keep = torch.arange(tokens.shape[1], device=tokens.device)[None] < seq_len[:, None]
    off = torch.cumsum(seq_len, 0) - seq_len
    return Packed(tokens[keep], None, off, prompt_len.clone(), seq_len.clone())


def generate_packed(model, prompt_ids: list[list[int]], sample: list[bool], max_new: int, gen_batch: int,
                    pos_budget: int, eos: set[int], deadline: float, temperature: float, top_k: int, seed: int,
                    log) -> tuple[Packed, list[int]]:
    """The continuations of prompts of any lengths in one process, tokens only, packed:
    prompts sorted by length into chunks of at most gen_batch prompts and pos_budget
    positions (batch x (longest prompt + max_new): the KV cache), the chunks run in a
    seeded random order until `deadline` (time.time()). Returns the packed tokens and
    the indices of the prompts done, in the order packed."""
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    chunks, cur = [], []
    for i in order:
        if cur and (len(cur) >= gen_batch or (len(cur) + 1) * (len(prompt_ids[i]) + max_new) > pos_budget):
            chunks.append(cur)
            cur = []
        cur.append(i)
    if cur:
        chunks.append(cur)
    random.Random(seed + 17).shuffle(chunks)
    dev = model.device
    gen = torch.Generator(device=dev).manual_seed(seed + 19)
    parts, done, last, rows = [], [], 0.0, 0
    for k, chunk in enumerate(chunks):
        if time.time() + last > deadline:
            log(f"generation: deadline reached after {k}/{len(chunks)} chunks")
            break
        t0 = time.time()
        data = greedy_with_features(model, [prompt_ids[i] for i in chunk], (), max_new, len(chunk), eos, features=False,
                                    sample=torch.tensor([sample[i] for i in chunk], dtype=torch.bool),
                                    temperature=temperature, top_k=top_k, gen=gen)
        parts.append(pack(data[0], data[2], data[3]))
        done += chunk
        rows += int((data[3] - data[2]).sum())
        last = time.time() - t0
        if k % 10 == 0 or k + 1 == len(chunks):
            log(f"chunk {k}/{len(chunks)}: {len(chunk)} prompts of <= {len(prompt_ids[chunk[-1]])} tokens in {last:.1f} s; "
                f"{len(done)} prompts, {rows} generated tokens so far")
    seq_len = torch.cat([p.seq_len for p in parts])
    packed = Packed(torch.cat([p.tokens for p in parts]), None, torch.cumsum(seq_len, 0) - seq_len,
                    torch.cat([p.prompt_len for p in parts]), seq_len)
    return packed, done


def save_token_chunk(path: str, data, self_written: list[bool] | None = None, packed: bool = False) -> None:
    """data: padded (tokens [N, T], _, prompt_len, seq_len), or with packed=True tokens [P] already packed."""
    tokens, _, prompt_len, seq_len = data
    flat = tokens if packed else pack(tokens, prompt_len, seq_len).tokens
    d = {"tokens": flat.to(torch.int32).cpu(), "prompt_len": prompt_len.cpu(), "seq_len": seq_len.cpu()}
    if self_written is not None:
        d["self_written"] = torch.tensor(self_written, dtype=torch.bool)
    torch.save(d, path)


def load_token_chunks(folder: str, device, max_rows: int | None = None, shard: tuple[int, int] = (0, 1)) -> Packed:
    """The chunks save_token_chunk wrote (chunk*.pt, in order), packed; at most max_rows rows.
    shard (i, n): only the chunks whose number is i modulo n."""
    names = sorted(f for f in os.listdir(folder) if f.startswith("chunk") and f.endswith(".pt")
                   and int(f[5:-3]) % shard[1] == shard[0])
    toks, pls, sls, own = [], [], [], []
    rows = 0
    for name in names:
        d = torch.load(os.path.join(folder, name))
        pl, sl, tk = d["prompt_len"], d["seq_len"], d["tokens"]
        sw = d.get("self_written")
        full = max_rows is not None and rows + int(sl.sum()) > max_rows
        if full:  # whole sequences only
            n = int((torch.cumsum(sl, 0) <= max_rows - rows).sum())
            pl, sl = pl[:n], sl[:n]
            tk = tk[: int(sl.sum())]
            sw = None if sw is None else sw[:n]
        toks.append(tk), pls.append(pl), sls.append(sl), own.append(sw)
        rows += int(sl.sum())
        if full:
            break
    seq_len = torch.cat(sls).to(device)
    return Packed(torch.cat(toks).long().to(device), None, torch.cumsum(seq_len, 0) - seq_len,
                  torch.cat(pls).to(device), seq_len, None if any(o is None for o in own) else torch.cat(own))


@torch.inference_mode()
def prefill_features(model, data: Packed, layers: tuple[int, ...], max_seqs: int = 512, max_tokens: int = 131072) -> None:
    """Fills data.feats [P, len(layers)*H] (bf16 on a GPU) with the captured rows of one
    causal forward over each whole sequence (prompt and continuation): the rows the
    decoding captured, up to rounding (a prefill, not one row at a time)."""
    dev = model.device
    H = model.config.hidden_size
    feat_dtype = torch.bfloat16 if dev.type == "cuda" else model.dtype
    data.feats = torch.empty(data.tokens.shape[0], len(layers) * H, dtype=feat_dtype, device=dev)
    lens = data.seq_len.tolist()
    order = sorted(range(len(lens)), key=lens.__getitem__)
    t_max = max(lens)
    max_seqs = min(max_seqs, len(lens))  # the cache is max_seqs x the longest sequence
    tables = fixed_tables(max_seqs, t_max, KV_BLOCK, dev)  # sequence i of a forward: the blocks of row i
    cache = model.new_cache(max_seqs * tables.shape[1], KV_BLOCK)
    i = 0
    while i < len(order):
        n = 1
        while i + n < len(order) and n < max_seqs and (n + 1) * lens[order[i + n]] <= max_tokens:
            n += 1
        ids = torch.tensor(order[i : i + n], device=dev)
        t = lens[order[i + n - 1]]
        rows = data.rows(ids, t)  # [n, t]
        out = model(data.tokens[rows], torch.zeros(n, dtype=torch.int32, device=dev), cache, tables[:n],
                    capture_layers=layers, logit_rows=torch.zeros(n, 0, dtype=torch.long, device=dev))
        h = torch.cat([out.hidden[j] for j in layers], dim=-1).to(feat_dtype)  # [n, t, F]
        valid = torch.arange(t, device=dev)[None] < data.seq_len[ids][:, None]
        data.feats[rows[valid]] = h[valid]
        i += n


# ---- training ---------------------------------------------------------------------------


def sample_anchors(prompt_len, seq_len, per_seq: int, gen: torch.Generator | None = None):
    """[b, per_seq] positions p in [prompt_len, seq_len - 2]: blocks whose first token is a
    generated one with at least one generated token after it."""
    span = (seq_len - 1 - prompt_len).clamp(min=1)  # [b]
    u = torch.rand(prompt_len.shape[0], per_seq, device=prompt_len.device, generator=gen)
    return prompt_len[:, None] + (u * span[:, None]).long()


def block_hidden(model: DFlashDraftModel, target, tokens, feats, anchors):
    """The drafter's output rows for blocks anchored at `anchors` [b, nb] of the sequences
    tokens [b, T] with target rows feats [b, T, nL*H]: [b, nb, B-1, H], row j drafting the
    token at anchor + 1 + j. Many blocks of a sequence share one forward: block j sees the
    context before its anchor and its own B rows (both ways), as a propose at the anchor
    would."""
    c = model.config
    B = c.block_size
    b, nb = anchors.shape
    T = feats.shape[1]
    dev = tokens.device
    ctx_pos = torch.arange(T, device=dev)
    kv = model.context_kv(feats, ctx_pos[None].expand(b, T))  # per layer k, v: [b, T, hkv, d]
    ctx_k = [k.transpose(1, 2) for k, _ in kv]
    ctx_v = [v.transpose(1, 2) for _, v in kv]
    pos = anchors[:, :, None] + torch.arange(B, device=dev)  # [b, nb, B]
    block = torch.full((b, nb, B), c.mask_token_id, dtype=torch.long, device=dev)
    block[:, :, 0] = tokens.gather(1, anchors)
    x = target.embed(block.flatten(1)) * c.input_embedding_scale  # [b, nb*B, H]
    ctx_ok = ctx_pos[None, None, :] < anchors[:, :, None]  # [b, nb, T]
    ctx_ok = ctx_ok[:, :, None, :].expand(b, nb, B, T).reshape(b, nb * B, T)
    blk = torch.arange(nb, device=dev).repeat_interleave(B)
    own = (blk[:, None] == blk[None, :])[None].expand(b, -1, -1)
    mask = torch.cat([ctx_ok, own], dim=-1)[:, None]  # [b, 1, nb*B, T + nb*B]
    hidden = model.block_hidden(x, pos.flatten(1), ctx_k, ctx_v, mask)  # [b, nb*B, H]
    return hidden.view(b, nb, B, -1)[:, :, 1:]


def block_loss(model: DFlashDraftModel, target, tokens, feats, prompt_len, seq_len, anchors, decay: float,
               label_smoothing: float = 0.0):
    """Weighted cross-entropy of the drafts of blocks anchored at `anchors` [b, nb], and
    the accepted count of each block (leading drafts equal to the target's tokens) [b, nb].
    With a draft vocabulary the head is its rows only; labels outside it (never draftable)
    count as misses and stay out of the loss."""
    B = model.config.block_size
    b, nb = anchors.shape
    T = tokens.shape[1]
    offs = torch.arange(1, B, device=tokens.device)
    label_pos = anchors[:, :, None] + offs  # [b, nb, B-1]
    labels = tokens.gather(1, label_pos.clamp(max=T - 1).flatten(1)).view(b, nb, B - 1)
    valid = label_pos < seq_len[:, None, None]
    vocab = getattr(model, "draft_vocab", None)
    head = target.lm_head
    if vocab is not None:
        to_row = torch.full((model.config.vocab_size,), -1, dtype=torch.long, device=tokens.device)
        to_row[vocab] = torch.arange(vocab.numel(), device=tokens.device)
        labels = to_row[labels]  # -1 outside the draft vocabulary
        head = target.lm_head.weight[vocab]
    hidden = block_hidden(model, target, tokens, feats, anchors)
    sel = (valid & (labels >= 0)).flatten()
    logits = model.logits(hidden.flatten(0, 2)[sel], head)  # [R, V']
    ce = F.cross_entropy(logits, labels.flatten()[sel], reduction="none", label_smoothing=label_smoothing)
    weight = torch.exp(-(offs - 1).float() / decay)[None, None].expand(b, nb, B - 1).flatten()[sel]
    loss = (ce * weight).sum() / weight.sum().clamp_min(1e-6)
    hit = torch.zeros(b * nb * (B - 1), dtype=torch.bool, device=tokens.device)
    hit[sel] = logits.argmax(-1) == labels.flatten()[sel]
    accepted = hit.view(b, nb, B - 1).long().cumprod(-1).sum(-1)  # [b, nb]
    return loss, accepted


def add_dropout(model: DFlashDraftModel, p: float) -> list:
    """Dropout on every layer's attention and MLP outputs (the residual branches), active
    in training mode only; forward hooks, so the model and its checkpoint are unchanged.
    Returns the hook handles (remove() them to take it out)."""
    def hook(module, inputs, output):
        return F.dropout(output, p, module.training)

    return [m.register_forward_hook(hook) for layer in model.layers for m in (layer.self_attn, layer.mlp)]


def noisy_features(feats: torch.Tensor, num_layers: int, std: float, gen: torch.Generator) -> torch.Tensor:
    """feats [..., nL*H] plus Gaussian noise of `std` times each layer row's own RMS (the
    target layers' scales differ widely)."""
    f = feats.unflatten(-1, (num_layers, -1)).float()
    rms = f.pow(2).mean(-1, keepdim=True).sqrt()
    noise = torch.randn(f.shape, device=f.device, generator=gen)
    return (f + std * rms * noise).flatten(-2).to(feats.dtype)


def train(model, target, data, args, log, evaluate=None) -> None:
    """`data` is a padded (tokens, feats, prompt_len, seq_len) or a Packed; `evaluate`,
    if given, is called every args.eval_every steps (held-out numbers while training)."""
    if isinstance(data, Packed):
        tokens, feats, prompt_len, seq_len = data.tokens, data.feats, data.prompt_len, data.seq_len
        N = data.n
    else:
        tokens, feats, prompt_len, seq_len = data
        N = tokens.shape[0]
    dev = tokens.device
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    steps, step, t_start = args.max_steps, 0, time.time()
    timed_from = None
    while step < steps:
        # Fit the schedule to the time budget from the measured step time, and fit it again
        # later: the first steps run slow (allocator growth, kernel choice for new shapes),
        # and a schedule fitted on them alone once ended a 340 s budget after 118 s.
        if step == 10:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            timed_from = (time.time(), step)
        if step in (30, 300, 1000, 3000) and timed_from is not None and step < steps:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            per_step = (time.time() - timed_from[0]) / (step - timed_from[1])
            left = args.train_seconds - (time.time() - t_start)
            steps = min(args.max_steps, max(step + 1, step + int(left / per_step)))
            log(f"train: {per_step * 1000:.1f} ms/step -> {steps} steps")
        idx = torch.randint(0, N, (args.batch,), device=dev, generator=gen)
        t_len = int(seq_len[idx].max())
        anchors = sample_anchors(prompt_len[idx], seq_len[idx], args.blocks_per_seq, gen)
        warm = min(1.0, (step + 1) / args.warmup)
        cos = 0.5 * (1 + math.cos(math.pi * min(1.0, step / max(1, steps))))
        for group in opt.param_groups:
            group["lr"] = args.lr * warm * (0.1 + 0.9 * cos)
        if isinstance(data, Packed):
            tok_b, feat_b = data.batch(idx, t_len)
        else:
            tok_b, feat_b = tokens[idx, :t_len], feats[idx, :t_len]
        if args.feature_noise > 0:
            feat_b = noisy_features(feat_b, len(model.config.target_layer_ids), args.feature_noise, gen)
        with amp:
            loss, accepted = block_loss(model, target, tok_b, feat_b, prompt_len[idx], seq_len[idx], anchors,
                                        args.loss_decay, args.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step + 1 == steps:
            log(f"step {step}/{steps} loss {loss.item():.3f} offline acceptance length {1 + accepted.float().mean().item():.2f} "
                f"({time.time() - t_start:.0f} s)")
        step += 1
        if evaluate is not None and args.eval_every and step % args.eval_every == 0 and step < steps:
            model.eval()
            log(f"step {step}: {evaluate()}")
            model.train()
    args.steps_done, args.train_seconds_done = step, time.time() - t_start


@torch.no_grad()
def offline_acceptance(model, target, data, per_seq: int = 64, seed: int = 1) -> float:
    """1 + the mean count of leading drafts equal to the target's greedy tokens, over
    random anchors of the held-out continuations."""
    tokens, feats, prompt_len, seq_len = data
    gen = torch.Generator(device=tokens.device).manual_seed(seed)
    accepted = []
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if tokens.device.type == "cuda" else torch.autocast("cpu", enabled=False)
    for b0 in range(0, tokens.shape[0], 16):
        sl = slice(b0, b0 + 16)
        anchors = sample_anchors(prompt_len[sl], seq_len[sl], per_seq, gen)
        with amp:
            _, acc = block_loss(model, target, tokens[sl], feats[sl], prompt_len[sl], seq_len[sl], anchors, 4.0)
        accepted.append(acc.flatten())
    return 1.0 + torch.cat(accepted).float().mean().item()


@torch.no_grad()
def walked_acceptance(model, target, data, max_new: int) -> float:
    """The acceptance length the engine measures (greedy, B-1 drafts a round, no
    adaptation), from the accepted count at EVERY anchor: walk each continuation as the
    engine does, a round at the first generated token, the next one accepted + 1 later,
    the drafts capped by what max_new still allows. Uniform anchors (offline_acceptance)
    weigh every position alike; rounds land more often where drafts fail (an easy stretch
    is crossed in few rounds), so this is lower."""
    tokens, feats, prompt_len, seq_len = data
    B = model.config.block_size
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if tokens.device.type == "cuda" else torch.autocast("cpu", enabled=False)
    rounds = accepted = 0
    for i in range(tokens.shape[0]):
        p0, s = int(prompt_len[i]), int(seq_len[i])
        if s - 1 <= p0:
            continue
        anchors = torch.arange(p0, s - 1, device=tokens.device)[None]
        with amp:
            _, acc = block_loss(model, target, tokens[i : i + 1, :s], feats[i : i + 1, :s], prompt_len[i : i + 1],
                                seq_len[i : i + 1], anchors, 4.0)
        acc = acc[0].tolist()
        p, out = p0, 1  # the first token comes from the prefill
        while p < s - 1 and out < max_new:
            g = min(B - 1, max_new - out - 1)
            if g <= 0:
                break
            a = min(acc[p - p0], g)
            rounds, accepted = rounds + 1, accepted + a
            p, out = p + a + 1, out + a + 1
    return 1.0 + accepted / max(1, rounds)


def generated(data) -> torch.Tensor:
    if isinstance(data, Packed):
        own = torch.repeat_interleave(data.off, data.seq_len)  # each row's sequence start
        first = own + torch.repeat_interleave(data.prompt_len, data.seq_len)
        return data.tokens[torch.arange(data.tokens.shape[0], device=data.tokens.device) >= first]
    tokens, _, prompt_len, seq_len = data
    pos = torch.arange(tokens.shape[1], device=tokens.device)[None]
    return tokens[(pos >= prompt_len[:, None]) & (pos < seq_len[:, None])]


def draft_vocab_of(data, vocab_size: int, coverage: float) -> torch.Tensor:
    """The most frequent generated tokens that cover `coverage` of them, rounded up to a
    multiple of 256, sorted by id."""
    counts = torch.bincount(generated(data), minlength=vocab_size).float()
    order = counts.argsort(descending=True)
    share = counts[order].cumsum(0) / counts.sum()
    size = min(vocab_size, -(-(int((share < coverage).sum()) + 1) // 256) * 256)
    return order[:size].sort().values


def draft_vocab_top(data, vocab_size: int, size: int) -> torch.Tensor:
    """The `size` most frequent generated tokens, sorted by id."""
    counts = torch.bincount(generated(data), minlength=vocab_size)
    return counts.argsort(descending=True)[:size].sort().values


def in_vocab_share(vocab: torch.Tensor, data) -> float:
    toks = generated(data)
    return torch.isin(toks, vocab.to(toks.device)).float().mean().item()


def engine_acceptance(args, checkpoint: str, prompts: list[str], log) -> dict:
    """The engine's own numbers on held-out prompts: greedy, B-1 drafts every round."""
    from tandem.config import EngineConfig
    from tandem.engine import Engine
    from tandem.sampling_params import SamplingParams

    # no prefix cache for either: DFlash runs without one (it drafts from the target's rows
    # of the whole prompt), so both prefill their prompts alike
    # float32: bf16 verify batches of another shape than no-spec's may round close calls the other way
    common = dict(model=args.model, device=args.device, dtype="float32", max_num_seqs=min(64, len(prompts)),
                  max_model_len=1024, row_budget=1024, adaptive=False, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=args.gen_tokens)
    result = {}
    for drafter in ("none", "dflash") if args.engine_baseline else ("dflash",):
        engine = Engine.from_config(EngineConfig(drafter=drafter, dflash_checkpoint=checkpoint,
                                                 num_speculative_tokens=args.block_size - 1, **common), progress=False)
        t0 = time.time()
        outs = engine.generate([engine.chat_prompt([{"role": "user", "content": p}]) for p in prompts], params)
        secs = time.time() - t0
        engine.close()
        result[drafter] = outs
        drafts = sum(o.num_drafts for o in outs)
        acc = sum(o.num_accepted_tokens for o in outs)
        log(f"engine {drafter}: {sum(len(o.token_ids) for o in outs)} tokens in {secs:.1f} s"
            + (f", acceptance length {1 + acc / max(1, drafts):.3f} over {drafts} rounds" if drafts else ""))
    same = sum(a.token_ids == b.token_ids for a, b in zip(result["none"], result["dflash"])) if "none" in result else None
    drafts = sum(o.num_drafts for o in result["dflash"])
    acc = sum(o.num_accepted_tokens for o in result["dflash"])
    return {"acceptance_length": 1 + acc / max(1, drafts), "rounds": drafts, "identical_outputs": same,
            "prompts": len(prompts)}


# ---- main -------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="target model spec (default: the default model)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", required=True, help="checkpoint folder to write")
    ap.add_argument("--num-prompts", type=int, default=10000, help="template prompts")
    ap.add_argument("--num-self-prompts", type=int, default=0, help="also prompts the target writes itself")
    ap.add_argument("--modifiers", action="store_true", help="end most template prompts with a style request")
    ap.add_argument("--num-eval", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=256)
    ap.add_argument("--gen-batch", type=int, default=1024)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--intermediate-size", type=int, default=768)
    ap.add_argument("--target-layers", type=int, default=5, help="how many target layers the drafter reads")
    ap.add_argument("--mask-token", default="<empty_output>", help="a special token never seen in chats")
    ap.add_argument("--batch", type=int, default=96, help="sequences per step")
    ap.add_argument("--blocks-per-seq", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--loss-decay", type=float, default=4.0)
    ap.add_argument("--max-steps", type=int, default=20000)
    ap.add_argument("--train-seconds", type=float, default=220.0)
    ap.add_argument("--total-seconds", type=float, default=None, help="cut training so the whole run fits this")
    ap.add_argument("--draft-vocab-coverage", type=float, default=0.999,
                    help="draft only the most frequent generated tokens covering this share (1 = the whole vocabulary); "
                         "the head is then that many rows, in training and in the engine")
    ap.add_argument("--log-every", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-engine-eval", action="store_true")
    ap.add_argument("--engine-baseline", action="store_true", help="also run the engine without drafts and compare outputs")
    ap.add_argument("--extra-prompts", type=int, default=0,
                    help="also this many training-only prompts from EXTRA_SUBJECTS/EXTRA_TEMPLATES (held-out prompts unchanged)")
    ap.add_argument("--save-tokens", default=None, metavar="DIR",
                    help="only generate: the training prompts' greedy continuations (tokens, no features), shuffled, "
                         "in chunks of --gen-batch saved under DIR until --gen-seconds have passed; then exit")
    ap.add_argument("--gen-seconds", type=float, default=1e9, help="with --save-tokens: start no chunk after this")
    ap.add_argument("--load-tokens", default=None, metavar="DIR",
                    help="train on the continuations --save-tokens wrote (features rebuilt by one prefill a sequence)")
    ap.add_argument("--max-train-rows", type=int, default=None, help="with --load-tokens: at most this many positions")
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--dropout", type=float, default=0.0, help="dropout on the drafter's residual branches (training only)")
    ap.add_argument("--feature-noise", type=float, default=0.0,
                    help="Gaussian noise on the target features in training, times each layer row's RMS")
    ap.add_argument("--label-smoothing", type=float, default=0.0)
    ap.add_argument("--eval-every", type=int, default=0, help="held-out offline/walked acceptance every this many steps")
    ap.add_argument("--data-seed", type=int, default=None,
                    help="seed of the extra and self-written prompts and of the chunk order (default --seed); the "
                         "held-out prompts follow --seed alone, so a new corpus keeps the same held-out set")
    ap.add_argument("--shard", default="0/1", metavar="I/N",
                    help="with --save-tokens: generate only chunks I, I+N, ... (N processes, one a GPU, one folder); "
                         "with --load-tokens: train only on those chunks")
    ap.add_argument("--init-from", default=None, metavar="DIR",
                    help="start from this checkpoint (its architecture and draft vocabulary) instead of random weights")
    ap.add_argument("--general-prompts", type=int, default=0,
                    help="also this many general prompts (scripts/dflash_general_prompts.py: eight kinds of chat request "
                         "and raw completions of the installed packages' text), decontaminated against the eval set")
    ap.add_argument("--max-template-prompts", type=int, default=None,
                    help="train on at most this many of the template and extra prompts (a seeded sample; the held-out "
                         "set is unchanged)")
    ap.add_argument("--sample-share", type=float, default=0.0,
                    help="share of the training prompts whose continuation is sampled (--temperature, --top-k) "
                         "instead of greedy")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--train-gen-tokens", type=int, default=None, help="continuation length of the training data "
                    "(default --gen-tokens; the held-out continuations keep --gen-tokens)")
    ap.add_argument("--one-call", action="store_true",
                    help="generate the tokens alone (prompts of any length, chunked by length, until --gen-seconds), then "
                         "rebuild the features by prefill and train, all in this process; with --save-tokens DIR, "
                         "save the tokens there and exit instead (a later call trains on them with --load-tokens DIR)")
    ap.add_argument("--pos-budget", type=int, default=1_200_000,
                    help="with --one-call: at most this many positions (batch x longest sequence) a generation chunk")
    ap.add_argument("--max-prompt-tokens", type=int, default=900, help="drop longer training prompts")
    ap.add_argument("--draft-vocab-size", type=int, default=None,
                    help="with --revocab: the draft vocabulary is this corpus's N most frequent generated tokens "
                         "(instead of --draft-vocab-coverage with the old rows kept)")
    ap.add_argument("--revocab", action="store_true",
                    help="with --init-from: a new draft vocabulary from this corpus (--draft-vocab-coverage); the "
                         "weights do not depend on it (the head is the target's)")
    args = ap.parse_args(argv)
    data_seed = args.seed if args.data_seed is None else args.data_seed
    shard = tuple(int(x) for x in args.shard.split("/"))
    if len(shard) != 2 or not 0 <= shard[0] < shard[1]:
        ap.error(f"--shard {args.shard!r}: want I/N with 0 <= I < N")

    t_begin = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t_begin:6.1f}s] {msg}", flush=True)

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = load_model(args.model, dtype=dtype, device=device, progress=False)
    tc = target.config
    log(f"target {target.name}: {tc.num_layers} layers, hidden {tc.hidden_size}, vocab {tc.vocab_size}")
    tok = target.tokenizer
    mask_id = tok.convert_tokens_to_ids(args.mask_token)
    layer_ids = spread_layer_ids(tc.num_layers, args.target_layers)

    train_prompts, eval_prompts = make_prompts(args.num_prompts, args.num_eval, args.seed, args.modifiers)
    if args.extra_prompts:
        extra = make_extra_prompts(args.extra_prompts, args.seed, avoid=frozenset(train_prompts) | frozenset(eval_prompts),
                                   sample_seed=data_seed)
        log(f"{len(extra)} extra training prompts, e.g. {extra[:3]}")
        train_prompts = train_prompts + extra
    if args.max_template_prompts is not None and len(train_prompts) > args.max_template_prompts:
        train_prompts = random.Random(data_seed + 23).sample(train_prompts, args.max_template_prompts)
    log(f"{len(train_prompts)} training prompts, {len(eval_prompts)} held-out; e.g. {train_prompts[:3]} / {eval_prompts[:2]}")
    eos = set(target.eos_token_ids)
    train_gen = args.train_gen_tokens or args.gen_tokens
    if args.one_call:
        from dflash_general_prompts import decontaminate, general_prompts

        prompt_ids = [chat_ids(tok, p) for p in train_prompts]
        kinds = ["template"] * len(prompt_ids)
        texts = list(train_prompts)
        if args.general_prompts:
            t0 = time.time()
            general = general_prompts(args.general_prompts, args.seed, sample_seed=data_seed)
            for g in general:
                if g["mode"] == "raw":
                    prompt_ids.append(tok(g["text"]).input_ids)
                else:
                    prompt_ids.append(tok(tok.apply_chat_template(g["messages"], tokenize=False,
                                                                  add_generation_prompt=True)).input_ids)
                kinds.append(g["kind"])
                texts.append(g["text"])
            log(f"{len(general)} general prompts in {time.time() - t0:.1f} s, e.g. {[g['text'][:80] for g in general[:4]]}")
        if args.num_self_prompts:
            own = self_sampled_prompts(target.model, tok, args.num_self_prompts, args.gen_batch, seed=data_seed)
            log(f"{len(own)} self-written prompts, e.g. {[tok.decode(p) for p in own[:3]]}")
            prompt_ids += own
            kinds += ["self"] * len(own)
            texts += [tok.decode(p) for p in own]
        keep = [ok and len(p) <= args.max_prompt_tokens for ok, p in zip(decontaminate(texts), prompt_ids)]
        log(f"decontamination and length: {keep.count(False)} of {len(keep)} prompts dropped")
        prompt_ids = [p for p, k in zip(prompt_ids, keep) if k]
        kinds = [c for c, k in zip(kinds, keep) if k]
        rs = random.Random(data_seed + 29)
        sample = [rs.random() < args.sample_share for _ in prompt_ids]
        packed, done = generate_packed(target.model, prompt_ids, sample, train_gen, args.gen_batch, args.pos_budget, eos,
                                       t_begin + args.gen_seconds, args.temperature, args.top_k, data_seed, log)
        if args.max_train_rows and packed.tokens.shape[0] > args.max_train_rows:
            n = int((torch.cumsum(packed.seq_len, 0) <= args.max_train_rows).sum())
            keep_rows = int(packed.seq_len[:n].sum())
            packed = Packed(packed.tokens[:keep_rows], None, packed.off[:n], packed.prompt_len[:n], packed.seq_len[:n])
            done = done[:n]
        train_data = packed
        n_prompts = train_data.n
        gen_tokens = int((train_data.seq_len - train_data.prompt_len).sum())
        n_self = sum(kinds[i] == "self" for i in done)
        per_kind = {}
        gen_per = (train_data.seq_len - train_data.prompt_len).tolist()
        plen = train_data.prompt_len.tolist()
        for j, i in enumerate(done):
            c = per_kind.setdefault(kinds[i], [0, 0, 0, 0])
            c[0] += 1
            c[1] += gen_per[j]
            c[2] += plen[j]
            c[3] += sample[i]
        args.data_kinds = {k: {"prompts": v[0], "generated_tokens": v[1], "prompt_tokens": v[2], "sampled": v[3]}
                           for k, v in sorted(per_kind.items())}
        if args.save_tokens:  # the corpus for a later call's --load-tokens (a call cannot hold generation and training)
            os.makedirs(args.save_tokens, exist_ok=True)
            save_token_chunk(os.path.join(args.save_tokens, "chunk0000.pt"),
                             (train_data.tokens, None, train_data.prompt_len, train_data.seq_len),
                             [kinds[i] == "self" for i in done], packed=True)
            meta = {"prompts": n_prompts, "generated_tokens": gen_tokens, "self_written_prompts": n_self,
                    "train_gen_tokens": train_gen, "data_kinds": args.data_kinds}
            with open(os.path.join(args.save_tokens, "corpus.json"), "w") as f:
                json.dump(meta, f)
            log(f"saved {n_prompts} continuations ({train_data.tokens.shape[0]} rows) to {args.save_tokens}")
            print(json.dumps(meta), flush=True)
            return 0
        prefill_features(target.model, train_data, layer_ids)
        if device.type == "cuda":
            torch.cuda.synchronize()
        log(f"data: features of {train_data.tokens.shape[0]} rows rebuilt; {gen_tokens} generated tokens from {n_prompts} "
            f"prompts; per kind {args.data_kinds}")
    elif args.load_tokens:
        train_data = load_token_chunks(args.load_tokens, device, args.max_train_rows, shard)
        n_prompts = train_data.n
        log(f"loaded {n_prompts} continuations, {train_data.tokens.shape[0]} rows")
        corpus = os.path.join(args.load_tokens, "corpus.json")
        if os.path.exists(corpus):  # a --one-call corpus: what went in, per kind
            with open(corpus) as f:
                meta = json.load(f)
            args.data_kinds, train_gen = meta["data_kinds"], meta["train_gen_tokens"]
        prefill_features(target.model, train_data, layer_ids)
        if device.type == "cuda":
            torch.cuda.synchronize()
        gen_tokens = int((train_data.seq_len - train_data.prompt_len).sum())
        log(f"data: features of {train_data.tokens.shape[0]} rows rebuilt; {gen_tokens} generated tokens "
            f"({gen_tokens / n_prompts:.0f} per prompt)")
        n_self = None if train_data.self_written is None else int(train_data.self_written.sum())
    else:
        prompt_ids = [chat_ids(tok, p) for p in train_prompts]
        if args.num_self_prompts:
            own = self_sampled_prompts(target.model, tok, args.num_self_prompts, args.gen_batch, seed=data_seed)
            log(f"{len(own)} self-written prompts, e.g. {[tok.decode(p) for p in own[:3]]}")
            prompt_ids += own
        n_prompts, n_self = len(prompt_ids), len(prompt_ids) - len(train_prompts)
        if args.save_tokens:
            order = list(range(len(prompt_ids)))
            random.Random(data_seed + 11).shuffle(order)
            os.makedirs(args.save_tokens, exist_ok=True)
            done = rows = 0
            last = 0.0
            for k, c0 in enumerate(range(0, len(order), args.gen_batch)):
                if k % shard[1] != shard[0]:
                    continue
                if time.time() - t_begin + last > args.gen_seconds:
                    break
                t0 = time.time()
                chunk = [prompt_ids[i] for i in order[c0 : c0 + args.gen_batch]]
                data = greedy_with_features(target.model, chunk, (), args.gen_tokens, args.gen_batch, eos, features=False)
                save_token_chunk(os.path.join(args.save_tokens, f"chunk{k:04d}.pt"), data,
                                 [i >= len(train_prompts) for i in order[c0 : c0 + args.gen_batch]])
                done, rows = done + len(chunk), rows + int((data[3] - data[2]).sum())
                last = time.time() - t0
                log(f"chunk {k}: {len(chunk)} prompts in {last:.1f} s; {done} prompts, {rows} generated tokens so far")
            print(json.dumps({"saved_prompts": done, "generated_tokens": rows, "self_written_prompts": n_self}), flush=True)
            return 0
        train_data = greedy_with_features(target.model, prompt_ids, layer_ids, args.gen_tokens, args.gen_batch, eos)
        gen_tokens = int((train_data[3] - train_data[2]).sum())
        log(f"data: {gen_tokens} generated tokens ({gen_tokens / len(prompt_ids):.0f} per prompt); "
            f"sample: {tok.decode(train_data[0][0, int(train_data[2][0]) : int(train_data[3][0])].tolist())[:200]!r}")
    eval_data = greedy_with_features(target.model, [chat_ids(tok, p) for p in eval_prompts], layer_ids,
                                     args.gen_tokens, args.gen_batch, eos)

    config = DFlashConfig(
        hidden_size=tc.hidden_size, num_layers=args.layers, num_heads=tc.num_heads, num_kv_heads=tc.num_kv_heads,
        head_dim=tc.head_dim, intermediate_size=args.intermediate_size, vocab_size=tc.vocab_size,
        target_layer_ids=layer_ids, block_size=args.block_size, mask_token_id=mask_id, num_target_layers=tc.num_layers,
        rms_norm_eps=tc.rms_norm_eps, rope_theta=tc.rope_theta, max_position_embeddings=tc.max_position_embeddings,
    )
    if args.init_from:  # its architecture and draft vocabulary; the flags that shape a new drafter are ignored
        model = load_dflash_checkpoint(args.init_from, device=device).requires_grad_(True)
        config = model.config
        if config.target_layer_ids != layer_ids or config.mask_token_id != mask_id:
            log(f"note: {args.init_from} reads layers {config.target_layer_ids}, mask {config.mask_token_id}")
        vocab = model.draft_vocab if config.draft_vocab_size else None
        if vocab is not None:
            log(f"draft vocabulary of {args.init_from}: covers {in_vocab_share(vocab, train_data):.4f} of this corpus")
        if args.revocab and args.draft_vocab_size:  # other rows, the same head cost in the engine
            new_vocab = draft_vocab_top(train_data, tc.vocab_size, args.draft_vocab_size)
            old_n = 0 if vocab is None else vocab.numel()
        elif args.revocab and args.draft_vocab_coverage < 1:
            new_vocab = draft_vocab_of(train_data, tc.vocab_size, args.draft_vocab_coverage)
            old_n = 0 if vocab is None else vocab.numel()
            if vocab is not None:  # keep every old row too: the held-out families keep their drafts
                new_vocab = torch.unique(torch.cat([new_vocab.to(device), vocab.to(device)]))
        if args.revocab and (args.draft_vocab_size or args.draft_vocab_coverage < 1):
            state = {k: v for k, v in model.state_dict().items() if k != "draft_vocab"}
            config = replace(config, draft_vocab_size=int(new_vocab.numel()))
            model = DFlashDraftModel(config).to(device)
            missing, unexpected = model.load_state_dict(state, strict=False)
            assert set(missing) <= {"draft_vocab"} and not unexpected, (missing, unexpected)
            model.draft_vocab.copy_(new_vocab)
            model.requires_grad_(True)
            vocab = model.draft_vocab
            log(f"new draft vocabulary: {old_n} -> {vocab.numel()} tokens, covering {in_vocab_share(vocab, train_data):.4f} "
                f"of this corpus")
        log(f"init from {args.init_from}: {config.num_layers} layers, draft vocabulary "
            f"{config.draft_vocab_size or config.vocab_size}")
    else:
        vocab = None
        if args.draft_vocab_coverage < 1:  # trained with the head it will draft with
            vocab = draft_vocab_of(train_data, tc.vocab_size, args.draft_vocab_coverage)
            config = replace(config, draft_vocab_size=int(vocab.numel()))
        model = DFlashDraftModel(config).init_weights(args.seed).to(device)
        if vocab is not None:
            model.draft_vocab.copy_(vocab)
        with torch.no_grad():  # start from the target's output scale: the head is the target's
            model.norm.weight.copy_(target.model.model.norm.weight.float())
    if vocab is not None:
        log(f"draft vocabulary: {vocab.numel()} tokens, covering {in_vocab_share(vocab, eval_data):.4f} of the held-out tokens")
    log(f"drafter: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, layers {layer_ids}, mask {args.mask_token}={mask_id}")
    if args.dropout > 0:
        add_dropout(model, args.dropout)
    if args.total_seconds:
        args.train_seconds = max(10.0, min(args.train_seconds, args.total_seconds - (time.time() - t_begin) - 40))

    def evaluate() -> str:
        return (f"held-out offline {offline_acceptance(model, target.model, eval_data):.3f}, "
                f"walked {walked_acceptance(model, target.model, eval_data, args.gen_tokens):.3f}")

    if args.eval_every and args.init_from:  # where a warm start begins
        model.eval()
        log(f"step 0 (init): {evaluate()}")
        model.train()
    train(model, target.model, train_data, args, log, evaluate)
    del train_data  # the engine check below needs none of it (a large corpus holds most of the GPU)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    model.eval()
    offline = offline_acceptance(model, target.model, eval_data)
    walked = walked_acceptance(model, target.model, eval_data, args.gen_tokens)
    log(f"held-out offline acceptance length (block {args.block_size}): {offline:.3f} over uniform anchors, "
        f"{walked:.3f} walked as the engine's rounds")
    # bench/dflash_speedup.py's prompts: written apart from the templates, so they show how
    # far the drafter carries beyond the training prompts' style
    bench_data = greedy_with_features(target.model, [chat_ids(tok, p) for p in bench_prompts()], layer_ids,
                                      args.gen_tokens, args.gen_batch, eos)
    bench_walked = walked_acceptance(model, target.model, bench_data, args.gen_tokens)
    log(f"bench prompts: {bench_walked:.3f} walked")
    info = {"target_model": target.name, "train": {
        "prompts": n_prompts, "self_written_prompts": n_self, "generated_tokens": gen_tokens, "gen_tokens": args.gen_tokens,
        "layers": args.layers, "batch": args.batch, "blocks_per_seq": args.blocks_per_seq, "steps": args.steps_done,
        "train_seconds": round(args.train_seconds_done), "seconds": round(time.time() - t_begin),
        "heldout_offline_acceptance_length": round(offline, 3), "heldout_walked_acceptance_length": round(walked, 3),
        "bench_prompts_walked_acceptance_length": round(bench_walked, 3),
        "script": "scripts/train_dflash.py", "seed": args.seed}}
    if getattr(args, "data_kinds", None):
        info["train"]["data_kinds"] = args.data_kinds
        info["train"]["train_gen_tokens"] = train_gen
    for name in ("general_prompts", "max_template_prompts", "sample_share", "temperature", "revocab",
                 "draft_vocab_size", "extra_prompts", "weight_decay", "dropout", "feature_noise", "label_smoothing", "lr", "data_seed",
                 "init_from", "shard"):  # non-defaults only
        if getattr(args, name) != ap.get_default(name):
            info["train"][name] = getattr(args, name)
    if args.init_from:  # a warm start keeps the history of the weights it started from
        with open(os.path.join(args.init_from, "config.json")) as f:
            before = json.load(f).get("tandem", {})
        if "train" in before:
            info["previous_train"] = before["train"]
    save_dflash_checkpoint(model, args.out, extra_config={"tandem": info})
    log(f"saved {args.out}")
    if not args.skip_engine_eval:
        res = engine_acceptance(args, args.out, eval_prompts, log)
        log(f"held-out engine acceptance length (block {args.block_size}, greedy): {res['acceptance_length']:.3f}"
            + (f"; {res['identical_outputs']}/{res['prompts']} outputs identical to no-spec" if args.engine_baseline else ""))
        info["train"]["heldout_engine"] = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()}
        save_dflash_checkpoint(model, args.out, extra_config={"tandem": info})
    print(json.dumps(info), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
