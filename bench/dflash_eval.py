"""DFlash acceptance on the evaluation set (bench/dflash_eval_prompts.py), per kind, in the engine.

Greedy, a fixed B-1 drafts a round (no adaptation: the acceptance length the issue's
targets are stated in), every prompt of the set through the embedded engine, once without
speculation and once with each drafter; reports the mean acceptance length (1 + accepted
drafts / drafted rounds) overall, per kind, per mode (chat / raw) and for the long
prompts, and how many outputs are identical to no-spec's (run float32 for that check: bf16
verify batches of another shape may round close calls the other way).

  python bench/dflash_eval.py --device cpu --max-tokens 64 --threads 2       # shipped weights
  python bench/dflash_eval.py --dflash-checkpoint DIR --drafters dflash,ngram
  python bench/dflash_eval.py --device cuda --drafters dflash,dflash:NEWDIR,ngram   # before / after
  python bench/dflash_eval.py --drafters dflash+copy0,dflash,ngram   # without / with the lookup of copies
The table comes first; the last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import copy_suffix  # noqa: E402
from dflash_eval_prompts import KINDS, eval_prompts, render  # noqa: E402


def acceptance_by_group(entries: list[dict], outs) -> dict:
    """{group: (acceptance length, rounds)} over all, each kind, each mode and the long prompts."""
    groups = defaultdict(lambda: [0, 0])
    for e, o in zip(entries, outs):
        for g in ("all", e["kind"], "mode:" + e["mode"]) + (("long",) if e["long"] else ()):
            groups[g][0] += o.num_drafts
            groups[g][1] += o.num_accepted_tokens
    return {g: (round(1 + a / r, 3) if r else None, r) for g, (r, a) in groups.items()}


def main(argv=None) -> int:
    import torch

    from tandem.config import EngineConfig
    from tandem.engine import Engine
    from tandem.sampling_params import SamplingParams

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", help="float32 (default, for the identity check), bfloat16 or auto")
    ap.add_argument("--model", default=None)
    ap.add_argument("--drafters", default="dflash",
                    help="comma-separated (dflash:DIR for those weights, dflash+copy3 for copy_min_ngram 3, dflash+copy0 "
                         "for the model's drafts alone); "
                         "no-spec always runs first")
    ap.add_argument("--dflash-checkpoint", default=None, help="default: the shipped weights")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--batch", type=int, default=32, help="requests the engine runs together")
    ap.add_argument("--kinds", default=None, help="comma-separated subset of " + ",".join(KINDS))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    entries = eval_prompts(tuple(args.kinds.split(",")) if args.kinds else None)
    params = SamplingParams(max_tokens=args.max_tokens)
    outs, secs, tokenizer = {}, {}, None
    for drafter in ["none"] + [d for d in args.drafters.split(",") if d != "none"]:
        name, _, ckpt = drafter.partition(":")  # dflash:DIR: those weights
        name, copy_min = copy_suffix(name)  # dflash+copy3: copy_min_ngram 3
        gamma = args.block_size - 1 if name == "dflash" else 4
        # no prefix cache for any drafter: DFlash runs without one (it drafts from the
        # target's rows of the whole prompt), so every run prefills its prompts alike
        config = EngineConfig(model=args.model, drafter=name, dflash_checkpoint=ckpt or args.dflash_checkpoint,
                              device=args.device, dtype=args.dtype, max_num_seqs=args.batch, max_model_len=1024,
                              row_budget=1024, adaptive=False, num_speculative_tokens=gamma,
                              enable_prefix_caching=False, copy_min_ngram=copy_min)
        engine = Engine.from_config(config, progress=False)
        tokenizer = engine.tokenizer
        texts = [render(tokenizer, e) for e in entries]
        t0 = time.time()
        outs[drafter] = engine.generate(texts, params)
        secs[drafter] = time.time() - t0
        engine.close()
        print(f"{drafter}: {sum(len(o.token_ids) for o in outs[drafter])} tokens in {secs[drafter]:.1f} s", flush=True)
    result = {"bench": "dflash_eval", "device": args.device, "dtype": args.dtype, "max_tokens": args.max_tokens,
              "prompts": len(entries), "checkpoint": args.dflash_checkpoint or "shipped", "drafters": {}}
    groups = ["all", *[k for k in KINDS if any(e["kind"] == k for e in entries)], "mode:chat", "mode:raw", "long"]
    print(f"\n{'group':>14} " + " ".join(f"{d:>16}" for d in outs if d != "none"))
    table = {d: acceptance_by_group(entries, o) for d, o in outs.items() if d != "none"}
    for g in groups:
        print(f"{g:>14} " + " ".join(f"{str(table[d].get(g, (None, 0))[0]):>9} ({table[d].get(g, (None, 0))[1]:>4})"
                                     for d in table))
    for d in table:
        same = sum(a.token_ids == b.token_ids for a, b in zip(outs["none"], outs[d]))
        diff = [e["id"] for e, a, b in zip(entries, outs["none"], outs[d]) if a.token_ids != b.token_ids]
        print(f"{d}: {same}/{len(entries)} outputs identical to no-spec" + (f" (differ: {diff})" if diff else "")
              + f"; {secs[d]:.1f} s vs {secs['none']:.1f} s no-spec")
        result["drafters"][d] = {"acceptance": {g: v[0] for g, v in table[d].items()},
                                 "rounds": {g: v[1] for g, v in table[d].items()},
                                 "identical": same, "differ": diff, "seconds": round(secs[d], 1)}
    result["none_seconds"] = round(secs["none"], 1)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
