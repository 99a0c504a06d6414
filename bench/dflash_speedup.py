"""Speculative decoding speed-up with the DFlash drafter against no speculation and n-gram.

For each drafter and batch size b, b chat requests run together through the embedded
engine (greedy, stopping at the end of the turn or max_tokens); batch 1 runs its
requests one after another. Reported: output tokens per second, the speed-up over
no speculation at the same batch, and the mean acceptance length (1 + accepted
drafts / drafted rounds). The prompts are written here, apart from the training
script's templates, so they are held out from the drafter's training data.

  python bench/dflash_speedup.py                                  # GPU if there is one
  python bench/dflash_speedup.py --device cpu --batches 1 --max-tokens 96 --requests 3 --threads 2
  python bench/dflash_speedup.py --drafters none,dflash,dflash-eager --batches 1 --no-adaptive
  python bench/dflash_speedup.py --synthetic --batches 1,8        # random weights of the default
                                                                  # model's shape: timing only
  python bench/dflash_speedup.py --prompts heldout                # the training script's held-out prompts
  python bench/dflash_speedup.py --prompts eval --batches 1,8     # the evaluation set (general traffic)

--prompts: "bench" (default) are the chat questions below, of no family the drafter was
trained on; "heldout" are the 64 held-out prompts of scripts/train_dflash.py (template
families it trained on, with subjects and code tasks it never saw), on which the issue
states its acceptance target; "eval" is the evaluation set of bench/dflash_eval_prompts.py
(120 general prompts of eight kinds, chat and raw completions, written apart from every
training source), interleaved by kind.

Drafter "dflash-eager" is dflash with its CUDA graphs off (TANDEM_DFLASH_CUDA_GRAPHS=0);
"dflash+copyN" runs it with copy_min_ngram N ("dflash+copy0": the model's drafts alone).
Besides tokens/s each row reports the mean milliseconds of an engine tick (a verify
round), of its verify forward and of its propose. The table comes first; the last line
is one JSON object with every row.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how rainbows form.",
    "List three tips for staying focused while studying.",
    "What is the capital of France, and what is it famous for?",
    "Write a Python function that returns the squares of a list of numbers.",
    "Describe a sunny afternoon in a park.",
    "Why do leaves change color in autumn?",
    "Give me a recipe for a simple salad.",
    "What are the benefits of drinking enough water every day?",
    "Write a haiku about the sea.",
    "Explain what a noun is, with examples.",
    "How do airplanes stay in the air?",
    "Tell me a fun fact about octopuses.",
    "Write a thank-you note to a teacher.",
    "What is 12 times 11? Show your work.",
    "Summarize the story of Cinderella in a few sentences.",
    "What should I pack for a weekend camping trip?",
    "Explain the difference between weather and climate.",
    "Write a limerick about a cat who loves cheese.",
    "How does a refrigerator keep food cold?",
    "Give me five ideas for a rainy-day activity with kids.",
    "What is machine learning? Keep it simple.",
    "Write a short speech for a friend's birthday party.",
    "How can I improve my handwriting?",
    "Describe the life cycle of a butterfly.",
    "What are some good habits for a healthy morning routine?",
    "Write a SQL query that selects all users older than 30.",
    "Why is the sky blue?",
    "Explain how to change a flat tire, step by step.",
    "Write a product description for a reusable water bottle.",
    "What causes the seasons on Earth?",
    "Give me a short motivational quote and explain it.",
    "How do bees make honey?",
    "Write a short poem about autumn leaves.",
    "What is the difference between a virus and a bacterium?",
    "Describe your ideal vacation.",
    "Explain what gravity is to a child.",
    "Write a JavaScript function that checks if a string is empty.",
    "What are the main parts of a plant?",
    "How do I make a cup of tea?",
]



def heldout_prompts() -> list[str]:
    """The held-out prompts of scripts/train_dflash.py (its defaults: seed 0, 64 of them)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
    from dflash_prompts import make_prompts

    return make_prompts(16000, 64, 0)[1]


def eval_set_prompts() -> list[dict]:
    """The evaluation set (bench/dflash_eval_prompts.py: general prompts of eight kinds, chat
    and raw), interleaved by kind so that the first n requests cover every kind."""
    from dflash_eval_prompts import KINDS, eval_prompts

    by_kind = [eval_prompts((k,)) for k in KINDS]
    return [group[i] for i in range(max(map(len, by_kind))) for group in by_kind if i < len(group)]


DEFAULT_GAMMA = {"dflash": 7, "dflash-eager": 7, "ngram": 4, "none": 0}


def _hist(h) -> tuple[float, float]:
    """(sum, count) of a prometheus histogram."""
    total = count = 0.0
    for metric in h.collect():
        for sample in metric.samples:
            if sample.name.endswith("_sum"):
                total = sample.value
            elif sample.name.endswith("_count"):
                count = sample.value
    return total, count


def synthetic_shard(drafter: str, slots: int, device: str, dtype, layers: int = 3):
    """A ModelShard of the default model's shape with random weights, and a random DFlash
    drafter of the shipped layout (timing only: the drafts are garbage)."""
    import torch

    from tandem.drafters.dflash import DFlashConfig, DFlashDraftModel, DFlashDrafter
    from tandem.model.config import ModelConfig
    from tandem.model.kv_cache import PagedKVCache
    from tandem.model.llama import LlamaForCausalLM
    from tandem.shard.model_shard import ModelShard

    mc = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                     num_kv_heads=3, head_dim=64, rope_theta=100000.0, max_position_embeddings=8192,
                     tie_word_embeddings=True)
    torch.manual_seed(0)
    with torch.device(device):
        target = LlamaForCausalLM(mc).to(dtype).eval().requires_grad_(False)
    block_size = 16
    cache = PagedKVCache(mc.num_layers, slots * -(-1024 // block_size), block_size, mc.num_kv_heads, mc.head_dim,
                         dtype, device, scratch_blocks=1)  # every slot's 1024 positions
    dr = None
    if drafter.startswith("dflash"):
        dc = DFlashConfig(hidden_size=576, num_layers=layers, num_heads=9, num_kv_heads=3, head_dim=64,
                          intermediate_size=1024, vocab_size=49152, target_layer_ids=(1, 8, 15, 22, 29), block_size=8,
                          mask_token_id=16, num_target_layers=30, rope_theta=100000.0)
        model = DFlashDraftModel(dc).init_weights(0).to(device, dtype).eval().requires_grad_(False)
        dr = DFlashDrafter(model, target, num_slots=slots, num_blocks=cache.num_blocks, block_size=block_size,
                           max_seq_len=1024, cuda_graphs=None if drafter == "dflash" else False)
    return ModelShard(target, cache, num_slots=slots, max_model_len=1024, row_budget=max(256, slots * 16),
                      vocab_size=49152, drafter=dr)


class _Ids:
    chat_template = None

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return ""


def run(drafter: str, batches: list[int], *, requests: int, max_tokens: int, device: str, dtype: str,
        gamma: int | None = None, adaptive: bool = True, dflash_checkpoint: str | None = None,
        loaded=None, model: str | None = None, synthetic: bool = False,
        prompts: list[str] | None = None) -> tuple[list[dict], object]:
    """Rows {drafter, batch, tokens, seconds, tokens_per_s, acceptance_length, ms per tick /
    verify / propose} for each batch size, and the loaded target (pass it back as `loaded`
    to share the weights)."""
    import torch

    from tandem.config import EngineConfig
    from tandem.engine import Engine
    from tandem.sampling_params import SamplingParams
    from tandem.shard.factory import build_model_shard, resolve_device
    from tandem.shard.local_group import LocalShardGroup

    prompts = PROMPTS if prompts is None else prompts
    slots = max(batches)
    from common import copy_suffix

    drafter_name, copy_min = copy_suffix(drafter)  # dflash+copy2: copy_min_ngram 2
    engine_drafter = "dflash" if drafter.startswith("dflash") else drafter_name
    os.environ["TANDEM_DFLASH_CUDA_GRAPHS"] = "0" if drafter_name == "dflash-eager" else "1"
    # no prefix cache for any drafter: DFlash runs without one (it drafts from the target's
    # rows of the whole prompt), so every drafter's runs prefill their prompts alike
    config = EngineConfig(model=model, drafter=engine_drafter, dflash_checkpoint=dflash_checkpoint, max_num_seqs=slots,
                          max_model_len=1024, row_budget=max(256, slots * 16), device=device, dtype=dtype,
                          num_speculative_tokens=DEFAULT_GAMMA.get(drafter_name, 4) if gamma is None else gamma,
                          adaptive=adaptive, enable_prefix_caching=False, copy_min_ngram=copy_min)
    if synthetic:
        dev = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        dt = {"auto": torch.bfloat16 if dev.startswith("cuda") else torch.float32, "float32": torch.float32,
              "bfloat16": torch.bfloat16}[dtype]
        shard = synthetic_shard(drafter, slots, dev, dt)
        engine = Engine(LocalShardGroup(shard), _Ids(), (), config)
        g = torch.Generator().manual_seed(1)
        texts = [torch.randint(100, 40000, (40,), generator=g).tolist() for _ in prompts]
    else:
        shard, loaded = build_model_shard(config.shard_spec(), loaded=loaded, progress=False)
        engine = Engine(LocalShardGroup(shard), loaded.tokenizer, loaded.eos_token_ids, config, model_name=loaded.name)
        from dflash_eval_prompts import render

        texts = [render(loaded.tokenizer, p) if isinstance(p, dict) else engine.chat_prompt([{"role": "user", "content": p}])
                 for p in prompts]
    params = SamplingParams(max_tokens=max_tokens)
    # Warm-up on the largest batch for the whole length: the allocator's blocks, the
    # kernels' first calls and graph captures, which would otherwise land on whichever run
    # comes first.
    engine.generate(texts[-slots:], params)
    rows = []
    for b in batches:
        n = max(b, requests) if b == 1 else b
        chosen = [texts[i % len(texts)] for i in range(n)]
        if resolve_device(device).type == "cuda":
            engine.generate(chosen[:b], params)  # this batch size's CUDA-graph captures, untimed
        m = engine.metrics
        v0, p0 = _hist(m.verify_ms), _hist(m.propose_ms)
        ticks = 0
        outs, t0 = [], time.perf_counter()
        for i in range(0, n, b):
            ids = [engine.add_request(p, params) for p in chosen[i : i + b]]
            final = {}
            while len(final) < len(ids):
                for out in engine.step():
                    if out.finished:
                        final[out.request_id] = out
                ticks += 1
            outs += [final[r] for r in ids]
        secs = time.perf_counter() - t0
        v1, p1 = _hist(m.verify_ms), _hist(m.propose_ms)
        tokens = sum(len(o.token_ids) for o in outs)
        rounds = sum(o.num_drafts for o in outs)
        acc = sum(o.num_accepted_tokens for o in outs)
        rows.append({"drafter": drafter, "batch": b, "requests": n, "tokens": tokens, "seconds": round(secs, 3),
                     "tokens_per_s": round(tokens / secs, 1),
                     "acceptance_length": round(1 + acc / rounds, 3) if rounds else None,
                     "ms_per_tick": round(secs * 1000 / max(1, ticks), 3),
                     "verify_ms": round((v1[0] - v0[0]) / max(1, v1[1] - v0[1]), 3),
                     "propose_ms": round((p1[0] - p0[0]) / max(1, p1[1] - p0[1]), 3) if p1[1] > p0[1] else None,
                     "token_ids": [o.token_ids for o in outs]})
    engine.close()
    return rows, loaded


def main(argv=None) -> int:
    import torch

    from common import json_line, machine, print_table, setup_torch

    ap = argparse.ArgumentParser(description="DFlash speed-up benchmark")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--model", default=None)
    ap.add_argument("--drafters", default="none,ngram,dflash")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--requests", type=int, default=4, help="requests run one after another at batch 1")
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--no-adaptive", action="store_true", help="fixed draft count (the drafter's default)")
    ap.add_argument("--dflash-checkpoint", default=None, help="default: the shipped weights")
    ap.add_argument("--synthetic", action="store_true", help="random weights of the default model's shape (timing only)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("--prompts", choices=("bench", "heldout", "eval"), default="bench",
                    help="bench: this file's prompts; heldout: the training script's held-out prompts; eval: the "
                         "evaluation set of bench/dflash_eval_prompts.py (general prompts, chat and raw)")
    args = ap.parse_args(argv)
    prompts = {"bench": lambda: PROMPTS, "heldout": heldout_prompts, "eval": eval_set_prompts}[args.prompts]()
    setup_torch(args.threads)

    batches = [int(b) for b in args.batches.split(",")]
    table, loaded = [], None
    for drafter in args.drafters.split(","):
        rows, loaded = run(drafter, batches, requests=args.requests, max_tokens=args.max_tokens, device=args.device,
                           dtype=args.dtype, adaptive=not args.no_adaptive, dflash_checkpoint=args.dflash_checkpoint,
                           loaded=loaded, model=args.model, synthetic=args.synthetic, prompts=prompts)
        table += rows
        for r in rows:
            print(f"{drafter:>12} batch {r['batch']:>3}: {r['tokens_per_s']:8.1f} tok/s  acceptance length "
                  f"{r['acceptance_length'] or '-'}  {r['ms_per_tick']} ms/tick", flush=True)
    base = {r["batch"]: r for r in table if r["drafter"] == "none"}
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    out_rows = []
    for r in table:
        b = base.get(r["batch"])
        r["speedup"] = round(r["tokens_per_s"] / b["tokens_per_s"], 3) if b else None
        r["same_as_none"] = f"{sum(x == y for x, y in zip(r['token_ids'], b['token_ids']))}/{len(r['token_ids'])}" if b else None
        out_rows.append([r["drafter"], r["batch"], r["tokens_per_s"], r["speedup"], r["acceptance_length"],
                         r["ms_per_tick"], r["verify_ms"], r["propose_ms"], r["same_as_none"]])
    print()
    print_table(["drafter", "batch", "tok/s", "speed-up", "accept len", "ms/tick", "verify ms", "propose ms", "same as none"],
                out_rows, title=f"{name}, greedy, {args.prompts} prompts, max_tokens {args.max_tokens}, adaptive {not args.no_adaptive}"
                + (", SYNTHETIC weights" if args.synthetic else ""))
    result = {"bench": "dflash_speedup", "device": name, "prompts": args.prompts, "max_tokens": args.max_tokens, "adaptive": not args.no_adaptive,
              "synthetic": args.synthetic, "machine": machine(),
              "rows": [{k: v for k, v in r.items() if k != "token_ids"} for r in table]}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    json_line(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
