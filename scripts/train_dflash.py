"""Train a DFlash drafter for a target model from the target's own greedy continuations.

No data set can be downloaded here, so the script makes its own:
  1. prompts (scripts/dflash_prompts.py, scripts/dflash_general_prompts.py): chat requests
     built from templates x subjects (stories, explanations, lists, code, arithmetic, ...),
     optionally with style requests (--modifiers), user turns the target writes itself
     (--num-self-prompts, as Magpie does), training-only prompts from more subjects,
     templates and code tasks (--extra-prompts), and general traffic (--general-prompts:
     eight kinds of chat request, some around a passage, and raw completions of the text
     that ships in the installed Python packages; every one overlapping the evaluation set
     bench/dflash_eval_prompts.py is dropped). A set of subjects and code tasks is held out
     for evaluation only; the held-out prompts follow --num-prompts, --num-eval and --seed
     alone, so a new corpus (--data-seed) keeps the same held-out set;
  2. data (scripts/dflash_corpus.py, scripts/dflash_training_data.py): the target's
     continuation of every prompt (batched decoding with our own forward and KV cache;
     greedy, or for --sample-share of them sampled at --temperature, --top-k), capturing
     the drafter's target layers on the way, so the features are what the engine's
     prefill/verify forwards hand the drafter;
  3. training (scripts/dflash_trainer.py, scripts/dflash_drafter.py): random anchors p in
     each response; the block [token p, mask x (B-1)] sees the target features of
     positions < p and learns the tokens p+1..p+B-1 (cross-entropy through the target's
     frozen LM head, weighted exp(-(j-1)/decay) by block position j, as in the DFlash
     paper); many blocks per sequence in one forward, each masked to its own context and
     its own rows; new weights, or a warm start from a checkpoint (--init-from);
  4. evaluation on held-out prompts (scripts/dflash_acceptance.py): the offline acceptance
     (leading drafts equal to the target's greedy tokens, averaged over uniform anchors),
     the same walked as the engine's rounds (a round at the first generated token, the
     next one accepted + 1 later), and the engine's own (drafter=dflash, greedy, B-1
     drafts a round, no adaptation); the walked and engine numbers sit below the offline
     one (scripts/dflash_notes.md says why).

With --draft-vocab-coverage < 1 (default 0.999) the drafter drafts from the most frequent
generated tokens only, the head being those rows in training and in the engine (a CPU
propose then scores ~21k rows instead of 49k); --revocab re-chooses the rows of a warm
start on the new corpus (--draft-vocab-size N: its N most frequent). The weights are saved
in bf16 in the z-lab checkpoint layout, the run's flags and numbers under "tandem" in
config.json (a warm start keeps its predecessor's under "previous_train").

Where the corpus lives: by default the continuations and their features are generated in
memory and trained on in one process. A corpus whose generation and training do not fit
one device call (600 s) takes two calls on one warm machine: --save-tokens DIR generates
the continuations alone (tokens, no features) in shuffled chunks under DIR until
--gen-seconds; the next call trains with --load-tokens DIR, which rebuilds the features by
one causal prefill per whole sequence and keeps them packed without padding
(--max-train-rows caps them). --one-call generates prompts of any length (chunked by
length, --pos-budget positions a chunk, until --gen-seconds), then rebuilds the features
and trains in the same process, or with --save-tokens DIR saves the tokens (and the
per-kind counts) for a later --load-tokens DIR. --shard I/N splits the chunks of
--save-tokens (without --one-call) and of --load-tokens between N processes, one a GPU.

The shipped weights (src/tandem/drafters/dflash/weights/smollm2) came from two calls on one
warm H200, a saved general-traffic corpus and then a warm start from the weights before
them (PREVIOUS):

  python scripts/train_dflash.py --model smollm2.gguf --device cuda --out UNUSED --one-call \
      --num-prompts 16000 --extra-prompts 20000 --max-template-prompts 16000 --general-prompts 44000 \
      --num-self-prompts 4000 --data-seed 3 --sample-share 0.25 --train-gen-tokens 192 --gen-batch 4000 \
      --gen-seconds 330 --max-train-rows 14000000 --save-tokens TOKDIR
  python scripts/train_dflash.py --model smollm2.gguf --device cuda --out OUTDIR --num-prompts 16000 \
      --extra-prompts 20000 --max-template-prompts 16000 --general-prompts 44000 --sample-share 0.25 \
      --data-seed 3 --load-tokens TOKDIR --max-train-rows 14000000 --init-from PREVIOUS --revocab \
      --draft-vocab-size 20736 --lr 5e-4 --train-seconds 100000 --total-seconds 470 --eval-every 2000 \
      --engine-baseline

scripts/dflash_notes.md has every run's recipe and numbers, the device workflow (the GGUF
over the carry limit, a checkpoint brought back in parts) and what is open. Regularisers
for the generalisation gap: --weight-decay, --dropout (residual branches, training only),
--feature-noise (Gaussian, times each target layer row's RMS), --label-smoothing;
--eval-every logs the held-out offline and walked numbers while training.

A small CPU run checks the pipeline:
  python scripts/train_dflash.py --device cpu --num-prompts 24 --num-eval 4 --gen-tokens 24 \
      --gen-batch 8 --batch 4 --blocks-per-seq 4 --train-seconds 20 --out /tmp/dflash-smoke
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from tandem.drafters.dflash import save_dflash_checkpoint  # noqa: E402
from tandem.drafters.dflash.model import spread_layer_ids  # noqa: E402
from tandem.model.loader import load_model  # noqa: E402

# the steps' modules; their names stay importable from here (tests use train_dflash.block_loss, ...)
from dflash_acceptance import engine_acceptance, offline_acceptance, walked_acceptance  # noqa: E402
from dflash_corpus import (KV_BLOCK, Packed, generate_packed, greedy_with_features, load_token_chunks,  # noqa: E402
                           pack, prefill_features, save_token_chunk)
from dflash_drafter import draft_vocab_of, draft_vocab_top, generated, in_vocab_share, make_drafter  # noqa: E402
from dflash_prompts import bench_prompts, chat_ids, make_extra_prompts, make_prompts, self_sampled_prompts  # noqa: E402
from dflash_trainer import add_dropout, block_hidden, block_loss, noisy_features, sample_anchors, train  # noqa: E402
from dflash_training_data import training_data, training_prompts  # noqa: E402

__all__ = [
    "KV_BLOCK", "Packed", "add_dropout", "bench_prompts", "block_hidden", "block_loss", "chat_ids", "draft_vocab_of",
    "draft_vocab_top", "engine_acceptance", "generate_packed", "generated", "greedy_with_features", "in_vocab_share",
    "load_token_chunks", "main", "make_drafter", "make_extra_prompts", "make_parser", "make_prompts", "noisy_features",
    "offline_acceptance", "pack", "prefill_features", "sample_anchors", "save_token_chunk", "self_sampled_prompts",
    "train", "training_data", "training_prompts", "walked_acceptance",
]


def make_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="target model spec (default: the default model)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", required=True, help="checkpoint folder to write")
    ap.add_argument("--num-prompts", type=int, default=10000, help="template prompts")
    ap.add_argument("--num-self-prompts", type=int, default=0, help="also prompts the target writes itself")
    ap.add_argument("--modifiers", action="store_true", help="end most template prompts with a style request")
    ap.add_argument("--num-eval", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=256)
    ap.add_argument("--gen-batch", type=int, default=1024)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--intermediate-size", type=int, default=768)
    ap.add_argument("--target-layers", type=int, default=5, help="how many target layers the drafter reads")
    ap.add_argument("--mask-token", default="<empty_output>", help="a special token never seen in chats")
    ap.add_argument("--batch", type=int, default=96, help="sequences per step")
    ap.add_argument("--blocks-per-seq", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--loss-decay", type=float, default=4.0)
    ap.add_argument("--max-steps", type=int, default=20000)
    ap.add_argument("--train-seconds", type=float, default=220.0)
    ap.add_argument("--total-seconds", type=float, default=None, help="cut training so the whole run fits this")
    ap.add_argument("--draft-vocab-coverage", type=float, default=0.999,
                    help="draft only the most frequent generated tokens covering this share (1 = the whole vocabulary); "
                         "the head is then that many rows, in training and in the engine")
    ap.add_argument("--log-every", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-engine-eval", action="store_true")
    ap.add_argument("--engine-baseline", action="store_true", help="also run the engine without drafts and compare outputs")
    ap.add_argument("--extra-prompts", type=int, default=0,
                    help="also this many training-only prompts from EXTRA_SUBJECTS/EXTRA_TEMPLATES (held-out prompts unchanged)")
    ap.add_argument("--save-tokens", default=None, metavar="DIR",
                    help="only generate: the training prompts' greedy continuations (tokens, no features), shuffled, "
                         "in chunks of --gen-batch saved under DIR until --gen-seconds have passed; then exit")
    ap.add_argument("--gen-seconds", type=float, default=1e9, help="with --save-tokens: start no chunk after this")
    ap.add_argument("--load-tokens", default=None, metavar="DIR",
                    help="train on the continuations --save-tokens wrote (features rebuilt by one prefill a sequence)")
    ap.add_argument("--max-train-rows", type=int, default=None, help="with --load-tokens: at most this many positions")
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--dropout", type=float, default=0.0, help="dropout on the drafter's residual branches (training only)")
    ap.add_argument("--feature-noise", type=float, default=0.0,
                    help="Gaussian noise on the target features in training, times each layer row's RMS")
    ap.add_argument("--label-smoothing", type=float, default=0.0)
    ap.add_argument("--eval-every", type=int, default=0, help="held-out offline/walked acceptance every this many steps")
    ap.add_argument("--data-seed", type=int, default=None,
                    help="seed of the extra and self-written prompts and of the chunk order (default --seed); the "
                         "held-out prompts follow --seed alone, so a new corpus keeps the same held-out set")
    ap.add_argument("--shard", default="0/1", metavar="I/N",
                    help="with --save-tokens: generate only chunks I, I+N, ... (N processes, one a GPU, one folder); "
                         "with --load-tokens: train only on those chunks")
    ap.add_argument("--init-from", default=None, metavar="DIR",
                    help="start from this checkpoint (its architecture and draft vocabulary) instead of random weights")
    ap.add_argument("--general-prompts", type=int, default=0,
                    help="also this many general prompts (scripts/dflash_general_prompts.py: eight kinds of chat request "
                         "and raw completions of the installed packages' text), decontaminated against the eval set")
    ap.add_argument("--max-template-prompts", type=int, default=None,
                    help="train on at most this many of the template and extra prompts (a seeded sample; the held-out "
                         "set is unchanged)")
    ap.add_argument("--sample-share", type=float, default=0.0,
                    help="share of the training prompts whose continuation is sampled (--temperature, --top-k) "
                         "instead of greedy")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--train-gen-tokens", type=int, default=None, help="continuation length of the training data "
                    "(default --gen-tokens; the held-out continuations keep --gen-tokens)")
    ap.add_argument("--one-call", action="store_true",
                    help="generate the tokens alone (prompts of any length, chunked by length, until --gen-seconds), then "
                         "rebuild the features by prefill and train, all in this process; with --save-tokens DIR, "
                         "save the tokens there and exit instead (a later call trains on them with --load-tokens DIR)")
    ap.add_argument("--pos-budget", type=int, default=1_200_000,
                    help="with --one-call: at most this many positions (batch x longest sequence) a generation chunk")
    ap.add_argument("--max-prompt-tokens", type=int, default=900, help="drop longer training prompts")
    ap.add_argument("--draft-vocab-size", type=int, default=None,
                    help="with --revocab: the draft vocabulary is this corpus's N most frequent generated tokens "
                         "(instead of --draft-vocab-coverage with the old rows kept)")
    ap.add_argument("--revocab", action="store_true",
                    help="with --init-from: a new draft vocabulary from this corpus (--draft-vocab-coverage); the "
                         "weights do not depend on it (the head is the target's)")
    return ap


def main(argv=None) -> int:
    ap = make_parser()
    args = ap.parse_args(argv)
    data_seed = args.seed if args.data_seed is None else args.data_seed
    shard = tuple(int(x) for x in args.shard.split("/"))
    if len(shard) != 2 or not 0 <= shard[0] < shard[1]:
        ap.error(f"--shard {args.shard!r}: want I/N with 0 <= I < N")

    t_begin = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t_begin:6.1f}s] {msg}", flush=True)

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = load_model(args.model, dtype=dtype, device=device, progress=False)
    tc = target.config
    log(f"target {target.name}: {tc.num_layers} layers, hidden {tc.hidden_size}, vocab {tc.vocab_size}")
    tok = target.tokenizer
    mask_id = tok.convert_tokens_to_ids(args.mask_token)
    layer_ids = spread_layer_ids(tc.num_layers, args.target_layers)

    train_prompts, eval_prompts = training_prompts(args, data_seed, log)
    eos = set(target.eos_token_ids)
    data = training_data(args, target, device, train_prompts, layer_ids, eos, data_seed, shard, t_begin, log)
    if data is None:  # --save-tokens: the corpus is saved for a later call's --load-tokens
        return 0
    train_data, n_prompts, n_self, gen_tokens, train_gen = data
    del data  # train_data alone holds the corpus, freed before the engine check
    eval_data = greedy_with_features(target.model, [chat_ids(tok, p) for p in eval_prompts], layer_ids,
                                     args.gen_tokens, args.gen_batch, eos)

    model = make_drafter(args, target, device, layer_ids, mask_id, train_data, eval_data, log)
    if args.dropout > 0:
        add_dropout(model, args.dropout)
    if args.total_seconds:
        args.train_seconds = max(10.0, min(args.train_seconds, args.total_seconds - (time.time() - t_begin) - 40))

    def evaluate() -> str:
        return (f"held-out offline {offline_acceptance(model, target.model, eval_data):.3f}, "
                f"walked {walked_acceptance(model, target.model, eval_data, args.gen_tokens):.3f}")

    if args.eval_every and args.init_from:  # where a warm start begins
        model.eval()
        log(f"step 0 (init): {evaluate()}")
        model.train()
    train(model, target.model, train_data, args, log, evaluate)
    del train_data  # the engine check below needs none of it (a large corpus holds most of the GPU)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    model.eval()
    offline = offline_acceptance(model, target.model, eval_data)
    walked = walked_acceptance(model, target.model, eval_data, args.gen_tokens)
    log(f"held-out offline acceptance length (block {args.block_size}): {offline:.3f} over uniform anchors, "
        f"{walked:.3f} walked as the engine's rounds")
    # bench/dflash_speedup.py's prompts: written apart from the templates, so they show how
    # far the drafter carries beyond the training prompts' style
    bench_data = greedy_with_features(target.model, [chat_ids(tok, p) for p in bench_prompts()], layer_ids,
                                      args.gen_tokens, args.gen_batch, eos)
    bench_walked = walked_acceptance(model, target.model, bench_data, args.gen_tokens)
    log(f"bench prompts: {bench_walked:.3f} walked")
    info = {"target_model": target.name, "train": {
        "prompts": n_prompts, "self_written_prompts": n_self, "generated_tokens": gen_tokens, "gen_tokens": args.gen_tokens,
        "layers": args.layers, "batch": args.batch, "blocks_per_seq": args.blocks_per_seq, "steps": args.steps_done,
        "train_seconds": round(args.train_seconds_done), "seconds": round(time.time() - t_begin),
        "heldout_offline_acceptance_length": round(offline, 3), "heldout_walked_acceptance_length": round(walked, 3),
        "bench_prompts_walked_acceptance_length": round(bench_walked, 3),
        "script": "scripts/train_dflash.py", "seed": args.seed}}
    if getattr(args, "data_kinds", None):
        info["train"]["data_kinds"] = args.data_kinds
        info["train"]["train_gen_tokens"] = train_gen
    for name in ("general_prompts", "max_template_prompts", "sample_share", "temperature", "revocab",
                 "draft_vocab_size", "extra_prompts", "weight_decay", "dropout", "feature_noise", "label_smoothing", "lr", "data_seed",
                 "init_from", "shard"):  # non-defaults only
        if getattr(args, name) != ap.get_default(name):
            info["train"][name] = getattr(args, name)
    if args.init_from:  # a warm start keeps the history of the weights it started from
        with open(os.path.join(args.init_from, "config.json")) as f:
            before = json.load(f).get("tandem", {})
        if "train" in before:
            info["previous_train"] = before["train"]
    save_dflash_checkpoint(model, args.out, extra_config={"tandem": info})
    log(f"saved {args.out}")
    if not args.skip_engine_eval:
        res = engine_acceptance(args, args.out, eval_prompts, log)
        log(f"held-out engine acceptance length (block {args.block_size}, greedy): {res['acceptance_length']:.3f}"
            + (f"; {res['identical_outputs']}/{res['prompts']} outputs identical to no-spec" if args.engine_baseline else ""))
        info["train"]["heldout_engine"] = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()}
        save_dflash_checkpoint(model, args.out, extra_config={"tandem": info})
    print(json.dumps(info), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
