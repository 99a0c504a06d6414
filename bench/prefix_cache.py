"""Time to first token of requests that share a long system prompt, with the prefix cache
on and off: the default model on the CPU, the engine in this process.

    python bench/prefix_cache.py [--system-tokens 1500] [--requests 6] [--rounds 2]

Each request is the same system prompt (about --system-tokens tokens) and a question of
its own, run alone to its first token. With the cache on, the system prompt's full blocks
are prefilled once (a warm-up request) and every later request prefills only the blocks
after them. The two engines share the loaded weights and take turns request by request,
so a noisy stretch of the machine hits both. Prints a table, then one JSON line with the
median times to first token and their ratio (off / on).
"""
from __future__ import annotations

import argparse
import statistics
import time

from common import json_line, machine, print_table, setup_torch, warn_if_busy

SYSTEM_SENTENCE = "You are a meticulous assistant for a hardware store; answer briefly and cite the aisle. "


def ttft(engine, prompt: str, params) -> float:
    t0 = time.perf_counter()
    rid = engine.add_request(prompt, params)
    while True:
        for out in engine.step():
            if out.request_id == rid and out.token_ids:
                engine.abort(rid)
                while engine.has_unfinished():
                    engine.step()
                return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--system-tokens", type=int, default=1500, help="length of the shared system prompt")
    p.add_argument("--requests", type=int, default=6, help="requests per engine and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    threads = setup_torch(args.threads)
    warn_if_busy()
    from tandem.config import EngineConfig
    from tandem.engine import Engine
    from tandem.model.loader import load_model
    from tandem.sampling_params import SamplingParams
    from tandem.shard.factory import build_model_shard
    from tandem.shard.local_group import LocalShardGroup

    loaded = load_model(None, progress=False)
    per_sentence = len(loaded.tokenizer(SYSTEM_SENTENCE).input_ids)
    system = SYSTEM_SENTENCE * max(1, round(args.system_tokens / per_sentence))
    system_tokens = len(loaded.tokenizer(system).input_ids)
    engines = {}
    for name, on in (("cache off", False), ("cache on", True)):
        config = EngineConfig(drafter="ngram", enable_prefix_caching=on, device="cpu", dtype="float32")
        shard, _ = build_model_shard(config.shard_spec(), loaded=loaded, progress=False)
        engines[name] = Engine(LocalShardGroup(shard), loaded.tokenizer, loaded.eos_token_ids, config)
    params = SamplingParams(max_tokens=1)
    for engine in engines.values():  # the warm-up: weights packed, and the cache filled
        ttft(engine, system + "Where are the hammers?", params)
    times: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(args.rounds):
        for i in range(args.requests):
            question = f"Question {r}.{i}: do you sell {i + 2}-inch nails?"
            for name, engine in engines.items():
                times[name].append(ttft(engine, system + question, params))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    ratio = med["cache off"] / med["cache on"]
    hits = engines["cache on"].metrics.prefix_cache_hits._value.get()
    queries = engines["cache on"].metrics.prefix_cache_queries._value.get()
    print_table(["engine", "median TTFT ms", "min ms", "max ms"],
                [[name, med[name] * 1000, min(ts) * 1000, max(ts) * 1000] for name, ts in times.items()],
                title=f"time to first token, {system_tokens}-token shared system prompt, "
                      f"{args.rounds * args.requests} requests each, {threads} threads")
    print(f"cache off / cache on: {ratio:.1f}x (target >= 5x); prefix cache hit {hits / queries:.0%} of prompt tokens")
    json_line({"bench": "prefix_cache", "system_tokens": system_tokens,
               "ttft_ms": {name: m * 1000 for name, m in med.items()}, "ratio_off_over_on": ratio,
               "hit_rate": hits / queries, "machine": machine()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
