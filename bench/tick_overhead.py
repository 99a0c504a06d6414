"""The engine's own work per tick, outside the target's forward: scheduling, verdicts,
emits, detokenization, outputs, drafting.

    python bench/tick_overhead.py [--batches 1 16 64] [--drafters none ngram]

On a GPU the forward of a small model at batch 32 takes ~4 ms (SmolLM2-135M, H200,
CUDA graphs), so every millisecond the scheduler spends per tick is a quarter of the
throughput; on this CPU the forward hides it. To see it here, the target is a tiny
random model (1 layer, hidden 64) with the default model's tokenizer and vocabulary,
so the tokens decode like real ones and the forward costs little. Each tick is timed
whole and inside the target's verify (`group.verify`, the forward and the picks);
host = tick - verify. Prints a table, then one JSON line:
{"host_ms_per_tick": {"none_b64": ...}, "host_us_per_seq": {...}, "tick_ms": {...}}.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from common import TimedVerify, json_line, machine, print_table, setup_torch, tiny_model_folder

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS = ["The history of the printing press begins", "def quicksort(items):",
           "Here is a recipe for a simple tomato soup:", "Once upon a time, in a small village by the sea,"]


def measure(engine, timed: TimedVerify, n: int, max_tokens: int) -> tuple[float, float]:
    """Median tick and median host part (tick - verify), ms, over the decode ticks."""
    from tandem.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(n):
        engine.add_request(f"{PROMPTS[i % len(PROMPTS)]} ({i})", params)
    engine.step()  # the prefill tick
    timed.take()
    ticks, host = [], []
    while engine.has_unfinished():
        t = time.perf_counter()
        engine.step()
        ms = (time.perf_counter() - t) * 1000.0
        ticks.append(ms)
        host.append(ms - timed.take())
    return statistics.median(ticks), statistics.median(host)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--drafters", nargs="+", default=["none", "ngram"])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--model", default=None, help="a model folder (default: the tiny random model, built here)")
    args = ap.parse_args(argv)
    setup_torch(args.threads)

    from tandem.config import EngineConfig
    from tandem.engine import Engine

    rows, result = [], {"host_ms_per_tick": {}, "host_us_per_seq": {}, "tick_ms": {}}
    with tempfile.TemporaryDirectory() as folder:
        if args.model:
            folder = args.model
        else:
            tiny_model_folder(folder)
        for drafter in args.drafters:
            engine = Engine.from_config(EngineConfig(model=folder, drafter=drafter, max_num_seqs=max(args.batches),
                                                     max_model_len=512, device="cpu", dtype="float32"), progress=False)
            timed = engine.group = engine.ctx.group = TimedVerify(engine.group)
            for n in args.batches:
                measure(engine, timed, n, 16)  # warm-up: allocations, weight packs
                tick, host = measure(engine, timed, n, args.max_tokens)
                key = f"{drafter}_b{n}"
                result["tick_ms"][key] = round(tick, 3)
                result["host_ms_per_tick"][key] = round(host, 3)
                result["host_us_per_seq"][key] = round(1000.0 * host / n, 1)
                rows.append([drafter, n, tick, host, 1000.0 * host / n])
            engine.close()
    print_table(["drafter", "batch", "tick ms", "host ms", "host us/seq"], rows,
                title="engine work per tick outside the target's verify (tiny model, CPU)")
    json_line({**result, "max_tokens": args.max_tokens, "machine": machine()})


if __name__ == "__main__":
    main()
