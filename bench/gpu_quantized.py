"""Quantized weights on one GPU: a Llama-3.1-8B-shaped model (random weights) decoding with
bf16, FP8 (E4M3) and int4 linear layers, tandem's real Engine.step, CUDA graphs on, in turns.

    python bench/gpu_quantized.py [--methods none,fp8,int4] [--batches 1,8,32] [--context 500] [--small]

Each method's target is built by the rank as `quantization` asks (from one bf16 model),
then for each batch size every method decodes in turn (no drafter, each sequence
`--context` tokens deep); the tick is the median of the steady decode ticks. The roofline
of a method is the bytes one decode step must read (its linear layers as stored, the
norms; the embedding table is only gathered) over the measured copy bandwidth.
Prints a table, then one JSON line. Targets: the FP8 batch-1 tick at most 0.6x the bf16
one, and within 1.3x of the FP8 roofline.
"""
from __future__ import annotations

import argparse
import gc
import statistics

import torch

from common import json_line, machine, print_table
from gpu_scale import generate, prompts
from gpu_scale_parts import LLAMA_8B, SMALL, copy_bandwidth, engine_on, random_model

TARGETS = {"fp8_over_bf16_b1": 0.6, "fp8_b1_over_roofline": 1.3}


def read_bytes(model) -> int:
    """Bytes a decode step reads: every parameter and quantized kernel but the embedding table."""
    from tandem.model.quant import QuantizedLinear

    total = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)
    for module in model.modules():
        if isinstance(module, QuantizedLinear) and module.kernel is not None:
            total += module.kernel.nbytes
        for value in vars(module).values():
            if getattr(value, "quantized", None) is not None:
                total += value.quantized.nbytes
    return total


def build_group(loaded, method: str, num_slots: int, kv_gb: float):
    from tandem.shard.factory import ShardSpec, build_model_shard
    from tandem.shard.local_group import LocalShardGroup

    spec = ShardSpec(device="cuda", dtype="bfloat16", quantization=method, num_slots=num_slots, max_model_len=2048,
                     row_budget=256, kv_cache_memory_gb=kv_gb)
    shard, _ = build_model_shard(spec, loaded=loaded, progress=False)
    return LocalShardGroup(shard), shard.model


@torch.no_grad()
def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default="none,fp8,int4")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--context", type=int, default=500)
    p.add_argument("--kv-gb", type=float, default=8.0)
    p.add_argument("--small", action="store_true")
    args = p.parse_args(argv)
    methods, batches = args.methods.split(","), [int(b) for b in args.batches.split(",")]
    loaded = random_model(SMALL if args.small else LLAMA_8B, torch.bfloat16)
    bw = copy_bandwidth()
    groups, rooflines = {}, {}
    for m in methods:
        group, model = build_group(loaded, m, max(batches), args.kv_gb)
        groups[m] = group
        rooflines[m] = read_bytes(model) / bw * 1000.0
        gc.collect()
        torch.cuda.empty_cache()
    ticks: dict[tuple[str, int], float] = {}
    for b in batches:
        for m in methods:  # in turns, so a change in the machine hits every method alike
            engine = engine_on(groups[m], loaded)
            _, _, t = generate(engine, prompts(b, args.context, loaded.config.vocab_size, seed=b), max_tokens=40)
            ticks[(m, b)] = statistics.median(t[-30:])
    rows, result = [], {"model": loaded.name, "copy_tb_s": bw / 1e12, "context": args.context,
                        "roofline_ms": rooflines}
    for m in methods:
        for b in batches:
            tick = ticks[(m, b)]
            base = ticks.get(("none", b))
            rows.append([m, b, tick, b * 1000.0 / tick, tick / rooflines[m], (tick / base) if base else ""])
            result[f"{m}_tick_b{b}_ms"] = tick
    print_table(["method", "batch", "tick ms", "tokens/s", "tick / its roofline", "tick / bf16 tick"], rows,
                title=f"decode tick by weight format ({args.context} tokens of context; rooflines "
                      + ", ".join(f"{m} {r:.2f} ms" for m, r in rooflines.items()) + ")")
    if "fp8" in methods and "none" in methods and 1 in batches:
        result["fp8_over_bf16_b1"] = ticks[("fp8", 1)] / ticks[("none", 1)]
        result["fp8_b1_over_roofline"] = ticks[("fp8", 1)] / rooflines["fp8"]
        result["meets_target"] = {k: result[k] <= v for k, v in TARGETS.items()}
    result["target"] = TARGETS
    result["machine"] = machine()
    json_line(result)


if __name__ == "__main__":
    main()
