"""How many sequences of 2,000 tokens the default server runs at once in a fixed KV memory
budget, against what a slot layout (every sequence reserving max_model_len positions)
could hold in the same budget.

    python bench/kv_capacity.py [--budget-gb 2] [--tokens 2000] [--requests 48]

The engine (the default model on the CPU, its default KV budget unless --budget-gb) gets
--requests requests of --tokens tokens (prompt + max_tokens) at once, with more slots than
it can fill (max_num_seqs 256), so KV memory alone limits how many run; the count is the
most that ran at once. The slot layout's count is the budget over max_model_len positions
of KV a sequence (the model's context, what a slot had to reserve to serve it). Prints a
table, then one JSON line.
"""
from __future__ import annotations

import argparse

from common import json_line, machine, print_table, setup_torch, warn_if_busy


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget-gb", type=float, default=None, help="KV budget (default: the server's own)")
    p.add_argument("--tokens", type=int, default=2000, help="prompt + max_tokens of each request")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    threads = setup_torch(args.threads)
    warn_if_busy()
    from tandem.config import EngineConfig
    from tandem.engine import Engine
    from tandem.model.kv_cache import PagedKVCache
    from tandem.sampling_params import SamplingParams

    engine = Engine.from_config(EngineConfig(drafter="none", max_num_seqs=256, kv_cache_memory_gb=args.budget_gb,
                                             device="cpu"), progress=False)
    limits, c = engine.group.limits, engine.group.shard.model.config
    per_token = PagedKVCache.bytes_per_block(c.num_layers, 1, c.num_kv_heads, c.head_dim, engine.group.shard.model.dtype)
    budget = limits.num_blocks * limits.block_size * per_token
    prompt_len = args.tokens - args.max_tokens
    for i in range(args.requests):  # distinct prompts: no prefix is shared
        engine.add_request([(7 * i + j) % 1000 + 10 for j in range(prompt_len)], SamplingParams(max_tokens=args.max_tokens))
    most = 0
    while engine.has_unfinished():
        engine.step()
        most = max(most, len(engine.scheduler.running))
    slots = budget // (limits.max_model_len * per_token)
    print_table(["layout", "KV budget GiB", "positions a sequence reserves", f"sequences of {args.tokens} at once"],
                [["slots (max_model_len each)", budget / (1 << 30), limits.max_model_len, slots],
                 [f"blocks of {limits.block_size}", budget / (1 << 30), f"{args.tokens} (rounded up to blocks)", most]],
                title=f"KV capacity, default model on the CPU, {threads} threads")
    ratio = most / max(slots, 1)
    print(f"paged / slots: {ratio:.1f}x (target >= 3x)")
    json_line({"bench": "kv_capacity", "tokens": args.tokens, "budget_gib": budget / (1 << 30),
               "max_model_len": limits.max_model_len, "paged": most, "slots": slots, "ratio": ratio,
               "machine": machine()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
