"""Where a decode tick's time goes on a GPU: the 8B-shaped model of gpu_scale.py, the real
Engine.step with CUDA graphs and no drafter, profiled at a few batch sizes.

    python bench/gpu_tick_profile.py [--batches 1 64] [--host-batches 64] [--ticks 20] [--context 500] [--small]

Per batch: the tick's wall time, the GPU's busy time and kernel count a tick, the kernels
that take most of it (summed by name), and the host's share (wall time the GPU is idle).
Then the Python functions that take most of the host's time at --host-batches (cProfile).
Why: a graphed decode tick is the weights' read plus what is not, and the targets of
gpu_scale.py's decode part are about that remainder. Prints tables, then one JSON line.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from collections import defaultdict

import torch

from common import json_line, machine, print_table
from gpu_scale import prompts
from gpu_scale_parts import LLAMA_8B, SMALL, build_shard, engine_on, random_model, step


def running_engine(group, loaded, batch: int, context: int):
    """An engine with `batch` sequences past their prefill, decoding."""
    from tandem.intake import Request
    from tandem.sampling_params import SamplingParams

    engine = engine_on(group, loaded)
    params = SamplingParams(max_tokens=1000, ignore_eos=True)
    engine.add_requests([Request(p, params, f"p{i}") for i, p in enumerate(prompts(batch, context, loaded.config.vocab_size, seed=batch))])
    for _ in range(40):  # prefill ticks, then graphs of the decode shapes captured
        step(engine)
    return engine


def kernel_table(engine, ticks: int) -> tuple[dict, list]:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(ticks):
            step(engine)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / ticks
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    by_name: dict[str, list[float]] = defaultdict(list)
    for e in kernels:
        by_name[e.name].append(e.time_range.elapsed_us())
    busy = sum(sum(v) for v in by_name.values()) / ticks
    rows = sorted(((name[:70], len(v) / ticks, sum(v) / ticks) for name, v in by_name.items()), key=lambda r: -r[2])
    summary = {"wall_ms": wall * 1e3, "gpu_busy_ms": busy / 1e3, "kernels": len(kernels) / ticks,
               "host_idle_ms": wall * 1e3 - busy / 1e3}
    return summary, rows


def host_profile(engine, ticks: int, top: int = 25) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(ticks):
        step(engine)
    torch.cuda.synchronize()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    p.add_argument("--ticks", type=int, default=20)
    p.add_argument("--context", type=int, default=500)
    p.add_argument("--small", action="store_true")
    p.add_argument("--host-batches", type=int, nargs="*", default=None, help="batches whose host time is profiled (default: the smallest)")
    args = p.parse_args(argv)
    loaded = random_model(SMALL if args.small else LLAMA_8B, torch.bfloat16)
    group = build_shard(loaded, num_slots=max(args.batches), max_model_len=2048, row_budget=512, kv_gb=24.0)
    result = {"model": loaded.name, "context": args.context}
    for b in args.batches:
        engine = running_engine(group, loaded, b, args.context)
        times = []
        for _ in range(args.ticks):
            t = time.perf_counter()
            step(engine)
            times.append((time.perf_counter() - t) * 1e3)
        summary, rows = kernel_table(engine, args.ticks)
        summary["tick_p50_ms"] = statistics.median(times)
        result[f"b{b}"] = summary
        print_table(["kernel", "a tick", "us a tick"], rows[:30],
                    title=f"batch {b}: tick p50 {summary['tick_p50_ms']:.2f} ms, profiled wall {summary['wall_ms']:.2f} ms, "
                          f"GPU busy {summary['gpu_busy_ms']:.2f} ms, {summary['kernels']:.0f} kernels")
        if b in (args.host_batches if args.host_batches is not None else [min(args.batches)]):
            print(host_profile(engine, args.ticks), flush=True)
        for i in range(b):  # frees the slots for the next batch
            engine.abort(f"p{i}")
        while engine.has_unfinished():
            step(engine)
    result["machine"] = machine()
    json_line(result)


if __name__ == "__main__":
    main()
