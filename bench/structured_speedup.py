"""Structured outputs with speculation: JSON-schema generation on the default model,
tokens/s with speculation (the server's default drafter, n-gram, plus the grammar's
forced-token drafts) against none (no drafter, no forced drafts), at batch 1 and 8, on
two engines sharing one loaded target, in turns; and the grammar's own work per tick at
batch 16 (drafts walked, masks filled, forced tokens found), against the whole tick.
Both engines emit the same tokens (greedy speculation is exact): checked.

Targets: >= 1.5x at batch 1, >= 1.0x at batch 8, grammar work <= 10% of a tick.

    python bench/structured_speedup.py [--max-tokens 64] [--reps 2] [--threads N]

Prints a table, then as its last line one JSON object:
{"speedup": {"b1": x, "b8": x}, "tokens_per_s": {...}, "mask_share_b16": x, "lossless": bool, "machine": {...}}.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from common import json_line, machine, now, print_table, setup_torch, warn_if_busy

SUBJECTS = ["a city", "a book", "a person", "a car", "a planet", "a song", "a river", "a dog"]
SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["name", "category", "rating", "tags", "details"],
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "category": {"enum": ["place", "thing", "person", "animal", "work"]},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "details": {"type": "object", "additionalProperties": False, "required": ["summary", "known_for"],
                    "properties": {"summary": {"type": "string", "maxLength": 60},
                                   "known_for": {"type": "string", "maxLength": 40}}},
    },
}


def run(engine, prompts: list[str], params, batch: int) -> tuple[float, list[list[int]]]:
    """Seconds for every prompt, `batch` in flight at once; the outputs in prompt order."""
    t = now()
    outs = []
    for i in range(0, len(prompts), batch):
        outs += engine.generate(prompts[i : i + batch], params)
    return now() - t, [o.token_ids for o in outs]


def grammar_share(engine, prompts: list[str], params) -> float:
    """The share of the ticks' time spent in the grammar's scheduler-side work."""
    from tandem.verify import step

    spent = [0.0]

    def timed(fn):
        def wrapper(*a, **kw):
            t = now()
            try:
                return fn(*a, **kw)
            finally:
                spent[0] += now() - t
        return wrapper

    saved = step._grammar_rows, step._add_forced
    step._grammar_rows, step._add_forced = timed(saved[0]), timed(saved[1])
    try:
        t = now()
        engine.generate(prompts, params)
        total = now() - t
    finally:
        step._grammar_rows, step._add_forced = saved
    return spent[0] / total


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    setup_torch(args.threads)
    warn_if_busy()

    from tandem.config import EngineConfig
    from tandem.engine import Engine
    from tandem.grammar.constraint import GrammarConstraint
    from tandem.model.loader import load_model
    from tandem.sampling_params import SamplingParams
    from tandem.shard.factory import ShardSpec, build_model_shard
    from tandem.shard.local_group import LocalShardGroup

    model = load_model(None, progress=False)
    shard, _ = build_model_shard(ShardSpec(num_slots=16, max_model_len=1024, row_budget=256, device="cpu", dtype="float32"),
                                 loaded=model, progress=False)
    group = LocalShardGroup(shard)
    engines = {name: Engine(group, model.tokenizer, model.eos_token_ids,
                            EngineConfig(drafter=name, max_num_seqs=16, max_model_len=1024, row_budget=256))
               for name in ("none", "ngram")}
    params = SamplingParams(max_tokens=args.max_tokens, structured=GrammarConstraint.json_schema(SCHEMA))
    chat = engines["none"].chat_prompt
    prompts = [chat([{"role": "user", "content": f"Describe {s} as a JSON object."}]) for s in SUBJECTS]
    engines["none"].generate(prompts[:1], params)  # the grammar's tokenizer, built once; a first forward
    engines["ngram"].generate(prompts[:1], params)

    rows, result, lossless = [], {"speedup": {}, "tokens_per_s": {}}, True
    for batch in (1, 8):
        best, outs = {}, {}
        for _ in range(args.reps):
            for name, engine in engines.items():
                s, outs[name] = run(engine, prompts, params, batch)
                best[name] = min(best.get(name, float("inf")), s)
        lossless &= outs["none"] == outs["ngram"]
        tokens = sum(len(o) for o in outs["none"])
        tps = {name: tokens / s for name, s in best.items()}
        result["tokens_per_s"][f"b{batch}"] = tps
        result["speedup"][f"b{batch}"] = tps["ngram"] / tps["none"]
        rows.append([batch, tokens, tps["none"], tps["ngram"], tps["ngram"] / tps["none"]])
    share = grammar_share(engines["ngram"], (prompts * 2)[:16], params)
    result["mask_share_b16"] = share
    result["lossless"] = lossless
    result["targets_met"] = {"b1>=1.5": result["speedup"]["b1"] >= 1.5, "b8>=1.0": result["speedup"]["b8"] >= 1.0,
                             "mask<=0.10": share <= 0.10}
    print_table(["batch", "tokens", "none tok/s", "ngram+forced tok/s", "speedup"], rows,
                title=f"JSON-schema generation, {len(prompts)} prompts, max_tokens {args.max_tokens}")
    print(f"grammar work at batch 16: {100 * share:.1f}% of the time; outputs equal: {lossless}\n")
    result["machine"] = machine()
    json_line(result)


if __name__ == "__main__":
    main()
