"""One decode / verify attention call on the CPU, three ways: the paged kernel reading
blocks through the block table, SDPA reading a slot cache ([n, hkv, L, d], in place)
that the paged cache replaces, and the reference (gather the blocks, then SDPA).

    python bench/paged_attention_cpu.py [--ns 1,32] [--ks 1,5] [--contexts 512,2048] [--reps 7] [--threads 2]

SmolLM2-135M's attention shapes by default (hq=9, hkv=3, d=64, float32), block size 16,
the blocks of the pool handed out in a random order. Both SDPA paths build the same
boolean causal mask as the reference, inside the timed call. Prints a table, then one
JSON line: {"ms": {"paged_n32_k5_c2048": ...}, "paged_over_slot": {"n32_k5_c2048": ...}}.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from common import interleaved_min, json_line, machine, print_table, setup_torch, warn_if_busy


def slot_attention(q, keys, values, start_pos):
    """The slot layout's attention: SDPA over [n, hkv, L, d] views of the cache, read in place."""
    n, k, hq, d = q.shape
    hkv, L = keys.shape[1], keys.shape[2]
    g = hq // hkv
    pos = start_pos.long()[:, None] + torch.arange(k)
    allowed = torch.arange(L) <= pos[:, :, None]
    mask = allowed[:, None, None].expand(n, 1, g, k, L).reshape(n, 1, g * k, L)
    qf = q.view(n, k, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(n, hkv, g * k, d)
    out = F.scaled_dot_product_attention(qf, keys, values, attn_mask=mask)
    return out.view(n, hkv, g, k, d).permute(0, 3, 1, 2, 4).reshape(n, k, hq, d)


def case(n, k, context, hq, hkv, d, bs, dtype, gen):
    """Inputs of one call: every sequence holds `context` tokens before its k new rows."""
    L = context + k
    per_seq = -(-L // bs)
    q = torch.randn(n, k, hq, d, generator=gen).to(dtype)
    slot_k = torch.randn(n, hkv, L + bs, d, generator=gen).to(dtype)  # a slot holds more than it uses
    slot_v = torch.randn(n, hkv, L + bs, d, generator=gen).to(dtype)
    k_cache = torch.randn(n * per_seq, hkv, bs, d, generator=gen).to(dtype)
    v_cache = torch.randn(n * per_seq, hkv, bs, d, generator=gen).to(dtype)
    tables = torch.randperm(n * per_seq, generator=gen).view(n, per_seq).to(torch.int32)
    start = torch.full((n,), context, dtype=torch.int32)
    return q, (slot_k[:, :, :L], slot_v[:, :, :L]), (k_cache, v_cache, tables, start)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ns", default="1,32", help="sequences per call, comma-separated")
    p.add_argument("--ks", default="1,5", help="rows per sequence (1 = decode, more = verify), comma-separated")
    p.add_argument("--contexts", default="512,2048", help="tokens already cached per sequence, comma-separated")
    p.add_argument("--heads", default="9,3,64", help="hq,hkv,d (default SmolLM2-135M's)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    threads = setup_torch(args.threads)
    warn_if_busy()
    from tandem.model.paged_attention import paged_attention_reference
    from tandem.model.paged_attention_cpu import load_kernel, paged_attention_cpu

    if load_kernel() is None:
        raise SystemExit("the paged attention CPU kernel could not be built (see the warning above)")
    hq, hkv, d = (int(x) for x in args.heads.split(","))
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    ms, ratio, rows = {}, {}, []
    for n in (int(x) for x in args.ns.split(",")):
        for k in (int(x) for x in args.ks.split(",")):
            for c in (int(x) for x in args.contexts.split(",")):
                q, (sk, sv), paged = case(n, k, c, hq, hkv, d, args.block_size, dtype, gen)
                t = interleaved_min({
                    "paged": lambda: paged_attention_cpu(q, *paged),
                    "slot": lambda: slot_attention(q, sk, sv, paged[3]),
                    "reference": lambda: paged_attention_reference(q, *paged),
                }, args.reps)
                key = f"n{n}_k{k}_c{c}"
                for name, sec in t.items():
                    ms[f"{name}_{key}"] = 1000 * sec
                ratio[key] = t["paged"] / t["slot"]
                rows.append([n, k, c, 1000 * t["paged"], 1000 * t["slot"], 1000 * t["reference"], ratio[key],
                             t["reference"] / t["paged"]])
    print_table(["n", "k", "context", "paged ms", "slot ms", "reference ms", "paged / slot", "reference / paged"],
                rows, title=f"one attention call, hq={hq} hkv={hkv} d={d} {args.dtype}, block size "
                            f"{args.block_size}, {threads} threads")
    json_line({"heads": [hq, hkv, d], "dtype": args.dtype, "block_size": args.block_size, "ms": ms,
               "paged_over_slot": ratio, "machine": machine()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
