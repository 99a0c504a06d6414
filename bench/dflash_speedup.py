"""Speculative decoding speed-up with the DFlash drafter against no speculation and n-gram.

For each drafter and batch size b, b chat requests run together through the embedded
engine (greedy, stopping at the end of the turn or max_tokens); batch 1 runs its
requests one after another. Reported: output tokens per second, the speed-up over
no speculation at the same batch, and the mean acceptance length (1 + accepted
drafts / drafted rounds). The prompts are written here, apart from the training
script's templates, so they are held out from the drafter's training data.

  python bench/dflash_speedup.py                                  # GPU if there is one
  python bench/dflash_speedup.py --device cpu --batches 1 --max-tokens 96 --requests 3

(bench/spec_speedup.py, when it exists, can call run() with drafter "dflash".)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how rainbows form.",
    "List three tips for staying focused while studying.",
    "What is the capital of France, and what is it famous for?",
    "Write a Python function that returns the squares of a list of numbers.",
    "Describe a sunny afternoon in a park.",
    "Why do leaves change color in autumn?",
    "Give me a recipe for a simple salad.",
    "What are the benefits of drinking enough water every day?",
    "Write a haiku about the sea.",
    "Explain what a noun is, with examples.",
    "How do airplanes stay in the air?",
    "Tell me a fun fact about octopuses.",
    "Write a thank-you note to a teacher.",
    "What is 12 times 11? Show your work.",
    "Summarize the story of Cinderella in a few sentences.",
    "What should I pack for a weekend camping trip?",
    "Explain the difference between weather and climate.",
    "Write a limerick about a cat who loves cheese.",
    "How does a refrigerator keep food cold?",
    "Give me five ideas for a rainy-day activity with kids.",
    "What is machine learning? Keep it simple.",
    "Write a short speech for a friend's birthday party.",
    "How can I improve my handwriting?",
    "Describe the life cycle of a butterfly.",
    "What are some good habits for a healthy morning routine?",
    "Write a SQL query that selects all users older than 30.",
    "Why is the sky blue?",
    "Explain how to change a flat tire, step by step.",
    "Write a product description for a reusable water bottle.",
    "What causes the seasons on Earth?",
    "Give me a short motivational quote and explain it.",
    "How do bees make honey?",
    "Write a short poem about autumn leaves.",
    "What is the difference between a virus and a bacterium?",
    "Describe your ideal vacation.",
    "Explain what gravity is to a child.",
    "Write a JavaScript function that checks if a string is empty.",
    "What are the main parts of a plant?",
    "How do I make a cup of tea?",
]

DEFAULT_GAMMA = {"dflash": 7, "ngram": 4, "none": 0}


def run(drafter: str, batches: list[int], *, requests: int, max_tokens: int, device: str, dtype: str,
        gamma: int | None = None, adaptive: bool = True, dflash_checkpoint: str | None = None,
        loaded=None, model: str | None = None) -> tuple[list[dict], object]:
    """Rows {drafter, batch, tokens, seconds, tokens_per_s, acceptance_length} for each batch size,
    and the loaded target (pass it back as `loaded` to share the weights)."""
    from tandem.config import EngineConfig
    from tandem.engine import Engine
    from tandem.sampling_params import SamplingParams
    from tandem.shard.factory import build_model_shard
    from tandem.shard.local_group import LocalShardGroup

    slots = max(batches)
    config = EngineConfig(model=model, drafter=drafter, dflash_checkpoint=dflash_checkpoint, max_num_seqs=slots,
                          max_seq_len=1024, row_budget=max(256, slots * 16), device=device, dtype=dtype,
                          num_speculative_tokens=DEFAULT_GAMMA.get(drafter, 4) if gamma is None else gamma,
                          adaptive=adaptive)
    shard, loaded = build_model_shard(config.shard_spec(), loaded=loaded, progress=False)
    engine = Engine(LocalShardGroup(shard), loaded.tokenizer, loaded.eos_token_ids, config, model_name=loaded.name)
    texts = [engine.chat_prompt([{"role": "user", "content": p}]) for p in PROMPTS]
    params = SamplingParams(max_tokens=max_tokens)
    # Warm-up on the largest batch for the whole length: the allocator's blocks and the
    # kernels' first calls, which would otherwise land on whichever run comes first.
    engine.generate(texts[-slots:], params)
    rows = []
    for b in batches:
        n = max(b, requests) if b == 1 else b
        chosen = [texts[i % len(texts)] for i in range(n)]
        outs, t0 = [], time.perf_counter()
        for i in range(0, n, b):
            outs += engine.generate(chosen[i : i + b], params)
        secs = time.perf_counter() - t0
        tokens = sum(len(o.token_ids) for o in outs)
        rounds = sum(o.num_drafts for o in outs)
        acc = sum(o.num_accepted_tokens for o in outs)
        rows.append({"drafter": drafter, "batch": b, "requests": n, "tokens": tokens, "seconds": round(secs, 3),
                     "tokens_per_s": round(tokens / secs, 1),
                     "acceptance_length": round(1 + acc / rounds, 3) if rounds else None,
                     "token_ids": [o.token_ids for o in outs]})
    engine.close()
    return rows, loaded


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(description="DFlash speed-up benchmark")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--model", default=None)
    ap.add_argument("--drafters", default="none,ngram,dflash")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--requests", type=int, default=4, help="requests run one after another at batch 1")
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--no-adaptive", action="store_true", help="fixed draft count (the drafter's default)")
    ap.add_argument("--dflash-checkpoint", default=None, help="default: the shipped weights")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)

    batches = [int(b) for b in args.batches.split(",")]
    table, loaded = [], None
    for drafter in args.drafters.split(","):
        rows, loaded = run(drafter, batches, requests=args.requests, max_tokens=args.max_tokens, device=args.device,
                           dtype=args.dtype, adaptive=not args.no_adaptive, dflash_checkpoint=args.dflash_checkpoint,
                           loaded=loaded, model=args.model)
        table += rows
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rows": [{k: v for k, v in r.items() if k != "token_ids"} for r in table]}, f, indent=1)
        for r in rows:
            print(f"{drafter:>7} batch {r['batch']:>3}: {r['tokens_per_s']:8.1f} tok/s  acceptance length "
                  f"{r['acceptance_length'] or '-'}", flush=True)
    base = {r["batch"]: r for r in table if r["drafter"] == "none"}
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"\n{name}, greedy, max_tokens {args.max_tokens}, adaptive {not args.no_adaptive}")
    print(f"{'drafter':>8} {'batch':>5} {'tok/s':>9} {'speed-up':>8} {'accept len':>10} {'same as none':>12}")
    for r in table:
        b = base.get(r["batch"])
        speed = f"{r['tokens_per_s'] / b['tokens_per_s']:.2f}x" if b else "-"
        same = f"{sum(x == y for x, y in zip(r['token_ids'], b['token_ids']))}/{len(r['token_ids'])}" if b else "-"
        r["speedup"] = round(r["tokens_per_s"] / b["tokens_per_s"], 3) if b else None
        print(f"{r['drafter']:>8} {r['batch']:>5} {r['tokens_per_s']:>9.1f} {speed:>8} {str(r['acceptance_length'] or '-'):>10} {same:>12}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "max_tokens": args.max_tokens, "adaptive": not args.no_adaptive,
                       "rows": [{k: v for k, v in r.items() if k != "token_ids"} for r in table]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
