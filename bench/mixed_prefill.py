"""Running streams under a burst of long prompts, with the prompt chunks riding on the
running verifies (mixed_prefill) and with prefill ticks of their own: the default model on
the CPU, the engine in this process.

    python bench/mixed_prefill.py [--streams 4] [--burst 4] [--prompt-tokens 400] [--rounds 2]

`--streams` requests start and reach their 8th token; then `--burst` prompts of about
`--prompt-tokens` tokens arrive at once. Measured on the running streams while the burst's
prompts are prefilled and decoded: the gaps between their tokens (p50, p99) and their
tokens/s; on the burst: the time to first token. The modes share one loaded model (and
one rank) and take turns round by round; the last round is kept. Prints a table, then one
JSON line.
"""
from __future__ import annotations

import argparse
import statistics
import time

from common import json_line, machine, print_table, setup_torch, warn_if_busy

RUNNER = "Write a long story about a lighthouse keeper and a storm, in plain words:"
SENTENCE = "The survey counted birds along the northern shore, noting each species and the weather. "
MODES = [("mixed: chunks ride on verifies", {"mixed_prefill": True}),
         ("prefill ticks of 2048", {"mixed_prefill": False}),
         ("prefill ticks of 256", {"mixed_prefill": False, "max_prefill_tokens": 256})]


def run_mode(engine, streams: int, burst: list[str], max_tokens: int) -> dict:
    from tandem.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    runners = [engine.add_request(f"{RUNNER} ({i})", params) for i in range(streams)]
    while min(len(engine.requests[r].output_ids) for r in runners) < 8:
        engine.step()
    t0 = time.perf_counter()
    newcomers = {engine.add_request(p, SamplingParams(max_tokens=16, ignore_eos=True)) for p in burst}
    last = {r: t0 for r in runners}
    running, gaps, ttft, emitted = set(runners), [], [], 0
    while running:
        outs = engine.step()
        t = time.perf_counter()
        for o in outs:
            n = len(o.delta_token_ids)
            if o.request_id in running and n:
                gaps += [(t - last[o.request_id]) / n] * n
                last[o.request_id], emitted = t, emitted + n
            elif o.request_id in newcomers and n and len(o.token_ids) == n:
                ttft.append(t - t0)
            if o.finished:
                running.discard(o.request_id)
    secs = time.perf_counter() - t0
    while engine.has_unfinished():
        engine.step()
    q = lambda xs, p: statistics.quantiles(xs, n=100)[p - 1] * 1000.0  # noqa: E731
    return {"itl_p50_ms": q(gaps, 50), "itl_p99_ms": q(gaps, 99), "itl_p99_over_p50": q(gaps, 99) / q(gaps, 50),
            "runner_tokens_s": emitted / secs, "burst_ttft_ms": statistics.median(ttft) * 1000.0 if ttft else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--burst", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=400)
    p.add_argument("--max-tokens", type=int, default=64, help="tokens each running stream generates")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    threads = setup_torch(args.threads)
    warn_if_busy()
    from tandem.config import EngineConfig
    from tandem.engine import Engine
    from tandem.model.loader import load_model
    from tandem.shard.factory import build_model_shard
    from tandem.shard.local_group import LocalShardGroup

    loaded = load_model(None, progress=False)
    per_sentence = len(loaded.tokenizer(SENTENCE).input_ids)
    burst = [f"Request {i}. " + SENTENCE * max(1, round(args.prompt_tokens / per_sentence)) for i in range(args.burst)]
    base = EngineConfig(drafter="none", device="cpu")
    shard, _ = build_model_shard(base.shard_spec(), loaded=loaded, progress=False)
    group = LocalShardGroup(shard)
    results = {}
    for _ in range(args.rounds):  # in turns; the last round is kept
        for label, options in MODES:
            config = EngineConfig(drafter="none", device="cpu", **options)
            engine = Engine(group, loaded.tokenizer, loaded.eos_token_ids, config)
            results[label] = run_mode(engine, args.streams, burst, args.max_tokens)
    rows = [[label, r["itl_p50_ms"], r["itl_p99_ms"], r["itl_p99_over_p50"], r["runner_tokens_s"], r["burst_ttft_ms"]]
            for label, r in results.items()]
    print_table(["prefill", "running ITL p50 ms", "ITL p99 ms", "p99 / p50", "running tok/s", "burst TTFT p50 ms"], rows,
                title=f"{args.streams} running streams, a burst of {args.burst} prompts of ~{args.prompt_tokens} tokens "
                      f"({loaded.name}, {threads} threads)")
    json_line({"modes": results, "machine": machine()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
