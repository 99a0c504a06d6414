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
"""
from __future__ import annotations

import argparse
import gc
from dataclasses import dataclass, field, replace

from common import interleaved_min, json_line, machine, now, print_table, setup_torch, warn_if_busy

# ---- workloads: prompts as (kind, chat message) -----------------------------------------

PARAGRAPHS = [
    "The committee met on Tuesday to review the budget for the new library. After a long discussion, "
    "they agreed to fund the reading room, the children's section and a small cafe.",
    "Our train left the station at seven in the morning. By noon we had crossed two rivers and a long "
    "valley, and in the evening we reached the old town by the lake, where it was raining.",
    "The bakery on the corner opens at six. It sells bread, small cakes and coffee, and on Sundays the "
    "owner makes apple pies that are usually gone before nine o'clock.",
    "Water boils at one hundred degrees Celsius at sea level. On a high mountain the air pressure is "
    "lower, so water boils at a lower temperature and food takes longer to cook.",
    "The museum has three floors. The first holds old maps and coins, the second paintings from the "
    "last two centuries, and the third a large collection of clocks and musical boxes.",
    "Maria planted tomatoes, beans and sunflowers in her garden this spring. The dry summer was hard on "
    "the beans, but the tomatoes grew well and she gave many of them to her neighbours.",
    "The new bridge is four hundred metres long and took three years to build. It carries two lanes of "
    "traffic, a cycle path and a footpath, and it opened to the public last month.",
    "Every winter the village holds a festival of lights. Families hang lanterns in their windows, the "
    "school choir sings in the square, and the bakery gives out hot chocolate to everyone.",
]
INSTRUCTIONS = [
    ("repeat", "Repeat this paragraph word for word:\n\n{p}"),
    ("summarise", "Summarise this paragraph in one sentence:\n\n{p}"),
    ("repeat", "Copy the following text exactly, without changes:\n\n{p}"),
    ("summarise", "Give a short summary of the text below.\n\n{p}"),
]
CODE_TASKS = [
    "Write a Python function is_palindrome(s) that checks whether a string is a palindrome, ignoring case and spaces.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python function merge_sorted(a, b) that merges two sorted lists into one sorted list.",
    "Write a Python function that counts how often each word occurs in a text and returns a dict.",
    "Write a Python class Stack with push, pop, peek and is_empty methods.",
    "Write a Python function that reads a CSV file and returns the sum of its second column.",
    "Write a Python function binary_search(xs, target) that returns the index of target or -1.",
    "Write a Python function that flattens a nested list of arbitrary depth.",
]


def ngram_prompts(n: int) -> list[tuple[str, list[dict]]]:
    """Repeat and summarise requests, alternating, over distinct paragraphs."""
    out = []
    for i in range(n):
        kind, template = INSTRUCTIONS[(i % 2) + 2 * ((i // len(PARAGRAPHS)) % 2)]
        paragraph = PARAGRAPHS[(i + i // (2 * len(PARAGRAPHS))) % len(PARAGRAPHS)]  # 32 distinct prompts
        out.append((kind, [{"role": "user", "content": template.format(p=paragraph)}]))
    return out


def code_prompts(n: int) -> list[tuple[str, list[dict]]]:
    return [("code", [{"role": "user", "content": CODE_TASKS[i % len(CODE_TASKS)]
                       + ("" if i < len(CODE_TASKS) else f" Call it variant {i // len(CODE_TASKS)}.")}])
            for i in range(n)]


WORKLOADS = {"ngram": ngram_prompts, "code": code_prompts}


# ---- drafters: one row each (adding a drafter is one line) ------------------------------

@dataclass(frozen=True)
class Drafter:
    name: str  # the JSON key prefix: "<name>_b<batch>"
    target: str | None  # the target model spec (None: the default model)
    engine: dict  # EngineConfig fields that select and tune the drafter
    workload: str  # a key of WORKLOADS
    hf_assist: dict  # transformers generate() kwargs of its assisted generation ("assistant_model": spec)
    max_tokens: int  # per request, full run
    b1_prompts: int  # prompts run one after another at batch 1
    leviathan: bool = False  # compare with Leviathan et al.'s predicted speedup
    quick: bool = False  # part of --quick
    max_tokens_by_batch: dict = field(default_factory=dict)  # shorter outputs at large batches (slow models)


DRAFTERS = [
    Drafter("ngram", None, {"drafter": "ngram"}, "ngram", {"prompt_lookup_num_tokens": 10}, max_tokens=128,
            b1_prompts=8, quick=True),
    Drafter("draft_model", "qwen2.5-coder-1.5b", {"drafter": "draft-model", "draft_model": "qwen2.5-coder-0.5b"}, "code",
            {"assistant_model": "qwen2.5-coder-0.5b"}, max_tokens=48, b1_prompts=2, leviathan=True,
            max_tokens_by_batch={8: 32, 32: 32}),
    # DFlash on the n-gram row's prompts, so the two compare directly (transformers has no DFlash);
    # the shipped weights draft block_size - 1 = 7 tokens a round.
    Drafter("dflash", None, {"drafter": "dflash"}, "ngram", {}, max_tokens=128, b1_prompts=8),
]

TARGETS = {"ngram_b1": 2.5, "b32": 1.0, "vs_hf_greedy_b1": 3.0, "leviathan_fraction": 0.9}
QUICK = {"batches": (1, 8), "max_tokens": 64, "b1_prompts": 4}
# batch b > 1 runs WAVES * b requests with b in flight: the batch stays full until the last
# wave drains. A closed batch of b drains to one sequence, and then its slowest sequence
# sets the wall time: drafting that finishes the others sooner only thins the later ticks.
WAVES = 3


# ---- running ----------------------------------------------------------------------------

@dataclass
class Run:
    """Requests run to completion on one engine; times in seconds."""

    tokens: int = 0
    seconds: float = 0.0
    decode_tokens: int = 0  # tokens after each group's first tick (prefill and first verify)
    decode_seconds: float = 0.0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    outputs: list = field(default_factory=list)  # token ids per request, in prompt order
    by_kind: dict = field(default_factory=dict)  # kind -> [tokens, seconds] (batch 1 only)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.drafts if self.drafts else 1.0


def run_engines(engines: dict, prompts: list[tuple[str, str]], params, batch: int) -> dict[str, Run]:
    """All prompts through every engine. Batch 1: one after another, the engines taking
    turns prompt by prompt, so a noisy stretch of a shared machine hits them alike. Batch
    b > 1: b requests in flight, a new one joining as one finishes (continuous batching),
    each engine in turn over the whole list."""
    runs = {name: Run() for name in engines}
    if batch > 1:
        for name, engine in engines.items():
            _run_chunk(engine, prompts, params, runs[name], by_kind=False, in_flight=batch)
        return runs
    for i in range(0, len(prompts), batch):
        for name, engine in engines.items():
            _run_chunk(engine, prompts[i : i + batch], params, runs[name], by_kind=batch == 1)
    return runs


def _run_chunk(engine, chunk: list[tuple[str, str]], params, run: Run, by_kind: bool, in_flight: int | None = None) -> None:
    """The chunk's requests to completion: all at once, or `in_flight` at a time."""
    t0 = now()
    waiting = [text for _, text in chunk]
    ids = [engine.add_request(text, params) for text in waiting[: in_flight or len(waiting)]]
    waiting = waiting[len(ids) :]
    final, first_tick = {}, None
    while len(final) < len(chunk):
        outs = engine.step()
        if first_tick is None:  # prefill (and the first verify): left out of the decode rate
            first_tick = (now(), sum(len(o.token_ids) for o in outs))
        for o in outs:
            if o.finished:
                final[o.request_id] = o
                if waiting:  # its slot goes to the next request
                    ids.append(engine.add_request(waiting.pop(0), params))
    t1 = now()
    outs = [final[r] for r in ids]
    tokens = sum(len(o.token_ids) for o in outs)
    run.tokens += tokens
    run.seconds += t1 - t0
    run.decode_tokens += tokens - first_tick[1]
    run.decode_seconds += t1 - first_tick[0]
    for o in outs:
        if o.error:
            raise RuntimeError(f"request {o.request_id} failed: {o.error}")
        run.outputs.append(list(o.token_ids))
        run.drafts += o.num_drafts
        run.draft_tokens += o.num_draft_tokens
        run.accepted += o.num_accepted_tokens
    if by_kind:
        acc = run.by_kind.setdefault(chunk[0][0], [0, 0.0])
        acc[0] += tokens
        acc[1] += t1 - t0


class Target:
    """One loaded target model and the shard groups that engines on it share: engines whose
    ranks look alike (no rank-side drafter, or the same one) share one group."""

    def __init__(self, spec: str | None, *, slots: int, max_model_len: int, device: str, dtype: str):
        from tandem.config import EngineConfig
        from tandem.shard.factory import build_model_shard

        # No prefix cache: the engines of a group take turns on one rank's KV pool, each with
        # a block allocator of its own, so blocks one engine cached another may overwrite.
        self.base = EngineConfig(model=spec, drafter="none", max_num_seqs=slots, max_model_len=max_model_len,
                                 row_budget=max(256, 8 * slots), device=device, dtype=dtype,
                                 enable_prefix_caching=False)
        t = now()
        shard, self.loaded = build_model_shard(self.base.shard_spec(), progress=False)
        self.load_s = now() - t
        self.groups = {self.base.shard_spec(): _local(shard)}

    def group_for(self, cfg) -> object:
        from tandem.shard.factory import build_model_shard

        key = cfg.shard_spec()
        if key not in self.groups:
            self.groups[key] = _local(build_model_shard(key, loaded=self.loaded, progress=False)[0])
        return self.groups[key]

    def engine(self, **fields):
        from dataclasses import replace

        from tandem.engine import Engine

        cfg = replace(self.base, **fields)
        return Engine(self.group_for(cfg), self.loaded.tokenizer, self.loaded.eos_token_ids, cfg, model_name=self.loaded.name)

    def render(self, prompts: list[tuple[str, list[dict]]]) -> list[tuple[str, str]]:
        tok = self.loaded.tokenizer
        return [(kind, tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)) for kind, msgs in prompts]


def _local(shard):
    from tandem.shard.local_group import LocalShardGroup

    return LocalShardGroup(shard)


def one_row_ms(models: dict, position: int, reps: int = 5) -> dict[str, float]:
    """Milliseconds of one single-row forward at `position` (the cache's first blocks;
    timing only) of each (model, cache), the models taking turns."""
    import torch

    from tandem.model.kv_cache import fixed_tables

    def step(model, cache):
        device = model.device
        tokens = torch.zeros(1, 1, dtype=torch.long, device=device)
        start = torch.tensor([position], dtype=torch.int32, device=device)
        tables = fixed_tables(1, position + 1, cache.block_size, device)

        def run():
            model(tokens, start, cache, tables)
            sync(device)
        return run

    with torch.inference_mode():
        t = interleaved_min({name: step(m, c) for name, (m, c) in models.items()}, reps=reps, warmup=2)
    return {name: v * 1e3 for name, v in t.items()}


def sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def leviathan(acceptance_length: float, gamma: float, c: float) -> dict:
    """Leviathan et al.: with per-token acceptance a and g drafts a round, a round yields
    (1 - a^(g+1)) / (1 - a) tokens for the cost of g draft forwards (c each, in target
    forwards) and one target forward. a is found from the measured acceptance length."""
    def tokens(a: float) -> float:
        return gamma + 1.0 if a >= 1.0 else (1.0 - a ** (gamma + 1.0)) / (1.0 - a)

    lo, hi = 0.0, 1.0
    for _ in range(60):  # tokens(a) grows with a: bisect
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tokens(mid) < acceptance_length else (lo, mid)
    a = (lo + hi) / 2
    return {"alpha": a, "gamma": gamma, "c": c, "predicted": tokens(a) / (gamma * c + 1.0)}


def hf_runs(d: Drafter, prompts: list[tuple[str, str]], max_tokens: int, device, dtype) -> dict:
    """transformers' greedy generate and its assisted generation at batch 1: tokens/s and outputs."""
    import torch
    from transformers import AutoModelForCausalLM

    from tandem.model.loader import load_tokenizer

    info = load_tokenizer(d.target, progress=False)  # the folder, tokenizer and stop ids; no weights
    model = AutoModelForCausalLM.from_pretrained(info.path, dtype=dtype).to(device).eval()
    assist = dict(d.hf_assist)
    if "assistant_model" in assist:
        folder = load_tokenizer(assist["assistant_model"], progress=False).path
        assist["assistant_model"] = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    tok, eos = info.tokenizer, list(info.eos_token_ids)
    kw = dict(max_new_tokens=max_tokens, do_sample=False, temperature=None, top_p=None, top_k=None,
              eos_token_id=eos, pad_token_id=eos[0])
    out = {}
    for mode, extra in (("greedy", {}), ("assisted", assist)) if assist else (("greedy", {}),):
        tokens, seconds, outputs = 0, 0.0, []
        with torch.inference_mode():
            model.generate(**tok(prompts[0][1], return_tensors="pt").to(device), **{**kw, "max_new_tokens": 4}, **extra)
            for _, text in prompts:
                enc = tok(text, return_tensors="pt").to(device)
                t = now()
                ids = model.generate(**enc, **kw, **extra)
                sync(device)
                seconds += now() - t
                new = ids[0, enc.input_ids.shape[1] :].tolist()
                tokens += len(new)
                outputs.append(new)
        out[mode] = {"tok_s": tokens / seconds, "tokens": tokens, "seconds": seconds, "outputs": outputs}
    return out


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


def leviathan_check(fixed: Run, base: Run, engine, target: Target, prompt: str, max_tokens: int) -> dict:
    """Leviathan et al.'s predicted speedup from the fixed-gamma run's acceptance and the
    measured draft/target cost ratio c (one-row forwards of each model, taking turns),
    against the measured decode speedup."""
    shard = engine.group.shard
    position = len(target.loaded.tokenizer(prompt).input_ids) + max_tokens // 2  # a typical decode position
    t = one_row_ms({"target": (shard.model, shard.cache), "draft": (shard.drafter.model, shard.drafter.cache)}, position)
    lev = leviathan(fixed.acceptance_length, fixed.draft_tokens / max(1, fixed.drafts), t["draft"] / t["target"])
    lev["measured"] = fixed.decode_tok_s / base.decode_tok_s
    lev["fraction"] = lev["measured"] / lev["predicted"]
    lev["draft_ms"], lev["target_ms"] = t["draft"], t["target"]
    lev["acceptance_length"], lev["e2e_speedup"] = fixed.acceptance_length, fixed.tok_s / base.tok_s
    return lev


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
