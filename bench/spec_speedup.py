"""Tokens per second with and without speculation, on the same engine and weights.

For every drafter of DRAFTERS (its target model, the engine settings that select it, its
workload) and every batch size: the same greedy requests run once with no drafter and
once with the drafter, on two engines that share one loaded target. Batch b means b
requests in flight at once (3b requests, a new one joining as one finishes); batch 1 runs
the workload's prompts one after another.
Greedy speculation is lossless, so both runs emit the same tokens (checked).

At batch 1 it also runs Hugging Face transformers on the same model and prompts: plain
greedy `generate` and its assisted generation (`prompt_lookup_num_tokens` for n-gram
lookup, `assistant_model` for a draft model). For a draft model it compares the measured
speedup with Leviathan et al.'s prediction (1 - a^(g+1)) / ((1 - a)(g c + 1)), from
the measured acceptance rate a (at g drafts a round) and draft/target cost ratio c.

Targets (2-core CPU): n-gram on repeat/summarise prompts >= 2.5x no-spec at batch 1;
draft-model pair >= 90% of Leviathan's prediction; every drafter >= 1.0x at batch 32;
n-gram >= 3x transformers' greedy generate at batch 1.

    python bench/spec_speedup.py --quick       # default model, n-gram vs none, batch 1 and 8 (< 2 min)
    python bench/spec_speedup.py               # everything (the Qwen pair on a CPU: slow, see README)
    python bench/spec_speedup.py --drafters ngram --batches 1,8,32

Prints tables, then as its last line one JSON object: {"speedup": {"<drafter>_b<batch>": x},
"vs_hf": {"greedy_b1": x, "assisted_b1": x}, "tokens_per_s": {...}, "acceptance_length": {...}, ...}.
The drafters and workloads are in spec_speedup_cases.py, the timed runs in spec_speedup_runs.py.
"""
from __future__ import annotations

import argparse
import gc
from dataclasses import replace

from common import json_line, machine, now, print_table, setup_torch, warn_if_busy
from spec_speedup_cases import DRAFTERS, QUICK, TARGETS, WAVES, WORKLOADS, Drafter
from spec_speedup_runs import Run, Target, hf_runs, leviathan_check, run_engines


def bench_drafter(d: Drafter, batches: list[int], quick: bool, with_hf: bool, result: dict, reports: list,
                  device: str = "auto", dtype: str = "auto") -> None:
    from tandem.sampling_params import SamplingParams

    b1_prompts = QUICK["b1_prompts"] if quick else d.b1_prompts
    max_tokens_for = (lambda b: QUICK["max_tokens"]) if quick else (lambda b: d.max_tokens_by_batch.get(b, d.max_tokens))
    target = Target(d.target, slots=max(batches), max_model_len=512, device=device, dtype=dtype)
    name = target.loaded.name
    print(f"[{d.name}] target {name} loaded in {target.load_s:.1f}s", flush=True)
    make = WORKLOADS[d.workload]
    rows, b1 = [], None
    for b in batches:
        prompts = target.render(make(b1_prompts if b == 1 else WAVES * b))
        params = SamplingParams(max_tokens=max_tokens_for(b), temperature=0.0)
        engines = {"none": target.engine(drafter="none"), "spec": target.engine(**d.engine)}
        if d.leviathan and b == 1:  # Leviathan's formula is for a fixed draft count: adaptation off
            engines["fixed"] = target.engine(**{**d.engine, "adaptive": False})
        for e in engines.values():  # warm-up: allocations, the oneDNN weight packs
            e.generate(prompts[0][1], SamplingParams(max_tokens=4, temperature=0.0))
        if target.loaded.model.device.type == "cuda":  # and the CUDA-graph captures of this batch's shapes, once
            run_engines(engines, prompts, params, b)
        runs = run_engines(engines, prompts, params, b)
        base, fast = runs["none"], runs["spec"]
        key = f"{d.name}_b{b}"
        speedup = fast.tok_s / base.tok_s
        lossless = all(r.outputs == base.outputs for r in runs.values())
        result["speedup"][key] = speedup
        result["decode_speedup"][key] = fast.decode_tok_s / base.decode_tok_s if base.decode_tok_s else None
        result["tokens_per_s"][key] = fast.tok_s
        result["tokens_per_s"][f"{key}_nospec"] = base.tok_s
        result["acceptance_length"][key] = fast.acceptance_length
        result["acceptance_rate"][key] = fast.accepted / fast.draft_tokens if fast.draft_tokens else 0.0
        result["lossless"][key] = lossless
        rows.append([b, len(prompts), base.tokens, base.tok_s, fast.tok_s, speedup, result["decode_speedup"][key],
                     fast.acceptance_length, fast.draft_tokens / max(1, fast.drafts), "yes" if lossless else "NO"])
        print(f"[{d.name}] batch {b}: {base.tok_s:.1f} -> {fast.tok_s:.1f} tok/s ({speedup:.2f}x)", flush=True)
        if b == 1:
            b1 = runs
            result["by_prompt_kind"][key] = {kind: (fast.by_kind[kind][0] / fast.by_kind[kind][1])
                                             / (base.by_kind[kind][0] / base.by_kind[kind][1]) for kind in base.by_kind}
            if "fixed" in runs:
                result["leviathan"][key] = leviathan_check(runs["fixed"], base, engines["fixed"], target, prompts[0][1],
                                                           max_tokens_for(1))
        del engines
    reports.append(lambda: print_table(
        ["batch", "prompts", "tokens", "no-spec tok/s", f"{d.name} tok/s", "speedup", "decode speedup", "accept len",
         "drafts/round", "same tokens"],
        rows, title=f"{d.name} on {name} ({d.workload} prompts), speculation vs none, same engine"))
    for key, lev in result["leviathan"].items():
        if key.startswith(f"{d.name}_"):
            reports.append(lambda lev=lev: print_table(
                ["accept len", "alpha", "gamma", "c = draft/target", "predicted", "measured (decode)", "fraction", "e2e"],
                [[lev["acceptance_length"], lev["alpha"], lev["gamma"], lev["c"], lev["predicted"], lev["measured"],
                  lev["fraction"], lev["e2e_speedup"]]],
                title=f"{d.name}: Leviathan et al.'s predicted speedup at batch 1, fixed gamma (adaptive off)"))

    if with_hf and b1 is not None:
        prompts = target.render(make(b1_prompts))
        device_t, dtype_t = target.loaded.model.device, target.loaded.model.dtype
        del target
        gc.collect()  # room for transformers' copy of the weights
        hf_compare(d, b1["spec"], b1["none"], hf_runs(d, prompts, max_tokens_for(1), device_t, dtype_t), result, reports)


def hf_compare(d: Drafter, fast: Run, base: Run, hf: dict, result: dict, reports: list) -> None:
    prefix = "" if d.name == "ngram" else f"{d.name}_"
    result["vs_hf"][f"{prefix}greedy_b1"] = fast.tok_s / hf["greedy"]["tok_s"]
    result["tokens_per_s"][f"{d.name}_hf_greedy_b1"] = hf["greedy"]["tok_s"]
    rows = [
        ["tandem, no speculation", base.tok_s, base.tok_s / hf["greedy"]["tok_s"]],
        [f"tandem, {d.name}", fast.tok_s, fast.tok_s / hf["greedy"]["tok_s"]],
        ["transformers greedy generate", hf["greedy"]["tok_s"], 1.0],
    ]
    if "assisted" in hf:
        result["vs_hf"][f"{prefix}assisted_b1"] = fast.tok_s / hf["assisted"]["tok_s"]
        result["tokens_per_s"][f"{d.name}_hf_assisted_b1"] = hf["assisted"]["tok_s"]
        rows.append([f"transformers assisted ({', '.join(d.hf_assist)})", hf["assisted"]["tok_s"],
                     hf["assisted"]["tok_s"] / hf["greedy"]["tok_s"]])
    same = sum(a == b for a, b in zip(hf["greedy"]["outputs"], base.outputs))
    result["hf_greedy_same_tokens"][f"{d.name}_b1"] = f"{same}/{len(base.outputs)}"
    reports.append(lambda: print_table(["batch 1", "tok/s", "vs transformers greedy"], rows,
                                       title=f"{d.name}: tandem vs Hugging Face transformers, same model and prompts"))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the default model alone, n-gram vs none, batch 1 and 8, short outputs")
    p.add_argument("--drafters", default=None, help=f"comma-separated subset of {', '.join(d.name for d in DRAFTERS)}")
    p.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,8,32; quick 1,8)")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    p.add_argument("--num-speculative-tokens", type=int, default=None, help="most drafts a round (default: each drafter's own)")
    p.add_argument("--default-model", default=None,
                   help="the model spec of the rows on the default model (e.g. a smollm2.gguf path where the package is missing)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--device", default="auto", help="cpu | cuda | auto (a GPU if there is one)")
    p.add_argument("--dtype", default="auto", help="float32 | bfloat16 | auto (float32 on the CPU, bf16 on a GPU)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    setup_torch(args.threads)
    t_start = now()
    drafters = [d for d in DRAFTERS if (d.quick or not args.quick)]
    if args.drafters:
        wanted = args.drafters.split(",")
        unknown = set(wanted) - {d.name for d in DRAFTERS}
        if unknown:
            raise SystemExit(f"unknown drafters {sorted(unknown)}; known: {[d.name for d in DRAFTERS]}")
        drafters = [d for d in DRAFTERS if d.name in wanted]
    batches = [int(b) for b in args.batches.split(",")] if args.batches else list(QUICK["batches"] if args.quick else (1, 8, 32))
    warn_if_busy()
    result = {k: {} for k in ("speedup", "vs_hf", "tokens_per_s", "acceptance_length", "acceptance_rate", "decode_speedup",
                              "by_prompt_kind", "leviathan", "lossless", "hf_greedy_same_tokens")}
    reports = []
    if args.num_speculative_tokens is not None:
        drafters = [replace(d, engine={**d.engine, "num_speculative_tokens": args.num_speculative_tokens}) for d in drafters]
    if args.default_model is not None:
        drafters = [replace(d, target=args.default_model) if d.target is None else d for d in drafters]
    for d in drafters:
        bench_drafter(d, batches, args.quick, not args.no_hf, result, reports, args.device, args.dtype)
        gc.collect()
    for report in reports:
        report()
    result["targets"] = check_targets(result)
    result["quick"] = args.quick
    result["seconds"] = now() - t_start
    result["machine"] = machine()
    json_line(result)


def check_targets(result: dict) -> dict:
    met = {}
    if "ngram_b1" in result["speedup"]:
        met["ngram_b1>=2.5x"] = result["speedup"]["ngram_b1"] >= TARGETS["ngram_b1"]
    for key, x in result["speedup"].items():
        if key.endswith("_b32"):
            met[f"{key}>=1.0x"] = x >= TARGETS["b32"]
    if "greedy_b1" in result["vs_hf"]:
        met["vs_hf_greedy_b1>=3x"] = result["vs_hf"]["greedy_b1"] >= TARGETS["vs_hf_greedy_b1"]
    for key, lev in result["leviathan"].items():
        met[f"{key}>=0.9 of leviathan"] = lev["fraction"] >= TARGETS["leviathan_fraction"]
    met["lossless"] = all(result["lossless"].values())
    return met


if __name__ == "__main__":
    main()
