"""The DFlash training corpus (scripts/train_dflash.py): the target's continuations of
prompts with the drafter's target layers captured on the way, packed back to back without
padding, saved and loaded as token chunks, and their features rebuilt by prefill."""
from __future__ import annotations

import os
import random
import time

import torch

from tandem.model.kv_cache import fixed_tables

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

