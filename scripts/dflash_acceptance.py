"""How well a DFlash drafter drafts (scripts/train_dflash.py): the offline acceptance over
uniform anchors, the same walked as the engine's rounds, and the engine's own on held-out
prompts."""
from __future__ import annotations

import time

import torch

from dflash_trainer import block_loss, sample_anchors


@torch.no_grad()
def offline_acceptance(model, target, data, per_seq: int = 64, seed: int = 1) -> float:
    """1 + the mean count of leading drafts equal to the target's greedy tokens, over
    random anchors of the held-out continuations."""
    tokens, feats, prompt_len, seq_len = data
    gen = torch.Generator(device=tokens.device).manual_seed(seed)
    accepted = []
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if tokens.device.type == "cuda" else torch.autocast("cpu", enabled=False)
    for b0 in range(0, tokens.shape[0], 16):
        sl = slice(b0, b0 + 16)
        anchors = sample_anchors(prompt_len[sl], seq_len[sl], per_seq, gen)
        with amp:
            _, acc = block_loss(model, target, tokens[sl], feats[sl], prompt_len[sl], seq_len[sl], anchors, 4.0)
        accepted.append(acc.flatten())
    return 1.0 + torch.cat(accepted).float().mean().item()


@torch.no_grad()
def walked_acceptance(model, target, data, max_new: int) -> float:
    """The acceptance length the engine measures (greedy, B-1 drafts a round, no
    adaptation), from the accepted count at EVERY anchor: walk each continuation as the
    engine does, a round at the first generated token, the next one accepted + 1 later,
    the drafts capped by what max_new still allows. Uniform anchors (offline_acceptance)
    weigh every position alike; rounds land more often where drafts fail (an easy stretch
    is crossed in few rounds), so this is lower."""
    tokens, feats, prompt_len, seq_len = data
    B = model.config.block_size
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if tokens.device.type == "cuda" else torch.autocast("cpu", enabled=False)
    rounds = accepted = 0
    for i in range(tokens.shape[0]):
        p0, s = int(prompt_len[i]), int(seq_len[i])
        if s - 1 <= p0:
            continue
        anchors = torch.arange(p0, s - 1, device=tokens.device)[None]
        with amp:
            _, acc = block_loss(model, target, tokens[i : i + 1, :s], feats[i : i + 1, :s], prompt_len[i : i + 1],
                                seq_len[i : i + 1], anchors, 4.0)
        acc = acc[0].tolist()
        p, out = p0, 1  # the first token comes from the prefill
        while p < s - 1 and out < max_new:
            g = min(B - 1, max_new - out - 1)
            if g <= 0:
                break
            a = min(acc[p - p0], g)
            rounds, accepted = rounds + 1, accepted + a
            p, out = p + a + 1, out + a + 1
    return 1.0 + accepted / max(1, rounds)


def engine_acceptance(args, checkpoint: str, prompts: list[str], log) -> dict:
    """The engine's own numbers on held-out prompts: greedy, B-1 drafts every round."""
    from tandem.config import EngineConfig
    from tandem.engine import Engine
    from tandem.sampling_params import SamplingParams

    # no prefix cache for either: DFlash runs without one (it drafts from the target's rows
    # of the whole prompt), so both prefill their prompts alike
    # float32: bf16 verify batches of another shape than no-spec's may round close calls the other way
    common = dict(model=args.model, device=args.device, dtype="float32", max_num_seqs=min(64, len(prompts)),
                  max_model_len=1024, row_budget=1024, adaptive=False, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=args.gen_tokens)
    result = {}
    for drafter in ("none", "dflash") if args.engine_baseline else ("dflash",):
        engine = Engine.from_config(EngineConfig(drafter=drafter, dflash_checkpoint=checkpoint,
                                                 num_speculative_tokens=args.block_size - 1, **common), progress=False)
        t0 = time.time()
        outs = engine.generate([engine.chat_prompt([{"role": "user", "content": p}]) for p in prompts], params)
        secs = time.time() - t0
        engine.close()
        result[drafter] = outs
        drafts = sum(o.num_drafts for o in outs)
        acc = sum(o.num_accepted_tokens for o in outs)
        log(f"engine {drafter}: {sum(len(o.token_ids) for o in outs)} tokens in {secs:.1f} s"
            + (f", acceptance length {1 + acc / max(1, drafts):.3f} over {drafts} rounds" if drafts else ""))
    same = sum(a.token_ids == b.token_ids for a, b in zip(result["none"], result["dflash"])) if "none" in result else None
    drafts = sum(o.num_drafts for o in result["dflash"])
    acc = sum(o.num_accepted_tokens for o in result["dflash"])
    return {"acceptance_length": 1 + acc / max(1, drafts), "rounds": drafts, "identical_outputs": same,
            "prompts": len(prompts)}

