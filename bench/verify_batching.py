"""What one batched verify saves: ONE target forward of n sequences x k rows against n
separate k-row forwards (n in {1, 4, 8, 16}, k in {1, 5}).

Each forward is the engine's own verify command (ModelShard.verify: the target forward
plus every row's pick), on n KV slots prefilled with `--context` tokens of real text.
ratio = time of the one batched forward / time of the n separate ones (lower is better;
1/n would be free batching). Target on the 2-core CPU with the default model:
ratio n8_k5 <= 0.2.

    python bench/verify_batching.py [--model NAME] [--context 128] [--reps 5] [--threads 2]

Prints a table, then as its last line one JSON object: {"ratio": {"n8_k5": ..., ...}, ...}.
"""
from __future__ import annotations

import argparse

from common import covering, fixed_block_tables, interleaved_min, json_line, machine, print_table, setup_torch, warn_if_busy

TARGET = {"n8_k5": 0.2}

TEXT = (
    "The committee met on Tuesday to review the budget for the new library. After a long "
    "discussion, they agreed to fund the reading room, the children's section and a small cafe. "
    "Work starts in the spring; the builders expect to finish before the first snow, and the "
    "town will hold a small opening with music, books for every child and a lecture on maps. "
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model spec (default: the default model, SmolLM2-135M)")
    p.add_argument("--ns", default="1,4,8,16", help="sequences per batch, comma-separated")
    p.add_argument("--ks", default="1,5", help="rows per sequence (1 + drafts), comma-separated")
    p.add_argument("--context", type=int, default=128, help="tokens already in each slot's KV")
    p.add_argument("--reps", type=int, default=5, help="timed runs of each (the minimum is kept)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--dtype", default="float32")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    setup_torch(args.threads)
    from tandem.shard.commands import GREEDY, PrefillItem, VerifyBatch
    from tandem.shard.factory import ShardSpec, build_model_shard

    ns = [int(x) for x in args.ns.split(",")]
    ks = [int(x) for x in args.ks.split(",")]
    spec = ShardSpec(model=args.model, device="cpu", dtype=args.dtype, num_slots=max(ns),
                     max_model_len=args.context + max(ks) + 1, row_budget=max(ns) * max(ks))
    shard, loaded = build_model_shard(spec, progress=False)
    ids = loaded.tokenizer(TEXT * (1 + (args.context + max(ns) * 7 + max(ks)) // 60)).input_ids
    # Slot i holds `context` tokens starting at offset 7*i, in blocks of its own; its rows continue that text.
    offsets = [7 * i for i in range(max(ns))]
    bs = shard.limits.block_size
    tables = fixed_block_tables(max(ns), spec.max_model_len, bs)
    ctx = args.context
    shard.prefill([PrefillItem(slot=i, tokens=ids[o : o + ctx], blocks=covering(tables[i], ctx, bs))
                   for i, o in enumerate(offsets)])

    def command(slots: list[int], k: int) -> VerifyBatch:
        tokens = [t for s in slots for t in ids[offsets[s] + ctx : offsets[s] + ctx + k]]
        return VerifyBatch(batch_id=0, n=len(slots), k=k, slots=slots, start_pos=[ctx] * len(slots),
                           tokens=tokens, sampling=[GREEDY] * len(slots),
                           block_tables=[covering(tables[s], ctx + k, bs) for s in slots])

    warn_if_busy()
    rows, ratio, batched_ms, separate_ms = [], {}, {}, {}
    for k in ks:
        for n in ns:
            batched = command(list(range(n)), k)
            singles = [command([i], k) for i in range(n)]
            t = interleaved_min(
                {"batched": lambda: shard.verify(batched), "separate": lambda: [shard.verify(c) for c in singles]},
                reps=args.reps,
            )
            key = f"n{n}_k{k}"
            ratio[key] = t["batched"] / t["separate"]
            batched_ms[key] = t["batched"] * 1e3
            separate_ms[key] = t["separate"] * 1e3
            rows.append([n, k, n * k, batched_ms[key], separate_ms[key], separate_ms[key] / n, ratio[key], 1 / n,
                         TARGET.get(key)])
    shard.pending = None
    print_table(
        ["n", "k", "rows", "batched ms", "n separate ms", "one k-row ms", "ratio", "ideal 1/n", "target"],
        rows,
        title=f"verify batching: {loaded.name}, {ctx} tokens of context per slot, minimum of {args.reps} runs",
    )
    meets = {key: ratio[key] <= limit for key, limit in TARGET.items() if key in ratio}
    json_line({
        "ratio": ratio,
        "batched_ms": batched_ms,
        "separate_ms": separate_ms,
        "target": TARGET,
        "meets_target": meets,
        "model": loaded.name,
        "context": ctx,
        "reps": args.reps,
        "machine": machine(),
    })


if __name__ == "__main__":
    main()
