"""Quantized weights on the CPU: the default model's engine with float32, int8 and int4
linear layers, with and without n-gram speculation, at batch 1 and 8, in turns.

    python bench/cpu_quantized.py [--methods none,int8,int4] [--batches 1,8] [--max-tokens 48]
                                  [--repeats 3] [--threads 2]

Each method's rank is built as `quantization` asks from one float32 load; then, for each
repeat, batch and drafter, every method generates the same requests in turn (greedy,
ignore_eos, so each makes exactly max_tokens tokens): tokens/s is the best repeat's.
Prints a table, then one JSON line with each method's tokens/s over float32's.
"""
from __future__ import annotations

import argparse
import time

from common import json_line, machine, print_table, setup_torch

PROMPTS = ["Write a short story about a dragon who", "List ten fruits and their colours:", "def quicksort(items):",
           "The history of Rome begins", "Explain how a bicycle works.", "Translate to French: good morning",
           "Here is a recipe for bread:", "SELECT name FROM users WHERE"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default="none,int8,int4")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--drafters", default="none,ngram")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    threads = setup_torch(args.threads)
    from tandem.config import EngineConfig
    from tandem.engine import Engine
    from tandem.model.loader import load_model
    from tandem.sampling_params import SamplingParams
    from tandem.shard.factory import ShardSpec, build_model_shard
    from tandem.shard.local_group import LocalShardGroup

    methods, batches, drafters = args.methods.split(","), [int(b) for b in args.batches.split(",")], args.drafters.split(",")
    loaded = load_model(progress=False)
    groups = {}
    for m in methods:
        shard, _ = build_model_shard(ShardSpec(device="cpu", dtype="float32" if m == "none" else "auto",
                                               quantization=m, num_slots=max(batches), max_model_len=512,
                                               row_budget=64), loaded=loaded, progress=False)
        groups[m] = LocalShardGroup(shard)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    best: dict[tuple, float] = {}
    for _ in range(args.repeats):
        for b in batches:
            for d in drafters:
                for m in methods:
                    config = EngineConfig(drafter=d, max_num_seqs=max(batches), max_model_len=512, row_budget=64)
                    engine = Engine(groups[m], loaded.tokenizer, loaded.eos_token_ids, config)
                    t = time.perf_counter()
                    outs = engine.generate(PROMPTS[:b], params)
                    rate = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t)
                    best[(b, d, m)] = max(best.get((b, d, m), 0.0), rate)
    rows, result = [], {"threads": threads, "max_tokens": args.max_tokens, "machine": machine()}
    for b in batches:
        for d in drafters:
            base = best.get((b, d, "none"))
            for m in methods:
                rate = best[(b, d, m)]
                rows.append([b, d, m, f"{rate:.1f}", f"{rate / base:.2f}x" if base else ""])
                result[f"b{b}_{d}_{m}_tok_s"] = round(rate, 2)
                if base:
                    result[f"b{b}_{d}_{m}_over_float32"] = round(rate / base, 3)
    print_table(["batch", "drafter", "weights", "tokens/s", "vs float32"], rows,
                title=f"default model on the CPU, {threads} threads, {args.max_tokens} tokens, greedy")
    json_line(result)


if __name__ == "__main__":
    main()
