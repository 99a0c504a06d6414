"""`tandem generate`: run prompts through the embedded engine (or N local gRPC shards)."""
from __future__ import annotations

import argparse
import json
import sys

from tandem.config_flags import add_flags, engine_options, given
from tandem.drafters.registry import drafter_kind
from tandem.errors import InvalidRequestError, TandemError


# the engine's batch is --batch prompts at once
ENGINE_OPTIONS = engine_options(exclude=("max_num_seqs",))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The prompts and their sampling, then a flag for every EngineConfig field."""
    p.add_argument("prompt", nargs="?", help="The prompt (raw text, as /v1/completions; --chat applies the chat template).")
    p.add_argument("--prompt-file", help="A file with one prompt per line.")
    p.add_argument("--max-tokens", type=int, default=64, help="Most tokens to generate per prompt.")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; above 0, lossless speculative sampling.")
    p.add_argument("--top-p", type=float, default=1.0, help="Nucleus sampling mass, in (0, 1].")
    p.add_argument("--top-k", type=int, default=0, help="Sample from the k most likely tokens (0 = off).")
    p.add_argument("--seed", type=int, default=None, help="Seed of the sampler, for reproducible sampling.")
    p.add_argument("--batch", type=int, default=8, help="How many prompts go into the engine at once (its max_num_seqs).")
    p.add_argument("--chat", action="store_true", help="Apply the tokenizer's chat template to each prompt.")
    p.add_argument("--json", action="store_true", help="One JSON object per line instead of text.")
    add_flags(p, ENGINE_OPTIONS)


def _prompts(args) -> list[str]:
    if args.prompt_file:
        with open(args.prompt_file, encoding="utf-8") as f:
            prompts = [line.rstrip("\n") for line in f if line.strip()]
    elif args.prompt is not None:
        prompts = [args.prompt]
    else:
        raise InvalidRequestError("prompt", "give a prompt or --prompt-file")
    if not prompts:
        raise InvalidRequestError("prompt-file", "has no prompts")
    return prompts


def run(args) -> int:
    from tandem.engine import Engine
    from tandem.sampling_params import SamplingParams

    try:
        prompts = _prompts(args)
        params = SamplingParams(
            max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed
        )
        if args.batch < 1:
            raise InvalidRequestError("batch", f"must be >= 1, got {args.batch}")
        options = given(args, ENGINE_OPTIONS)
        drafter = options.get("drafter", "ngram")
        if options.get("dflash_checkpoint") is not None and drafter_kind(drafter).checkpoint is None:
            raise InvalidRequestError("dflash_checkpoint", f"is for --drafter dflash, not {drafter!r}")
        engine = Engine.from_config(max_num_seqs=max(args.batch, 1), **options)
    except (TandemError, ValueError, FileNotFoundError) as e:
        print(f"tandem generate: {e}", file=sys.stderr)
        return 2
    try:
        for i in range(0, len(prompts), args.batch):
            group = prompts[i : i + args.batch]
            texts = [engine.chat_prompt([{"role": "user", "content": p}]) for p in group] if args.chat else group
            for prompt, out in zip(group, engine.generate(texts, params)):
                _print(prompt, out, args.json)
    finally:
        engine.close()
    return 0


def _print(prompt: str, out, as_json: bool) -> None:
    if as_json:
        print(
            json.dumps(
                {
                    "prompt": prompt,
                    "prompt_token_ids": out.prompt_token_ids,
                    "text": out.text,
                    "token_ids": out.token_ids,
                    "finish_reason": out.finish_reason,
                    "num_drafts": out.num_drafts,
                    "num_draft_tokens": out.num_draft_tokens,
                    "num_accepted_tokens": out.num_accepted_tokens,
                    **({"error": out.error} if out.error else {}),
                }
            ),
            flush=True,
        )
    else:
        print(out.text if out.finish_reason != "error" else f"[error: {out.error}]", flush=True)
