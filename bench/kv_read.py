"""How the target's attention reads the KV cache: in place (consecutive slots, the
forward's slot_start) against gathering every slot's rows first (index_select), for one
decode forward of n sequences at growing context lengths.

    python bench/kv_read.py [--n 32] [--contexts 128,512,1024] [--reps 5] [--threads 2]

The engine hands its verify batches over in slot order, so a batch whose slots are
consecutive takes the in-place read; others gather. Prints a table, then one JSON line:
{"ms": {"in_place_c512": ..., "gather_c512": ...}, "speedup": {"c512": gather / in place}}.
"""
from __future__ import annotations

import argparse

import torch

from common import interleaved_min, json_line, machine, print_table, setup_torch, warn_if_busy


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model spec (default: the default model, SmolLM2-135M)")
    p.add_argument("--n", type=int, default=32, help="sequences in the forward (one row each)")
    p.add_argument("--contexts", default="128,512,1024", help="tokens already in each slot, comma-separated")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    threads = setup_torch(args.threads)
    warn_if_busy()
    from tandem.model.loader import load_model

    model = load_model(args.model, progress=False).model
    contexts = [int(c) for c in args.contexts.split(",")]
    cache = model.new_cache(num_slots=args.n, max_seq_len=max(contexts) + 1)
    gen = torch.Generator().manual_seed(0)
    for k, v in zip(cache.k, cache.v):  # any content: the timing does not depend on it
        k.normal_(generator=gen)
        v.normal_(generator=gen)
    tokens = torch.randint(0, model.config.vocab_size, (args.n, 1), generator=gen)
    slots = torch.arange(args.n)
    ms, speedup, rows = {}, {}, []
    for c in contexts:
        start = torch.full((args.n,), c)

        def forward(slot_start, start=start, c=c):
            return lambda: model(tokens, slots, start, cache, attn_len=c + 1, slot_start=slot_start)

        t = interleaved_min({"in_place": forward(0), "gather": forward(None)}, args.reps)
        ms[f"in_place_c{c}"], ms[f"gather_c{c}"] = 1000 * t["in_place"], 1000 * t["gather"]
        speedup[f"c{c}"] = t["gather"] / t["in_place"]
        rows.append([c, 1000 * t["in_place"], 1000 * t["gather"], speedup[f"c{c}"]])
    print_table(["context", "in place ms", "gather ms", "gather / in place"], rows,
                title=f"one decode forward of {args.n} sequences, {threads} threads")
    json_line({"n": args.n, "ms": ms, "speedup": speedup, "machine": machine()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
