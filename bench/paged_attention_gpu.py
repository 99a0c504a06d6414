"""One attention call of the target on the GPU: the paged kernel (Triton, block tables)
against a slot layout (SDPA reading each sequence's contiguous slot in
place, with the boolean mask), both captured in CUDA graphs.

    python bench/paged_attention_gpu.py [--n 1,32] [--contexts 512,4096] [--ks 1,5]
        [--heads 32,8] [--head-dim 128] [--block-size 16] [--max-seq-len 8192]
        [--replays 200] [--rounds 5]

Every case is n sequences whose k rows (k=1 decode, k>1 verify) follow a cached prefix of
`context` tokens. Slot: fold the q heads into rows, scaled_dot_product_attention over the
[n, hkv, L, d] view of the cache with the [n, 1, g*k, L] mask, unfold (as the model does;
the mask is built once per forward, outside the timing). Flash: the same without a mask,
FlashAttention's backend, for k=1 only (an offset causal mask is not native to it).
Paged: paged_attention_triton over shuffled blocks, tables as wide as --max-seq-len.

One graph holds the call for several layers' caches (up to 32, enough to outgrow the L2
where a layer's cache is small, as a forward's layers do); the graphs of a case replay in
turns, each --replays times under CUDA events, and the minimum of --rounds is kept, per
call. Prints a table, then one JSON line: {"ms": {"slot_n1_c512_k1": ...}, "ratio":
{"n1_c512_k1": slot / paged}, ...}.
"""
from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F

from common import json_line, machine, print_table

L2_BYTES = 60 << 20  # the H200's L2: caches of all layers together should exceed it a few times
MAX_LAYERS = 32


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def layer_count(n: int, hkv: int, attn_len: int, d: int, itemsize: int) -> int:
    """Layers in one graph: the K/V read by all of them at least 3x the L2, at most 32."""
    per_layer = 2 * n * hkv * attn_len * d * itemsize
    return max(1, min(MAX_LAYERS, math.ceil(3 * L2_BYTES / per_layer)))


def slots_to_pool(slot: torch.Tensor, blocks: torch.Tensor, num_blocks: int, block_size: int) -> torch.Tensor:
    """A slot cache [n, hkv, L, d] copied into a pool [num_blocks, hkv, block_size, d]:
    position t of sequence i goes to row t % block_size of block blocks[i, t // block_size]."""
    n, hkv, length, d = slot.shape
    used = blocks.shape[1]
    padded = F.pad(slot, (0, 0, 0, used * block_size - length))
    pool = torch.zeros(num_blocks, hkv, block_size, d, device=slot.device, dtype=slot.dtype)
    pool[blocks.long()] = padded.view(n, hkv, used, block_size, d).permute(0, 2, 1, 3, 4)
    return pool


def slot_attention(q, keys, values, mask, hkv):
    """The slot layout's attention (the model's): q heads folded into rows, SDPA, unfolded."""
    n, k, hq, d = q.shape
    g = hq // hkv
    qf = q.view(n, k, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(n, hkv, g * k, d)
    out = F.scaled_dot_product_attention(qf, keys, values, attn_mask=mask)
    return out.view(n, hkv, g, k, d).permute(0, 3, 1, 2, 4).reshape(n, k, hq, d)


def flash_attention(q, keys, values, hkv):
    """k = 1 only: every folded row sees the whole context, so no mask is needed."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    n, k, hq, d = q.shape
    qf = q.view(n, k, hkv, hq // hkv, d).permute(0, 2, 3, 1, 4).reshape(n, hkv, hq // hkv * k, d)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(qf, keys, values)
    return out.view(n, hkv, hq // hkv, k, d).permute(0, 3, 1, 2, 4).reshape(n, k, hq, d)


def capture(fn):
    """fn once to compile and warm up, then fn captured in a graph; (graph, fn's output)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def time_graphs(graphs: dict[str, torch.cuda.CUDAGraph], replays: int, rounds: int) -> dict[str, float]:
    """Milliseconds of one replay of each graph: graphs in turns, the min of the rounds."""
    best = {name: float("inf") for name in graphs}
    for graph in graphs.values():  # warm
        graph.replay()
    for _ in range(rounds):
        for name, graph in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            end.synchronize()
            best[name] = min(best[name], start.elapsed_time(end) / replays)
    return best


def run_case(n, context, k, hq, hkv, d, block_size, max_seq_len, replays, rounds, gen):
    from tandem.model.paged_attention_triton import LaunchPlan, device_sm_count, paged_attention_triton

    dtype, dev = torch.bfloat16, "cuda"
    g = hq // hkv
    attn_len = context + k
    layers = layer_count(n, hkv, attn_len, d, 2)
    width = -(-max_seq_len // block_size)
    used = -(-attn_len // block_size)
    assert used <= width, f"context {context} + k {k} does not fit --max-seq-len {max_seq_len}"
    q = torch.randn(n, k, hq, d, device=dev, generator=gen).to(dtype)
    start = torch.full((n,), context, dtype=torch.int32, device=dev)
    pos = start.long()[:, None] + torch.arange(k, device=dev)
    allowed = torch.arange(attn_len, device=dev) <= pos[:, :, None]
    mask = allowed[:, None, None].expand(n, 1, g, k, attn_len).reshape(n, 1, g * k, attn_len)

    slot_k = [torch.randn(n, hkv, attn_len, d, device=dev, generator=gen).to(dtype) for _ in range(layers)]
    slot_v = [torch.randn(n, hkv, attn_len, d, device=dev, generator=gen).to(dtype) for _ in range(layers)]
    # the same contents, in shuffled blocks of a pool: the block of position t of sequence i
    num_blocks = n * used + 1
    perm = torch.randperm(num_blocks, device=dev, generator=gen)[: n * used].view(n, used).to(torch.int32)
    tables = torch.zeros(n, width, dtype=torch.int32, device=dev)
    tables[:, :used] = perm
    pool_k = [slots_to_pool(t, perm, num_blocks, block_size) for t in slot_k]
    pool_v = [slots_to_pool(t, perm, num_blocks, block_size) for t in slot_v]

    def layers_of(call):
        return lambda: [call(i) for i in range(layers)][0]

    fns = {
        "slot": layers_of(lambda i: slot_attention(q, slot_k[i], slot_v[i], mask, hkv)),
        "paged": layers_of(lambda i: paged_attention_triton(q, pool_k[i], pool_v[i], tables, start)),
    }
    if k == 1:
        fns["flash"] = layers_of(lambda i: flash_attention(q, slot_k[i], slot_v[i], hkv))
    captured = {name: capture(fn) for name, fn in fns.items()}
    ms = time_graphs({name: graph for name, (graph, _) in captured.items()}, replays, rounds)
    outs = {name: out for name, (_, out) in captured.items()}
    err = (outs["paged"].float() - outs["slot"].float()).abs().max().item()
    splits = LaunchPlan(n, g * k, hkv, d, dtype, width * block_size, device_sm_count(torch.cuda.current_device())).num_splits
    return {name: t / layers for name, t in ms.items()}, err, splits, layers


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=ints, default=[1, 32], help="sequences, comma-separated")
    p.add_argument("--contexts", type=ints, default=[512, 4096], help="cached prefix lengths")
    p.add_argument("--ks", type=ints, default=[1, 5], help="rows per sequence: 1 decode, >1 verify")
    p.add_argument("--heads", type=ints, default=[32, 8], help="hq,hkv (default: Llama-3.1-8B's)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-seq-len", type=int, default=8192, help="the block tables' width, in tokens")
    p.add_argument("--replays", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    hq, hkv = args.heads
    gen = torch.Generator(device="cuda").manual_seed(0)
    ms, ratio, ratio_flash, splits, rows = {}, {}, {}, {}, []
    for n in args.n:
        for context in args.contexts:
            for k in args.ks:
                case = f"n{n}_c{context}_k{k}"
                t, err, s, layers = run_case(n, context, k, hq, hkv, args.head_dim, args.block_size,
                                             args.max_seq_len, args.replays, args.rounds, gen)
                for name, value in t.items():
                    ms[f"{name}_{case}"] = value
                ratio[case] = t["slot"] / t["paged"]
                if "flash" in t:
                    ratio_flash[case] = t["flash"] / t["paged"]
                splits[case] = s
                rows.append([case, t["slot"], t.get("flash"), t["paged"], s, layers, ratio[case],
                             ratio_flash.get(case), f"{err:.1e}"])
                torch.cuda.empty_cache()
    print_table(["case", "slot ms", "flash ms", "paged ms", "splits", "layers", "slot/paged", "flash/paged",
                 "max |paged - slot|"], rows,
                title=f"one attention call, hq={hq} hkv={hkv} d={args.head_dim} bf16, block_size {args.block_size}, "
                      f"tables {args.max_seq_len} tokens wide (ms per call: graph replay / layers)")
    json_line({"ms": ms, "ratio": ratio, "ratio_flash": ratio_flash, "splits": splits,
               "shape": {"hq": hq, "hkv": hkv, "d": args.head_dim, "block_size": args.block_size,
                         "max_seq_len": args.max_seq_len},
               "worst_ratio": min(ratio.values()), "machine": machine()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
