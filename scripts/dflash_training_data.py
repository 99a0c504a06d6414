"""The prompts and the training corpus a DFlash training run's flags ask for
(scripts/train_dflash.py): generated in one process (--one-call, general traffic
included), generated and saved for a later call (--save-tokens), loaded from one
(--load-tokens), or generated with features in memory."""
from __future__ import annotations

import json
import os
import random
import time

import torch

from dflash_corpus import (Packed, generate_packed, greedy_with_features, load_token_chunks, prefill_features,
                           save_token_chunk)
from dflash_prompts import chat_ids, make_extra_prompts, make_prompts, self_sampled_prompts


def training_prompts(args, data_seed: int, log) -> tuple[list[str], list[str]]:
    """The training prompts (template and extra ones, at most --max-template-prompts of
    them) and the held-out prompts, which follow --num-prompts, --num-eval and --seed alone."""
    train_prompts, eval_prompts = make_prompts(args.num_prompts, args.num_eval, args.seed, args.modifiers)
    if args.extra_prompts:
        extra = make_extra_prompts(args.extra_prompts, args.seed, avoid=frozenset(train_prompts) | frozenset(eval_prompts),
                                   sample_seed=data_seed)
        log(f"{len(extra)} extra training prompts, e.g. {extra[:3]}")
        train_prompts = train_prompts + extra
    if args.max_template_prompts is not None and len(train_prompts) > args.max_template_prompts:
        train_prompts = random.Random(data_seed + 23).sample(train_prompts, args.max_template_prompts)
    log(f"{len(train_prompts)} training prompts, {len(eval_prompts)} held-out; e.g. {train_prompts[:3]} / {eval_prompts[:2]}")
    return train_prompts, eval_prompts


def training_data(args, target, device, train_prompts: list[str], layer_ids, eos: set[int], data_seed: int,
                  shard: tuple[int, int], t_begin: float, log):
    """The training corpus: (data, prompts, self-written prompts, generated tokens,
    continuation length), data a Packed with features (--one-call, --load-tokens) or padded
    (tokens, feats, prompt_len, seq_len); None where the run only saved tokens (--save-tokens)."""
    tok = target.tokenizer
    train_gen = args.train_gen_tokens or args.gen_tokens
    if args.one_call:
        from dflash_general_prompts import decontaminate, general_prompts

        prompt_ids = [chat_ids(tok, p) for p in train_prompts]
        kinds = ["template"] * len(prompt_ids)
        texts = list(train_prompts)
        if args.general_prompts:
            t0 = time.time()
            general = general_prompts(args.general_prompts, args.seed, sample_seed=data_seed)
            for g in general:
                if g["mode"] == "raw":
                    prompt_ids.append(tok(g["text"]).input_ids)
                else:
                    prompt_ids.append(tok(tok.apply_chat_template(g["messages"], tokenize=False,
                                                                  add_generation_prompt=True)).input_ids)
                kinds.append(g["kind"])
                texts.append(g["text"])
            log(f"{len(general)} general prompts in {time.time() - t0:.1f} s, e.g. {[g['text'][:80] for g in general[:4]]}")
        if args.num_self_prompts:
            own = self_sampled_prompts(target.model, tok, args.num_self_prompts, args.gen_batch, seed=data_seed)
            log(f"{len(own)} self-written prompts, e.g. {[tok.decode(p) for p in own[:3]]}")
            prompt_ids += own
            kinds += ["self"] * len(own)
            texts += [tok.decode(p) for p in own]
        keep = [ok and len(p) <= args.max_prompt_tokens for ok, p in zip(decontaminate(texts), prompt_ids)]
        log(f"decontamination and length: {keep.count(False)} of {len(keep)} prompts dropped")
        prompt_ids = [p for p, k in zip(prompt_ids, keep) if k]
        kinds = [c for c, k in zip(kinds, keep) if k]
        rs = random.Random(data_seed + 29)
        sample = [rs.random() < args.sample_share for _ in prompt_ids]
        packed, done = generate_packed(target.model, prompt_ids, sample, train_gen, args.gen_batch, args.pos_budget, eos,
                                       t_begin + args.gen_seconds, args.temperature, args.top_k, data_seed, log)
        if args.max_train_rows and packed.tokens.shape[0] > args.max_train_rows:
            n = int((torch.cumsum(packed.seq_len, 0) <= args.max_train_rows).sum())
            keep_rows = int(packed.seq_len[:n].sum())
            packed = Packed(packed.tokens[:keep_rows], None, packed.off[:n], packed.prompt_len[:n], packed.seq_len[:n])
            done = done[:n]
        train_data = packed
        n_prompts = train_data.n
        gen_tokens = int((train_data.seq_len - train_data.prompt_len).sum())
        n_self = sum(kinds[i] == "self" for i in done)
        per_kind = {}
        gen_per = (train_data.seq_len - train_data.prompt_len).tolist()
        plen = train_data.prompt_len.tolist()
        for j, i in enumerate(done):
            c = per_kind.setdefault(kinds[i], [0, 0, 0, 0])
            c[0] += 1
            c[1] += gen_per[j]
            c[2] += plen[j]
            c[3] += sample[i]
        args.data_kinds = {k: {"prompts": v[0], "generated_tokens": v[1], "prompt_tokens": v[2], "sampled": v[3]}
                           for k, v in sorted(per_kind.items())}
        if args.save_tokens:  # the corpus for a later call's --load-tokens (a call cannot hold generation and training)
            os.makedirs(args.save_tokens, exist_ok=True)
            save_token_chunk(os.path.join(args.save_tokens, "chunk0000.pt"),
                             (train_data.tokens, None, train_data.prompt_len, train_data.seq_len),
                             [kinds[i] == "self" for i in done], packed=True)
            meta = {"prompts": n_prompts, "generated_tokens": gen_tokens, "self_written_prompts": n_self,
                    "train_gen_tokens": train_gen, "data_kinds": args.data_kinds}
            with open(os.path.join(args.save_tokens, "corpus.json"), "w") as f:
                json.dump(meta, f)
            log(f"saved {n_prompts} continuations ({train_data.tokens.shape[0]} rows) to {args.save_tokens}")
            print(json.dumps(meta), flush=True)
            return None
        prefill_features(target.model, train_data, layer_ids)
        if device.type == "cuda":
            torch.cuda.synchronize()
        log(f"data: features of {train_data.tokens.shape[0]} rows rebuilt; {gen_tokens} generated tokens from {n_prompts} "
            f"prompts; per kind {args.data_kinds}")
    elif args.load_tokens:
        train_data = load_token_chunks(args.load_tokens, device, args.max_train_rows, shard)
        n_prompts = train_data.n
        log(f"loaded {n_prompts} continuations, {train_data.tokens.shape[0]} rows")
        corpus = os.path.join(args.load_tokens, "corpus.json")
        if os.path.exists(corpus):  # a --one-call corpus: what went in, per kind
            with open(corpus) as f:
                meta = json.load(f)
            args.data_kinds, train_gen = meta["data_kinds"], meta["train_gen_tokens"]
        prefill_features(target.model, train_data, layer_ids)
        if device.type == "cuda":
            torch.cuda.synchronize()
        gen_tokens = int((train_data.seq_len - train_data.prompt_len).sum())
        log(f"data: features of {train_data.tokens.shape[0]} rows rebuilt; {gen_tokens} generated tokens "
            f"({gen_tokens / n_prompts:.0f} per prompt)")
        n_self = None if train_data.self_written is None else int(train_data.self_written.sum())
    else:
        prompt_ids = [chat_ids(tok, p) for p in train_prompts]
        if args.num_self_prompts:
            own = self_sampled_prompts(target.model, tok, args.num_self_prompts, args.gen_batch, seed=data_seed)
            log(f"{len(own)} self-written prompts, e.g. {[tok.decode(p) for p in own[:3]]}")
            prompt_ids += own
        n_prompts, n_self = len(prompt_ids), len(prompt_ids) - len(train_prompts)
        if args.save_tokens:
            order = list(range(len(prompt_ids)))
            random.Random(data_seed + 11).shuffle(order)
            os.makedirs(args.save_tokens, exist_ok=True)
            done = rows = 0
            last = 0.0
            for k, c0 in enumerate(range(0, len(order), args.gen_batch)):
                if k % shard[1] != shard[0]:
                    continue
                if time.time() - t_begin + last > args.gen_seconds:
                    break
                t0 = time.time()
                chunk = [prompt_ids[i] for i in order[c0 : c0 + args.gen_batch]]
                data = greedy_with_features(target.model, chunk, (), args.gen_tokens, args.gen_batch, eos, features=False)
                save_token_chunk(os.path.join(args.save_tokens, f"chunk{k:04d}.pt"), data,
                                 [i >= len(train_prompts) for i in order[c0 : c0 + args.gen_batch]])
                done, rows = done + len(chunk), rows + int((data[3] - data[2]).sum())
                last = time.time() - t0
                log(f"chunk {k}: {len(chunk)} prompts in {last:.1f} s; {done} prompts, {rows} generated tokens so far")
            print(json.dumps({"saved_prompts": done, "generated_tokens": rows, "self_written_prompts": n_self}), flush=True)
            return None
        train_data = greedy_with_features(target.model, prompt_ids, layer_ids, args.gen_tokens, args.gen_batch, eos)
        gen_tokens = int((train_data[3] - train_data[2]).sum())
        log(f"data: {gen_tokens} generated tokens ({gen_tokens / len(prompt_ids):.0f} per prompt); "
            f"sample: {tok.decode(train_data[0][0, int(train_data[2][0]) : int(train_data[3][0])].tolist())[:200]!r}")
    return train_data, n_prompts, n_self, gen_tokens, train_gen
