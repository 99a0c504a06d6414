"""The scheduler actor's outputs to a multiplexed handle: over its Unix socket against
over a Ray streaming generator (tandem.actors.output_channel).

    python bench/output_path.py [--model tiny-random | smollm2 | a folder or GGUF]
                                [--concurrency 16 64] [--max-tokens 32] [--repeats 3]

One engine (the rank inside the scheduler actor, n-gram drafting), C streams at once
through `handle.multiplexed(direct)` from one event loop, the two paths taking turns.
Per run: tokens/s (all tokens / first send -> last output), p50 time to first output,
and the engine's mean tick (the actor's own step_seconds / ticks over the run): the
part of the cost that the path puts on the engine's step thread, which shares the
actor's GIL with whatever delivers its outputs. Tokens/s and tick keep each side's best
run; the time to first output pools every run's requests.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

from common import json_line, machine, print_table, rounded, tiny_model_folder

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

PROMPTS = ["The history of the printing press begins", "def quicksort(items):",
           "Here is a recipe for a simple tomato soup:", "The three laws of thermodynamics are"]


async def one_run(mux, n: int, max_tokens: int) -> tuple[float, list[float], int]:
    async def one(prompt: str):
        sent = time.perf_counter()
        first, tokens = None, 0
        async for out in mux.astream(prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True, deltas_only=True):
            first = first or time.perf_counter()
            tokens += len(out.delta_token_ids)
        return first - sent, tokens

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(PROMPTS[i % len(PROMPTS)]) for i in range(n)))
    return time.perf_counter() - t0, [r[0] for r in results], sum(r[1] for r in results)


def measure(handle, direct: bool, n: int, max_tokens: int) -> dict:
    before = handle.health()
    mux = handle.multiplexed(direct)

    async def run():
        out = await one_run(mux, n, max_tokens)
        return out, mux._mux().over_socket

    (wall, ttft, tokens), over_socket = asyncio.run(run())
    after = handle.health()
    ticks = after["ticks"] - before["ticks"]
    tick_ms = 1000 * (after["step_seconds"] - before["step_seconds"]) / max(1, ticks)
    if over_socket != direct:
        raise RuntimeError(f"asked for direct={direct}, got over_socket={over_socket}")
    return {"tokens_per_s": tokens / wall, "ttft": ttft, "tick_ms": tick_ms}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-random",
                    help="tiny-random (a 1-layer random model with the default model's tokenizer: the path's cost "
                         "shows on a CPU), smollm2, or a model folder / GGUF")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    import torch

    import tandem.actors as ta

    model = tiny_model_folder(tempfile.mkdtemp(prefix="tandem-tiny-")) if args.model == "tiny-random" else args.model
    gpu = torch.cuda.is_available()
    ta.init_local_ray(log_to_driver=False, num_gpus=1 if gpu else None)
    handle = ta.start(model=model, in_process_target=True, shard_num_gpus=1.0 if gpu else 0.0,
                      max_num_seqs=max(args.concurrency), max_model_len=512, shard_torch_threads=1)
    sides = {"socket": True, "ray stream": False}
    runs: dict[tuple[str, int], list[dict]] = {}
    try:
        for c in args.concurrency:
            for direct in sides.values():  # warm up (on a GPU: each batch shape's graphs)
                measure(handle, direct, c, args.max_tokens)
            for _ in range(args.repeats):
                for name, direct in sides.items():
                    runs.setdefault((name, c), []).append(measure(handle, direct, c, args.max_tokens))
    finally:
        handle.shutdown()

    rows, result = [], {}
    for (name, c), rs in runs.items():
        best = {
            "tokens_per_s": max(r["tokens_per_s"] for r in rs),
            "tick_ms": min(r["tick_ms"] for r in rs),
            "ttft_ms_p50": 1000 * statistics.median(x for r in rs for x in r["ttft"]),
        }
        result.setdefault(str(c), {})[name] = best
        rows.append([c, name, f"{best['tokens_per_s']:.0f}", f"{best['tick_ms']:.2f}", f"{best['ttft_ms_p50']:.1f}"])
    print_table(["C", "outputs over", "tok/s", "tick ms", "first output p50 ms"], rows,
                title=f"{args.model}, {args.max_tokens} tokens a request, {args.repeats} runs each")
    for c in map(str, args.concurrency):
        r = result[c]
        r["tokens_per_s_ratio"] = r["socket"]["tokens_per_s"] / r["ray stream"]["tokens_per_s"]
    json_line({"model": args.model, "max_tokens": args.max_tokens, "concurrency": rounded(result), "machine": machine()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
